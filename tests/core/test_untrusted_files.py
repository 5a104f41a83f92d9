"""Files a training leaves are read as untrusted (issue 23): a FIFO does not hang the release, a link to a host
file does not enter the record, a huge file does not grow the worker, a torn write is never seen."""

from __future__ import annotations

import json
import os
import threading

import pytest

from autodl.metrics import _rows
from autodl.steps.record import _read_json_object
from autodl.untrusted import (
    REPORT_LIMIT_BYTES,
    STEPS_LIMIT_BYTES,
    UntrustedFile,
    atomic_write_text,
    read_bytes,
    read_json_object,
)


def test_a_fifo_report_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    said: list[str] = []
    # a plain open() of a FIFO with no writer blocks for ever; the untrusted read returns at once
    worker = threading.Thread(target=lambda: said.append(str(_read_json_object(fifo, "the report", said.append))))
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "reading the FIFO blocked"
    assert said[-1] == "None" and "not a regular file" in said[0]


def test_a_report_linked_to_a_host_file_is_not_read(tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text(json.dumps({"token": "s3cret"}))
    os.chmod(secret, 0o600)
    report = tmp_path / "report.json"
    report.symlink_to(secret)
    said: list[str] = []
    assert _read_json_object(report, "the report", said.append) is None
    assert "symbolic link" in said[0] and "s3cret" not in said[0]


def test_a_sparse_report_of_a_gigabyte_is_refused_unread(tmp_path):
    report = tmp_path / "report.json"
    with open(report, "wb") as fh:
        fh.truncate(1 << 30)             # 1 GiB, sparse: costs no disk
    with pytest.raises(UntrustedFile, match="larger than"):
        read_json_object(report)
    assert len(read_bytes(report, REPORT_LIMIT_BYTES)) == REPORT_LIMIT_BYTES   # never more than the bound


def test_a_huge_steps_file_is_read_only_to_its_bound(tmp_path):
    steps = tmp_path / "steps.jsonl"
    line = json.dumps({"step": 1, "step_time_s": 0.5}) + "\n"
    with open(steps, "w") as fh:
        fh.write(line * 10)
        fh.truncate(STEPS_LIMIT_BYTES * 4)   # the rest: zeros, as a sparse 64 MiB file
    rows = _rows(steps)
    assert len(rows) == 10


def test_a_steps_fifo_is_no_rows(tmp_path):
    steps = tmp_path / "steps.jsonl"
    os.mkfifo(steps)
    assert _rows(steps) == []


def test_an_atomic_write_leaves_the_old_file_or_the_new_one(tmp_path):
    path = tmp_path / "metrics.json"
    atomic_write_text(path, json.dumps({"v": 1}))
    atomic_write_text(path, json.dumps({"v": 2}))
    assert json.loads(path.read_text()) == {"v": 2}
    assert not list(tmp_path.glob(".metrics.json.*"))   # no temporary file left


def test_a_full_disk_while_keeping_metrics_is_said_and_the_collect_goes_on(tmp_path, monkeypatch):
    import errno as _errno

    import autodl.steps.collect as collect
    from autodl.types import RunMetrics

    def full(*_a, **_k):
        raise OSError(_errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(collect, "atomic_write_text", full)
    said: list[str] = []
    assert collect.keep_metrics(tmp_path, RunMetrics(source="process", duration_s=1.0, exit_code=0), said.append) is False
    assert "No space left" in said[0] and "released all the same" in said[0]


def test_an_empty_metrics_file_left_by_a_full_disk_is_missing_not_a_crash(tmp_path):
    (tmp_path / "metrics.json").write_text("")
    said: list[str] = []
    assert _read_json_object(tmp_path / "metrics.json", "the run's metrics", said.append) is None
    assert "could not be read" in said[0]
