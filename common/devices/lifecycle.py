"""Put a device's original settings back when its process ends: on exit, SIGTERM or SIGINT."""

from __future__ import annotations

import atexit
import os
import signal
from collections.abc import Callable
from types import FrameType

from .base import Device

Handler = Callable[[int, FrameType | None], object] | int | None


def restore_on_signals(device: Device, signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Call device.restore() at interpreter exit and on each of `signals`, then hand the
    signal to the handler that was installed before (default: the signal's usual effect).

    Must be called from the main thread (a Python rule for signal handlers).
    """
    atexit.register(device.restore)
    for signum in signals:
        signal.signal(signum, _restoring_handler(device, signal.getsignal(signum)))


def _restoring_handler(device: Device, previous: Handler) -> Callable[[int, FrameType | None], None]:
    def handle(signum: int, frame: FrameType | None) -> None:
        try:
            device.restore()
        finally:
            _chain(previous, signum, frame)

    return handle


def _chain(previous: Handler, signum: int, frame: FrameType | None) -> None:
    if callable(previous):
        previous(signum, frame)
    elif previous in (signal.SIG_DFL, None):  # None: set outside Python; take the default
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
