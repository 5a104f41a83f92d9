"""A run's record says whom it shared its device with and its memory cap, from its lease (issue 24, rule 5)."""

from __future__ import annotations

from autodl.policy.packing import CAP_NOT_VERIFIED
from autodl.records import RecordStore, with_sharing
from autodl.types import Lease, RunRecord

GIB = 1 << 30


def record(**kw) -> RunRecord:
    return RunRecord(run_key=kw.pop("run_key", "r1"), script="/x.py", outcome="succeeded", declared_pool=False,
                     metrics={"step_time_s": 0.25}, **kw)


def shared_lease(**kw) -> Lease:
    return Lease(lease_id="L1", run_key="r1", device_ids=["GPU-0"], sharing="shared", reserved_bytes=30 * GIB,
                 co_tenants=["r2"], **kw)


def test_a_shared_runs_record_carries_its_neighbours_its_cap_and_that_the_cap_is_unverified():
    out = with_sharing(record(), shared_lease())
    assert out.sharing == "shared" and out.co_tenants == ["r2"] and out.device_memory_cap_bytes == 30 * GIB
    assert out.notes == [f"packed: shared its device with r2; device memory capped at 30720 MiB; {CAP_NOT_VERIFIED}"]
    assert out.metrics == {"step_time_s": 0.25}, "the step time is kept beside it"


def test_an_exclusive_runs_record_says_exclusive_with_no_cap_and_no_note():
    out = with_sharing(record(), Lease(lease_id="L1", run_key="r1", device_ids=["GPU-0"]))
    assert (out.sharing, out.co_tenants, out.device_memory_cap_bytes, out.notes) == ("exclusive", [], None, [])


def test_no_lease_leaves_the_record_and_a_second_call_adds_the_note_once():
    alone = record()
    assert with_sharing(alone, None) is alone
    twice = with_sharing(with_sharing(record(), shared_lease()), shared_lease())
    assert len(twice.notes) == 1


def test_the_lease_as_json_from_the_booking_works_as_the_lease_itself():
    lease = shared_lease()
    assert with_sharing(record(), lease.model_dump(mode="json")).model_dump(exclude={"recorded_at"}) == \
        with_sharing(record(), lease).model_dump(exclude={"recorded_at"})


def test_the_sharing_survives_the_store(autodl_home):
    store = RecordStore()
    store.write(with_sharing(record(), shared_lease()))
    back = store.get("r1")
    assert back.sharing == "shared" and back.co_tenants == ["r2"] and back.device_memory_cap_bytes == 30 * GIB
    assert CAP_NOT_VERIFIED in back.notes[0]


def test_a_record_written_before_packing_reads_as_exclusive():
    old = {"run_key": "old", "script": "/x.py", "outcome": "succeeded", "declared_pool": False}
    back = RunRecord.model_validate(old)
    assert back.sharing == "exclusive" and back.co_tenants == [] and back.device_memory_cap_bytes is None


def test_a_second_writer_without_the_lease_keeps_what_the_first_recorded():
    """A reaper recorded the shared run first; the run's own release finds no lease any more: the sharing stays."""
    first = with_sharing(record(), shared_lease())
    second = with_sharing(record(), None, previous=first)
    assert (second.sharing, second.co_tenants, second.device_memory_cap_bytes) == ("shared", ["r2"], 30 * GIB)
    assert second.notes == first.notes
    assert with_sharing(record(), None, previous=record()).sharing == "exclusive"
