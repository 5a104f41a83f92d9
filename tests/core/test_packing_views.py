"""Packing where platform teams look (issue 24, a fresh user's trial): ``autodl leases`` and ``autodl runs`` say
which leases and runs shared a device and with whom, ``autodl plan`` says what a packed run would reserve, the
wait log names every fitting device's holders and why a packed run waits, and a pair-bar refusal is logged once.
Through the real CLI (``autodl.cli.main`` in this process: tests/cli_helpers.py) and the real wait step, SQLite
and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autodl.ledger import Ledger
from autodl.queue import AdmissionQueue
from tests.cli_helpers import run_cli
from tests.core.test_packing_queue import PACKED, pool_file, poll, profile_out
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the schema-per-test fixture

GB = 10**9
GiB = 1 << 30


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, monkeypatch, autodl_home):
    if request.param == "postgresql":
        monkeypatch.setenv("AUTODL_STORE_URL", request.getfixturevalue("pg_url"))
    return request.param


def test_the_leases_table_shows_each_shared_lease_with_its_reservation_and_co_tenant(store, tmp_path, capsys):
    pool = pool_file(tmp_path, 2)
    out = profile_out(tmp_path, "packed", PACKED, peak=20 * GB)
    alone = profile_out(tmp_path, "alone", None, peak=20 * GB)
    assert poll("p1", out, pool) is not None and poll("x1", alone, pool) is not None
    assert poll("p2", out, pool) is not None   # beside p1: the other device is x1's alone
    code, table, _ = run_cli(capsys, "leases")
    assert code == 0
    rows = {line.split("│")[2].strip(): line for line in table.splitlines() if line.count("│") > 3}
    reserved = Ledger().get("p2").reserved_bytes
    assert f"shared {20 * GB / GiB:.2f} GiB with p2" in rows["p1"], table
    assert f"shared {reserved / GiB:.2f} GiB with p1" in rows["p2"], table
    assert "exclusive" in rows["x1"] and "shared" not in rows["x1"], table


def test_the_runs_table_says_whom_a_packed_run_shared_with(autodl_home, capsys):
    from autodl.records import RecordStore
    from autodl.types import RunRecord

    for key, sharing, co, cap in (("a", "shared", ["b"], 569 * 2**20), ("b", "shared", ["a"], None),
                                  ("c", "exclusive", [], None)):
        RecordStore().write(RunRecord(run_key=key, script=f"/{key}.py", outcome="succeeded", declared_pool=False,
                                      sharing=sharing, co_tenants=co, device_memory_cap_bytes=cap))
    code, table, _ = run_cli(capsys, "runs")
    assert code == 0
    rows = {key: line for line in table.splitlines() for key in ("a", "b", "c") if f" {key}.py " in line}
    assert "shared 0.56 GiB with b" in rows["a"], table
    assert "shared reservation unknown with a" in rows["b"], table
    assert "exclusive" in rows["c"], table


REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "include" / "scripts" / "simple_cnn.py"   # the example the profiler finds the model of


def _plan(tmp_path, capsys, spec_text: str, pool: str, *, as_json: bool, measured: bool = False):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"task: {{script: {SCRIPT}, model_name: simple_cnn, batch_size_per_gpu: 64, "
                    "input_shape: [3, 32, 32]}\n" + spec_text)
    text = run_cli(capsys, "plan", str(spec), "--pool", pool, *([] if measured else ["--no-probe"]),
                   *(["--json"] if as_json else [])).stdout
    return json.loads(text) if as_json else text


def test_plan_says_what_a_packed_run_would_reserve_on_a_shareable_device(autodl_home, tmp_path, capsys):
    pool = pool_file(tmp_path)
    # measured by the dry run: an estimate nothing measured (--no-probe) is of unknown size and never shares
    got = _plan(tmp_path, capsys, PACKED, pool, as_json=True, measured=True)
    sharing = got["sharing"]
    assert sharing["mode"] == "packed" and sharing["device"] == "GPU-big-0" and sharing["shareable"] is True
    assert got["profile"]["params"] is not None
    assert sharing["books"] == "shared" and sharing["why_exclusive"] is None
    assert sharing["reservation_bytes"] == got["needed_bytes"]
    assert sharing["reservation_beside_bytes"] > sharing["reservation_bytes"]
    assert sharing["capacity_bytes"] == int(0.85 * 80 * GiB)   # the catalog lists an A100-80GB as 80 GiB
    table = _plan(tmp_path, capsys, PACKED, pool, as_json=False, measured=True)
    assert (f"sharing: packed; GPU-big-0 is shareable: the run would reserve {sharing['reservation_bytes'] / GiB:.2f} "
            f"GiB alone there") in table and "of 68.00 GiB" in table, table


def test_plan_says_a_packed_run_with_an_unknown_estimate_books_exclusively(autodl_home, tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("import paddle\n")   # no model the profiler can find: the estimate is unknown
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"task: {{script: {script}}}\n" + PACKED)
    out = run_cli(capsys, "plan", str(spec), "--pool", pool_file(tmp_path), "--no-probe").stdout
    line = next(x for x in out.splitlines() if x.startswith("sharing:"))
    assert line.startswith("sharing: packed, but the run's memory estimate is unknown") and "exclusively" in line


def test_plan_of_an_exclusive_spec_says_exclusive(autodl_home, tmp_path, capsys):
    pool = pool_file(tmp_path)
    assert _plan(tmp_path, capsys, "", pool, as_json=True)["sharing"] == {"mode": "exclusive", "books": "exclusive"}
    assert "sharing: exclusive" in _plan(tmp_path, capsys, "", pool, as_json=False)


def test_plan_says_why_a_packed_run_on_a_small_card_books_exclusively(autodl_home, tmp_path, capsys):
    path = tmp_path / "small.yaml"
    path.write_text("host: box\ndevices:\n  - {index: 0, model: V100-PCIE-16GB, uuid: GPU-small-0}\n")
    sharing = _plan(tmp_path, capsys, PACKED, str(path), as_json=True)["sharing"]
    assert sharing["books"] == "exclusive" and sharing["shareable"] is False
    assert "not shareable" in sharing["why_exclusive"] or "unknown" in sharing["why_exclusive"]


def test_the_wait_log_names_the_holders_of_every_fitting_device_and_that_both_hold_two_packed_runs(store, tmp_path):
    pool = pool_file(tmp_path, 2)
    out = profile_out(tmp_path, "packed", PACKED, peak=20 * GB)
    for key in ("a", "b", "c", "d"):
        assert poll(key, out, pool) is not None
    logs: list[str] = []
    assert poll("e", out, pool, logs) is None
    line = next(x for x in logs if x.startswith("waiting:"))
    by_device = {le.device_ids[0]: [] for le in Ledger().leases()}
    for le in Ledger().leases():
        by_device[le.device_ids[0]].append(le.run_key)
    assert len(by_device) == 2, by_device
    for dev, keys in by_device.items():
        assert f"{dev}: " + ", ".join(f"{k} (ann)" for k in keys) in line, line
    assert "both fitting devices hold two packed runs" in line and "no device is free now" not in line, line


def test_the_wait_log_says_there_is_no_room_beside_a_packed_run(store, tmp_path):
    pool = pool_file(tmp_path)
    big = profile_out(tmp_path, "large", PACKED, peak=40 * GB)   # 40 + 40 + a context > 0.85 x 80 GB
    assert poll("p1", big, pool) is not None
    logs: list[str] = []
    assert poll("p2", big, pool, logs) is None
    line = next(x for x in logs if x.startswith("waiting:"))
    assert "no room beside p1 on GPU-big-0" in line and "GiB" in line and " GB" not in line, line


def test_a_pair_bar_refusal_is_logged_once_per_run_not_on_every_poll(store, tmp_path):
    from autodl.records import RecordStore
    from autodl.types import RunRecord

    def record(key, step_s, sharing="exclusive", co=()):
        return RunRecord(run_key=key, script="/t.py", outcome="succeeded", declared_pool=False,
                         device_model="A100-SXM4-80GB", profile={"model_name": "slowpair"},
                         metrics={"step_time_s": step_s}, sharing=sharing, co_tenants=list(co))
    for r in (record("solo", 0.10), record("a", 0.10 / 0.6, "shared", ["b"]), record("b", 0.10 / 0.6, "shared", ["a"])):
        RecordStore().write(r)
    pool = pool_file(tmp_path)
    slow = profile_out(tmp_path, "slow", PACKED + "task: {model_name: slowpair}\n", peak=20 * GB)
    assert poll("s1", slow, pool) is not None
    logs: list[str] = []
    for _ in range(5):
        assert poll("s2", slow, pool, logs) is None
    refusals = [x for x in logs if x.startswith("sharing: not packed on GPU-big-0")]
    assert len(refusals) == 1, logs
    assert sum(x.startswith("waiting:") for x in logs) == 5
    AdmissionQueue().leave("s2")   # (while s2 waits ahead, s3 is not offered the device at all)
    other: list[str] = []
    assert poll("s3", slow, pool, other) is None
    assert sum(x.startswith("sharing: not packed on GPU-big-0") for x in other) == 1, other   # once per run
    AdmissionQueue().leave("s3")   # a new wait of the same run key says it again
    again: list[str] = []
    assert poll("s2", slow, pool, again) is None
    assert sum(x.startswith("sharing: not packed on GPU-big-0") for x in again) == 1, again


def test_the_queue_says_how_each_waiting_run_asked_to_share(store, tmp_path, capsys):
    """A fresh user: `autodl queue --json` had no sharing for a waiting run (the queue entry did not know it)."""
    pool = pool_file(tmp_path)
    packed, exclusive = profile_out(tmp_path, "packed", PACKED, peak=40 * GB), profile_out(tmp_path, "whole", None)
    assert poll("p1", packed, pool) is not None
    assert poll("x1", exclusive, pool) is None and poll("p2", packed, pool) is None
    assert {e.run_key: e.sharing for e in AdmissionQueue().entries()} == {"x1": "exclusive", "p2": "packed"}
    code, out, _ = run_cli(capsys, "queue", "--json")
    assert code == 0
    rows = {r["run_key"]: r for r in json.loads(out)}
    assert rows["x1"]["sharing"] == "exclusive" and rows["p2"]["sharing"] == "packed"
    code, table, _ = run_cli(capsys, "queue")
    assert code == 0
    assert "sharing" in table and "packed" in table
