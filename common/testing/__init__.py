"""Test doubles and builders shipped with edgetrain, for its tests and for users' own: fake Jetson
sysfs trees, a fake NVML module, recorded-profile devices, random tables, broker inspection."""
