"""edgetrain: joint GPU-frequency and batch-size selection for power-capped edge training."""

import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())  # a library logs nothing until the program configures logging
