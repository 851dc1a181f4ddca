"""Dask worker preload: Ctrl-C belongs to the capsim process that runs the sweep or plan.

A terminal sends SIGINT to the whole process group, workers included; each would print its own
KeyboardInterrupt traceback. Imported in every worker process (`distributed.worker.preload`), this
module makes workers ignore SIGINT; the parent stops them when it handles the interrupt.

While the parent stops the cluster, a worker's heartbeat can find the scheduler already gone and log
"Failed to communicate with scheduler during heartbeat" with the connection's traceback. That record
says only that the parent closed (or lost) the scheduler, which the parent already reports, so the
worker drops it (`_drop_lost_scheduler`). A task's own failure is not a log record here: it reaches
the parent as the task's exception."""

from __future__ import annotations

import logging
import signal
import threading

if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _drop_lost_scheduler(record: logging.LogRecord) -> bool:
    """False (drop) for a worker record whose traceback is a broken connection to the scheduler."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (isinstance(exc, OSError) and "scheduler" in record.getMessage())


logging.getLogger("distributed.worker").addFilter(_drop_lost_scheduler)


def dask_setup(worker) -> None:
    """Dask's preload hook: nothing more to do (the import above did it)."""
