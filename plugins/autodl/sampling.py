"""The launch's sampler: samples a local training from its launch until a follower (the collect step, in a worker
or the triggerer) takes over, so a short run has samples at the configured interval from its start.

Details: docs/reference/hardware.md#autodlsampling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

MAX_BRIDGE_S = 6 * 3600.0
"""The longest the launch's sampler runs, seconds (6 h): a collect step that never comes (Airflow down) must not
leave a sampler behind for the whole of a long training; the training's end stops it sooner."""


class LaunchSampler:
    """The launch's sampler process, started *before* the training (its imports then cost no samples) and handed
    the training's handle once it started (:meth:`hand`), through its stdin; :meth:`cancel` when there is none
    (the launch failed, or it reattached to a training already followed).

    :param interval_s: seconds between samples (the collect step's ``sample_interval_s``).
    """

    def __init__(self, folder: str | Path, interval_s: float):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autodl.sampling", str(folder), repr(float(interval_s))], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)

    def hand(self, handle_json: str) -> int:
        """Give it the training's handle (JSON); :returns: its pid."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(handle_json.encode())
            self.proc.stdin.close()
        except BrokenPipeError:  # it is gone already: nothing to sample with
            pass
        return self.proc.pid

    def cancel(self) -> None:
        """No training to sample: it exits on an empty stdin."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.proc.wait()


def run(folder: Path, interval_s: float, handle_json: str) -> int:
    """Sample until a follower takes over (:data:`autodl.metrics.TAKEN_OVER_FILE`), the training ends or
    :data:`MAX_BRIDGE_S` passed; :returns: samples written.

    :param handle_json: the training's :class:`~autodl.types.LaunchHandle`; empty: nothing to sample.
    """
    from autodl.launch.local import LocalLauncher
    from autodl.metrics import TAKEN_OVER_FILE, locked_samples, make_sampler
    from autodl.types import LaunchHandle

    if not handle_json.strip():
        return 0
    handle = LaunchHandle.model_validate_json(handle_json)
    launcher = LocalLauncher()
    sampler = make_sampler(handle, [d for d in handle.device_ids if d.startswith(("GPU-", "MIG-"))], folder=folder)
    if sampler is None:
        return 0
    written, begun = 0, time.monotonic()
    try:
        while time.monotonic() - begun < MAX_BRIDGE_S and not (folder / TAKEN_OVER_FILE).exists():
            tick = time.monotonic()
            if launcher.poll(handle) is not None:
                break
            sample = sampler.sample()
            with locked_samples(folder) as fd:
                if (folder / TAKEN_OVER_FILE).exists():
                    break
                if sample is not None:
                    sample["t"] = time.time()
                    os.write(fd, (json.dumps(sample) + "\n").encode())
                    written += 1
            time.sleep(max(0.0, interval_s - (time.monotonic() - tick)))
    finally:
        sampler.close()
    return written


def main(argv: list[str]) -> int:
    """``python -m autodl.sampling FOLDER INTERVAL_S``: import first, then wait for the handle on stdin."""
    import autodl.launch.local  # noqa: F401 - before the training starts, so the first sample is not late
    import autodl.metrics  # noqa: F401

    run(Path(argv[0]), float(argv[1]), sys.stdin.read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
