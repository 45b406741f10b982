"""edgetrain: joint GPU-frequency and batch-size selection for power-capped edge training."""

__version__ = "0.1.0"
