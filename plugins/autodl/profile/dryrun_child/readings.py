"""Allocator readings: Paddle's host allocator peak and current bytes, and the largest peak the script reached.

Importing it imports Paddle (timed into the report) and sets the device to the CPU.
"""

import os
import time

from .batch import beyond_epoch_bytes
from .report import save
from .state import READINGS_PAUSED, R, St

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
t_import = time.monotonic()
import paddle  # noqa: E402
from paddle.base import core  # noqa: E402

R["seconds"]["import_paddle"] = round(time.monotonic() - t_import, 3)
R["paddle_version"] = paddle.__version__
paddle.set_device("cpu")


def peak():
    """The host allocator's peak of allocated bytes since its last reset."""
    return int(core.host_memory_stat_peak_value("Allocated", 0))


def current():
    """The host allocator's allocated bytes now."""
    return int(core.host_memory_stat_current_value("Allocated", 0))


def note_reading():
    """Keep the largest allocator peak the script reached while it ran (bytes) and the batch it ran at: the
    profile's figure is never below it, whatever stops the dry run later (a timeout, an error)."""
    if R["status"] != "running" or READINGS_PAUSED[0]:
        return
    w = St.window
    # the batches the dry run's own head had the loader hold past what the script's epoch has are autodl's
    v = peak() - beyond_epoch_bytes(w)
    if v > (R["max_reading"] or 0):
        R["max_reading"] = v
        R["max_reading_batch"] = (w or {}).get("batch")


def reset_peak():
    """Keep the reading so far (:func:`note_reading`), then reset the allocator's peak."""
    note_reading()
    core.host_memory_stat_reset_peak_value("Allocated", 0)


READING_PERIOD_S = 0.5
"""How often the watcher keeps the allocator's peak (s): a dry run killed on its timeout keeps what it reached."""


def watch():
    """The watcher thread: keep the allocator's peak every :data:`READING_PERIOD_S`, save when it grew."""
    last = None
    while True:
        time.sleep(READING_PERIOD_S)
        try:
            note_reading()
            if R["max_reading"] != last:
                last = R["max_reading"]
                save()
        except Exception:  # noqa: BLE001 - a reading missed is taken at the next tick or the next reset
            pass
