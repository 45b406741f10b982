"""Device backends behind one protocol (base.py): Jetson sysfs, NVML and simulated twins."""
