"""The product's queue entries carry device types, speeds per type and runtime estimates (issue 24, item 1): from
the run records for a run seen before, from FLOPs / the catalog's throughput for one never seen before, unknown
(never a default) without either; and the admission decision uses them (the wait-for-a-faster-device rule)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from autodl import pipeline
from autodl.catalog import load_catalog
from autodl.ledger import Ledger
from autodl.policy.admission import RunningRun
from autodl.profile.runtime import estimate_step_time_s
from autodl.queue import AdmissionQueue, QueueRules, admission, place_from_candidates
from autodl.queue_estimate import estimate_run
from autodl.types import MemoryBreakdown, QueueEntry, ResourceProfile, utcnow

TYPES = ["A100-SXM4-80GB", "V100-SXM2-32GB", "T4", "not-in-the-catalog"]


def profile(flops: float | None = 4e12) -> ResourceProfile:
    b = MemoryBreakdown(weights_bytes=10**8, gradients_bytes=10**8, optimizer_state_bytes=2 * 10**8,
                        activations_bytes=10**9)
    return ResourceProfile(script="/x.py", params=25 * 10**6, peak_memory_bytes=b.total_bytes, breakdown=b,
                           flops_per_step=flops, batch_size=32)


def test_a_run_never_seen_before_gets_its_runtime_from_flops_and_the_catalog():
    cat = load_catalog()
    est = estimate_run(profile(), TYPES, cat, train_steps=1000)
    a100 = estimate_step_time_s(profile(), cat.get("A100-SXM4-80GB"))
    assert est.runtime_source == "flops" and est.reference_type == "A100-SXM4-80GB"
    assert est.expected_runtime_s == pytest.approx(1000 * a100)
    assert set(est.speed_by_type) == {"A100-SXM4-80GB", "V100-SXM2-32GB", "T4"}   # an unknown type: left out
    assert est.speed_by_type["A100-SXM4-80GB"] == 1.0 > est.speed_by_type["V100-SXM2-32GB"] > est.speed_by_type["T4"]


def test_a_run_seen_before_takes_the_recorded_duration_on_the_recorded_device():
    est = estimate_run(profile(), TYPES, load_catalog(), recorded=(3600.0, "Tesla V100-SXM2-32GB"), train_steps=10)
    assert est.runtime_source == "records" and est.expected_runtime_s == 3600.0
    assert est.reference_type == "V100-SXM2-32GB" and est.speed_by_type["V100-SXM2-32GB"] == 1.0
    assert est.speed_by_type["A100-SXM4-80GB"] > 1.0


def test_without_steps_or_records_the_runtime_stays_unknown():
    est = estimate_run(profile(), TYPES, load_catalog())
    assert est.expected_runtime_s is None and est.runtime_source is None and est.speed_by_type   # speeds still known
    assert estimate_run(profile(flops=None), TYPES, load_catalog()) == estimate_run(profile(None), [], load_catalog())
    assert estimate_run(profile(flops=None), TYPES, load_catalog()).expected_runtime_s is None


def test_the_wait_step_puts_the_estimate_in_the_queue_and_the_lease(tmp_path):
    pool = tmp_path / "mixed.yaml"
    pool.write_text("host: box\ndevices:\n  - {index: 0, model: A100-SXM4-80GB, uuid: GPU-a}\n"
                    "  - {index: 1, model: T4, uuid: GPU-t}\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("scheduler: {train_steps: 500}\n")
    Ledger().book("someone-else", ["GPU-a", "GPU-t"])
    out = {"profile": profile(flops=4e9).to_json(), "spec_path": str(spec), "script": "/x.py"}
    ctx = pipeline.RunContext(run_key="dag.g.r1", dag_id="dag", run_id="r1", user="ann")
    assert pipeline.step_wait(ctx, out, pool=str(pool), log=lambda _l: None) is None
    entry = AdmissionQueue().get("dag.g.r1")
    assert entry.runtime_source == "flops" and set(entry.speed_by_type) == {"A100-SXM4-80GB", "T4"}
    step_t4 = estimate_step_time_s(profile(4e9), load_catalog().get("T4"))
    Ledger().release("someone-else")
    Ledger().book("on-the-a100", ["GPU-a"])
    selection = pipeline.step_wait(ctx, out, pool=str(pool), log=lambda _l: None)
    assert selection is not None and selection.lease.device_ids == ["GPU-t"]
    assert selection.lease.expected_runtime_s == pytest.approx(500 * step_t4)   # its runtime on the T4 it got


def test_the_product_queue_waits_for_a_faster_device_when_it_ends_sooner_there():
    """A 10 h run (on an A100) offered a T4 six times slower waits for the A100 that frees in 10 minutes; given no
    device types (the queue before issue 24) it takes the T4."""
    now = utcnow()
    e = QueueEntry(run_key="long", num_gpus=1, needed_bytes=1, candidates=[["A0"], ["T0"]], enqueued_at=now,
                   heartbeat_at=now, stale_after_s=600, expected_runtime_s=36_000,
                   speed_by_type={"A100-SXM4-80GB": 1.0, "T4": 1 / 6})
    holder = RunningRun("short", ("A0",), expected_end=(now + timedelta(minutes=10)).timestamp())
    types = {"A0": "A100-SXM4-80GB", "T0": "T4"}

    def decide(rules):
        return admission([e], frozenset({"T0"}), [holder], now.timestamp(),
                         lambda run, f: place_from_candidates(e, f), rules, explain=True)

    typed = decide(QueueRules(device_type=lambda d: types[d]))
    assert typed.grants == () and "waits for A100-SXM4-80GB" in typed.waiting_reasons["long"]
    assert [g.devices for g in decide(QueueRules()).grants] == [("T0",)]
