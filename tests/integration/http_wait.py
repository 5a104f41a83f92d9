"""Helpers the Prometheus tests share: read a JSON answer from a server on 127.0.0.1, and wait for a condition."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest


def get_json(url: str) -> dict:
    """The JSON object ``url`` answers (a server on 127.0.0.1; 10 s socket timeout)."""
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - 127.0.0.1 only
        return json.loads(resp.read().decode())


def wait_for(condition, what: str, limit_s: float = 90.0):
    """``condition()``'s first true value, polled every 0.5 s; the test fails naming ``what`` after ``limit_s``
    (a server that never came up, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    last = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - not there yet
            last = exc
        time.sleep(0.5)
    pytest.fail(f"{what} did not happen within {limit_s:.0f} s (last error: {last})")


def stop_server(proc) -> None:
    """Stop a server process the test started: SIGTERM, then SIGKILL after 30 s."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
