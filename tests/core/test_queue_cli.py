"""``autodl queue``: each waiting run's position, team, why it waits and when it is expected to start, and holding
the queue for maintenance (``--hold`` / ``--resume``), through the real command line."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from autodl.ledger import Ledger
from autodl.queue import AdmissionQueue
from autodl.types import LeaseOwner, utcnow

DEVICES = ["GPU-cli-0", "GPU-cli-1"]


@pytest.fixture
def pool(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text("host: box\ndevices:\n" + "".join(
        f"  - {{index: {i}, model: A100-SXM4-40GB, uuid: {d}}}\n" for i, d in enumerate(DEVICES)))
    return str(path)


@pytest.fixture
def queue_with_a_holder():
    """nlp's run holds GPU-cli-0 for 600 s more; vision's gang of 2 waits for it, then a long single run."""
    Ledger().book("nlp.train.r1", [DEVICES[0]], owner=LeaseOwner(dag_id="nlp", run_id="r1", user="ann", team="nlp"),
                  expected_runtime_s=600, ttl_s=3600)
    q = AdmissionQueue()
    now = utcnow()
    q.join("vision.train.gang", num_gpus=2, needed_bytes=2**30, candidates=[DEVICES], stale_after_s=3600,
           owner_user="bo", team="vision", expected_runtime_s=100, runtime_source="flops", now=now)
    q.join("vision.train.long", num_gpus=1, needed_bytes=2**30, candidates=[DEVICES], stale_after_s=3600,
           owner_user="bo", team="vision", expected_runtime_s=10_000, runtime_source="records",
           now=now + timedelta(seconds=1))
    return now


def test_queue_says_position_why_and_expected_start(autodl, pool, queue_with_a_holder):
    rows = json.loads(autodl("queue", "--json", "--pool", pool).stdout)
    assert [(r["position"], r["run_key"], r["team"]) for r in rows] == [
        (1, "vision.train.gang", "vision"), (2, "vision.train.long", "vision")]
    gang, long = rows
    assert "head of the queue: 2 device(s) reserved for it" in gang["reason"]
    shown = datetime.fromtimestamp(round(datetime.fromisoformat(gang["expected_start"]).timestamp()), tz=timezone.utc)
    assert f"expected free at {shown:%Y-%m-%d %H:%M:%S} UTC" in gang["reason"]   # a clock time, not epoch seconds
    assert "reserved for vision.train.gang" in long["reason"] and "expected to end before" in long["reason"]
    lease_end = Ledger().get("nlp.train.r1").created_at + timedelta(seconds=600)
    gang_start = datetime.fromisoformat(gang["expected_start"])
    assert abs((gang_start - lease_end).total_seconds()) < 1e-3       # when nlp's run is expected to end
    long_start = datetime.fromisoformat(long["expected_start"])
    assert abs((long_start - gang_start).total_seconds() - 100) < 1e-3  # after the gang's 100 s

    table = autodl("queue", "--pool", pool, check=False)
    assert table.returncode == 0 and "vision.train.gang" in table.stdout and "head of the queue" in table.stdout
    assert gang_start.strftime("%Y-%m-%d %H:%M:%S") in table.stdout


def test_a_holder_with_no_runtime_leaves_the_expected_start_unknown(autodl, pool):
    Ledger().book("nlp.train.r2", DEVICES, owner=LeaseOwner(team="nlp"), ttl_s=3600)  # no expected runtime
    AdmissionQueue().join("vision.train.a", num_gpus=1, needed_bytes=2**30, candidates=[DEVICES], stale_after_s=3600,
                          team="vision", expected_runtime_s=60)
    (row,) = json.loads(autodl("queue", "--json", "--pool", pool).stdout)
    assert row["expected_start"] is None and "no runtime estimate" in row["expected_start_note"]


def test_hold_and_resume_the_queue(autodl, pool, queue_with_a_holder):
    held = autodl("queue", "--hold", "--reason", "driver upgrade until 14:00")
    assert "held the whole queue: it admits nothing until autodl queue --resume" in held.stdout
    rows = json.loads(autodl("queue", "--json", "--pool", pool).stdout)
    assert all("the whole queue is held for maintenance" in r["reason"] and "driver upgrade until 14:00" in r["reason"]
               for r in rows)
    assert all(r["expected_start"] is None for r in rows)
    assert "held for maintenance" in autodl("queue", "--pool", pool).stdout
    assert "resumed the whole queue" in autodl("queue", "--resume").stdout
    assert "was not held" in autodl("queue", "--resume").stdout
    team = autodl("queue", "--hold", "--team", "vision", "--reason", "quota review", "--json")
    assert json.loads(team.stdout)["team"] == "vision"
    assert "note:" not in autodl("queue", "--hold", "--team", "vision", "--reason", "again").stdout   # it waits
    assert "no team 'visoin' is configured" in autodl("queue", "--hold", "--team", "visoin", "--reason", "x").stdout


@pytest.mark.parametrize("args, says", [
    (["--hold"], "--hold needs --reason"),
    (["--team", "vision"], "only go with --hold or --resume"),
    (["--resume", "--reason", "x"], "--reason: only goes with --hold"),
])
def test_hold_arguments_that_do_not_go_together_are_refused(autodl, args, says):
    done = autodl("queue", *args, check=False)
    assert done.returncode != 0 and says in done.stderr and "Traceback" not in done.stderr
