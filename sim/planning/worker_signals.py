"""Dask worker preload: Ctrl-C belongs to the capsim process that runs the sweep or plan.

A terminal sends SIGINT to the whole process group, workers included; each would print its own
KeyboardInterrupt traceback. Imported in every worker process (`distributed.worker.preload`), this
module makes workers ignore SIGINT; the parent stops them when it handles the interrupt."""

from __future__ import annotations

import signal
import threading

if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def dask_setup(worker) -> None:
    """Dask's preload hook: nothing more to do (the import above did it)."""
