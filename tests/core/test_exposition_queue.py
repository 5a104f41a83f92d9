"""``autodl exporter``'s queue series: the admission wait-time histogram per team (from the admissions recorded in
the store, whichever process made them) and the held queues, as Prometheus reads them."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from autodl.admissions import Admissions
from autodl.exposition import WAIT_BUCKETS_S, registry
from autodl.queue_hold import QueueHolds


def samples() -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry()).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_admission_waits_are_a_histogram_per_team():
    a = Admissions()
    for waited in (5.0, 45.0, 45.0, 4000.0):
        a.record("vision.r", waited_s=waited, num_gpus=1, team="vision", device_model="A100-SXM4-80GB")
    a.record("nlp.r", waited_s=100_000.0, num_gpus=2, team="nlp")
    got = samples()

    def bucket(team: str, le: str) -> float:
        return got[("autodl_admission_wait_seconds_bucket", (("le", le), ("team", team)))]

    assert bucket("vision", "30.0") == 1 and bucket("vision", "60.0") == 3 and bucket("vision", "3600.0") == 3
    assert bucket("vision", "7200.0") == 4 and bucket("vision", "+Inf") == 4
    assert got[("autodl_admission_wait_seconds_count", (("team", "vision"),))] == 4
    assert got[("autodl_admission_wait_seconds_sum", (("team", "vision"),))] == 4095.0
    assert bucket("nlp", str(WAIT_BUCKETS_S[-1])) == 0 and bucket("nlp", "+Inf") == 1   # past a day: +Inf only


def test_held_queues_are_a_series_and_an_empty_store_serves_no_wait_samples():
    assert not any(name.startswith("autodl_admission_wait_seconds") for name, _ in samples())
    QueueHolds().hold(None, "PDU swap", by="ops")
    QueueHolds().hold("nlp", "quota review", by="ops")
    got = samples()
    assert got[("autodl_queue_held", (("team", "*"),))] == 1 and got[("autodl_queue_held", (("team", "nlp"),))] == 1
