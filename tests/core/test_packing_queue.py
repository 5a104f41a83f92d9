"""Packed runs through the real wait step (pipeline.step_wait) and the real store, SQLite and PostgreSQL
(docs/reference/fractional-leases.md): two small packed runs share one 80 GB device of a declared pool while a
third waits; an exclusive run never joins a shared device; an unknown estimate books exclusively; a device the
head gang's reservation holds back is not packed; the launch request carries the reservation as its memory cap."""

from __future__ import annotations

from datetime import timedelta

import pytest

from autodl import pipeline
from autodl.ledger import Ledger
from autodl.queue import AdmissionQueue, running_runs
from autodl.types import Lease, MemoryBreakdown, ResourceProfile, utcnow
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the schema-per-test fixture

GB = 10**9
PACKED = "resource_policy: {sharing: packed}\n"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, monkeypatch, autodl_home):
    if request.param == "postgresql":
        monkeypatch.setenv("AUTODL_STORE_URL", request.getfixturevalue("pg_url"))
    return request.param


def pool_file(tmp_path, n: int = 1) -> str:
    path = tmp_path / "big.yaml"
    path.write_text("host: box\ndevices:\n" + "".join(
        f"  - {{index: {i}, model: A100-SXM4-80GB, uuid: GPU-big-{i}}}\n" for i in range(n)))
    return str(path)


def profile_out(tmp_path, name: str, spec_text: str | None, *, peak: int = 10 * GB, params: int | None = 250) -> dict:
    b = MemoryBreakdown(weights_bytes=peak // 2, activations_bytes=peak - peak // 2)
    p = ResourceProfile(script=str(tmp_path / "train.py"), params=params, peak_memory_bytes=b.total_bytes, breakdown=b,
                        flops_per_step=1e9, batch_size=8)
    spec = None
    if spec_text is not None:
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(spec_text)
    return {"profile": p.to_json(), "spec_path": str(spec) if spec else None, "script": str(tmp_path / "train.py")}


def poll(key: str, out: dict, pool: str, logs: list[str] | None = None):
    ctx = pipeline.RunContext(run_key=key, dag_id="dag", run_id=key, user="ann")
    return pipeline.step_wait(ctx, out, pool=pool, log=(logs.append if logs is not None else lambda _l: None),
                              poke_interval_s=0.01)


def test_two_small_packed_runs_share_one_80gb_device_while_a_third_waits(store, tmp_path):
    pool = pool_file(tmp_path)
    out = profile_out(tmp_path, "packed", PACKED, peak=20 * GB)
    first, second = poll("p1", out, pool), poll("p2", out, pool)
    logs: list[str] = []
    assert first is not None and second is not None and poll("p3", out, pool, logs) is None
    ledger = Ledger()
    a, b = ledger.get("p1"), ledger.get("p2")
    assert a.device_ids == b.device_ids == ["GPU-big-0"] and a.sharing == b.sharing == "shared"
    assert a.reserved_bytes == 20 * GB and b.reserved_bytes > 20 * GB   # the joiner adds one more CUDA context
    assert a.co_tenants == ["p2"] and b.co_tenants == ["p1"] and ledger.get("p3") is None
    share = ledger.shares()["GPU-big-0"]
    assert share.leases == 2 and share.reserved_bytes == a.reserved_bytes + b.reserved_bytes <= share.capacity_bytes
    assert any("waiting: #1 of 1" in line for line in logs), logs
    _, request = pipeline.build_request(pipeline.RunContext(run_key="p2", dag_id="dag", run_id="p2", user="ann"),
                                        out, second)
    assert request.device_memory_cap_bytes == b.reserved_bytes
    ledger.release("p1")
    assert poll("p3", out, pool) is not None and ledger.get("p3").co_tenants == ["p2"]


def test_a_pair_type_measured_below_the_bar_is_not_packed_again(store, tmp_path):
    """Rule 5 end to end: the store's records measured this model beside itself on an A100-80GB at 0.6 of solo
    speed, so a second run of it waits for a device of its own; another model still joins."""
    from autodl.records import RecordStore
    from autodl.types import RunRecord

    def record(key, model, step_s, sharing="exclusive", co=()):
        return RunRecord(run_key=key, script="/t.py", outcome="succeeded", declared_pool=False,
                         device_model="A100-SXM4-80GB", profile={"model_name": model},
                         metrics={"step_time_s": step_s}, sharing=sharing, co_tenants=list(co))
    for r in (record("solo", "slowpair", 0.10), record("a", "slowpair", 0.10 / 0.6, "shared", ["b"]),
              record("b", "slowpair", 0.10 / 0.6, "shared", ["a"])):
        RecordStore().write(r)
    pool = pool_file(tmp_path)
    slow = profile_out(tmp_path, "slow", PACKED + "task: {model_name: slowpair}\n", peak=20 * GB)
    other = profile_out(tmp_path, "other", PACKED + "task: {model_name: quickpair}\n", peak=20 * GB)
    logs: list[str] = []
    assert poll("s1", slow, pool) is not None
    assert Ledger().get("s1").placement["run_model"] == "slowpair"
    assert poll("s2", slow, pool, logs) is None and Ledger().get("s2") is None
    assert any("not packed on GPU-big-0" in line and "below 0.8" in line for line in logs), logs
    assert poll("q1", other, pool) is None, "s2 waits ahead of q1 for that device: q1 does not overtake it"
    AdmissionQueue().leave("s2")
    assert poll("q1", other, pool) is not None and Ledger().get("q1").device_ids == ["GPU-big-0"]


def test_a_run_that_joins_a_packed_device_expects_to_run_slower_by_its_pair_speed(store, tmp_path):
    """The joiner's lease ends later than its solo runtime says: by the pair type's measured speed (0.9 of solo
    here), so the queue's reservations for the runs behind it are not set too early; the first tenant's is solo."""
    from autodl.records import RecordStore
    from autodl.types import RunRecord

    def record(key, step_s, sharing="exclusive", co=()):
        return RunRecord(run_key=key, script="/t.py", outcome="succeeded", declared_pool=False,
                         device_model="A100-SXM4-80GB", profile={"model_name": "fastpair"},
                         metrics={"step_time_s": step_s}, sharing=sharing, co_tenants=list(co))
    for r in (record("solo", 0.10), record("a", 0.10 / 0.9, "shared", ["b"]), record("b", 0.10 / 0.9, "shared", ["a"])):
        RecordStore().write(r)
    pool = pool_file(tmp_path)
    out = profile_out(tmp_path, "fast", PACKED + "task: {model_name: fastpair}\nscheduler: {train_steps: 1000}\n",
                      peak=20 * GB)
    logs: list[str] = []
    assert poll("f1", out, pool) is not None and poll("f2", out, pool, logs) is not None
    first, joiner = Ledger().get("f1"), Ledger().get("f2")
    assert joiner.device_ids == first.device_ids and first.expected_runtime_s
    assert joiner.expected_runtime_s == pytest.approx(first.expected_runtime_s / 0.9, rel=1e-6)
    assert any("0.90 of solo speed" in line and "measured in 2 shared run(s)" in line for line in logs), logs


def test_the_record_of_a_packed_run_names_its_neighbour_and_its_cap(store, tmp_path):
    """Step 6 of a packed run: the record says it shared and with whom; on this declared pool the training ran on CPU,
    so the record says no cap was set rather than a cap nobody applied (a fresh user's report)."""
    from autodl.records import RecordStore

    pool = pool_file(tmp_path)
    out = profile_out(tmp_path, "packed", PACKED, peak=20 * GB)
    first, second = poll("p1", out, pool), poll("p2", out, pool)
    reserved = Ledger().get("p2").reserved_bytes
    for key, selection in (("p1", first), ("p2", second)):
        ctx = pipeline.RunContext(run_key=key, dag_id="dag", run_id=key, user="ann")
        pipeline.step_release_and_record(ctx, script=None, spec_path=None, profile_out=out, selection=selection,
                                         handle_json=None, metrics_json=None, log=lambda _l: None)
    records = {r.run_key: r for r in RecordStore().list(limit=10)}
    assert records["p1"].sharing == records["p2"].sharing == "shared"
    assert records["p1"].co_tenants == ["p2"] and records["p2"].co_tenants == ["p1"]
    assert records["p2"].device_memory_cap_bytes is None and records["p2"].declared_pool
    assert any(f"no device memory cap was set (a real device would have capped it at {reserved // 2**20} MiB)" in n
               for n in records["p2"].notes), records["p2"].notes
    assert not any("not verified under auto_growth" in n for n in records["p2"].notes)
    assert Ledger().shares() == {}


def test_an_exclusive_run_ahead_in_the_queue_is_not_overtaken_by_packed_runs(store, tmp_path):
    """A fresh user's report: an exclusive run #1 in the queue watched packed runs behind it join the device it waits
    for, again and again. A run ahead holds its devices back from packing, so the device frees for it."""
    pool = pool_file(tmp_path)
    packed, exclusive = profile_out(tmp_path, "packed", PACKED), profile_out(tmp_path, "whole", None)
    assert poll("p1", packed, pool) is not None
    assert poll("x1", exclusive, pool) is None                      # waits, first in the queue
    assert poll("p2", packed, pool) is None and Ledger().get("p2") is None, "p2 overtook the waiting exclusive run"
    Ledger().release("p1")
    assert poll("x1", exclusive, pool) is not None and Ledger().get("x1").sharing == "exclusive"
    assert poll("p2", packed, pool) is None


def test_packed_runs_that_do_not_fit_together_do_not_share(store, tmp_path):
    pool = pool_file(tmp_path)
    out = profile_out(tmp_path, "packed", PACKED, peak=40 * GB)   # 40 + 40 + a context > 0.85 x 80 GB
    assert poll("p1", out, pool) is not None and poll("p2", out, pool) is None
    assert Ledger().shares()["GPU-big-0"].leases == 1


def test_an_exclusive_run_never_joins_a_shared_device_nor_a_packed_run_an_exclusive_one(store, tmp_path):
    pool = pool_file(tmp_path)
    packed, exclusive = profile_out(tmp_path, "packed", PACKED), profile_out(tmp_path, "whole", None)
    assert poll("p1", packed, pool) is not None
    assert poll("x1", exclusive, pool) is None and Ledger().get("x1") is None
    Ledger().release("p1")
    assert poll("x1", exclusive, pool) is not None and Ledger().get("x1").sharing == "exclusive"
    assert poll("p2", packed, pool) is None and Ledger().get("p2") is None
    assert Ledger().shares()["GPU-big-0"].exclusive


def test_a_packed_run_with_an_unknown_estimate_books_exclusively_and_says_so(store, tmp_path):
    pool = pool_file(tmp_path)
    logs: list[str] = []
    unknown = profile_out(tmp_path, "unknown", PACKED, params=None)   # a cold start that did not find the model
    assert poll("u1", unknown, pool, logs) is not None
    lease = Ledger().get("u1")
    assert lease.sharing == "exclusive" and lease.reserved_bytes is None
    assert any("estimate is unknown: it books its device exclusively" in line for line in logs), logs
    assert poll("p1", profile_out(tmp_path, "packed", PACKED), pool) is None   # nothing joins it


def test_a_device_the_head_gangs_reservation_holds_back_is_not_packed(store, tmp_path):
    """Two 80 GB devices: one holds a packed run, the other an exclusive one. A gang of 2 that has waited an hour
    heads the queue and holds both back, so a packed run does not join the shared device; without the gang it does."""
    pool = pool_file(tmp_path, 2)
    packed = profile_out(tmp_path, "packed", PACKED)
    ledger = Ledger()
    ledger.book("p1", ["GPU-big-0"], host="box", model="A100-SXM4-80GB", sharing="shared", reserved_bytes=10 * GB,
                capacity_bytes=68 * GB, expected_runtime_s=600)
    ledger.book("x1", ["GPU-big-1"], host="box", model="A100-SXM4-80GB", expected_runtime_s=600)
    AdmissionQueue().join("gang", num_gpus=2, needed_bytes=10 * GB, candidates=[["GPU-big-0", "GPU-big-1"]],
                          stale_after_s=10**6, owner_user="bob", now=utcnow() - timedelta(hours=1))
    assert poll("p2", packed, pool) is None and ledger.get("p2") is None
    AdmissionQueue().leave("gang")
    assert poll("p2", packed, pool) is not None and ledger.get("p2").device_ids == ["GPU-big-0"]


def test_two_tenants_free_their_device_together_for_the_reservation_search():
    now = utcnow()
    leases = [Lease(lease_id="a", run_key="a", device_ids=["G0"], sharing="shared", reserved_bytes=GB,
                    created_at=now, expected_runtime_s=100),
              Lease(lease_id="b", run_key="b", device_ids=["G0"], sharing="shared", reserved_bytes=GB,
                    created_at=now, expected_runtime_s=900),
              Lease(lease_id="c", run_key="c", device_ids=["G1"], created_at=now, expected_runtime_s=100)]
    runs = {r.run_key: r for r in running_runs(leases)}
    assert runs["a"].expected_end == runs["b"].expected_end == now.timestamp() + 900
    assert runs["c"].expected_end == now.timestamp() + 100
    assert (runs["a"].device_share, runs["c"].device_share) == (0.5, 1.0)
