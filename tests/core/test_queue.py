"""The admission queue in autodl's store: places kept across polls, stale waiters stop blocking, the pure
decision (policy.admission.admit) over every live entry, one grant for the run at the front."""

from __future__ import annotations

from datetime import timedelta

from autodl.queue import AdmissionQueue, candidate_groups, decide, free_devices, place_from_candidates, stale_after
from autodl.types import Device, Inventory, QueueEntry, utcnow

GiB = 1 << 30


def join(q: AdmissionQueue, key: str, now, *, groups=(("G0", "G1"),), gpus=1, poke=5.0, timeout=None):
    return q.join(key, num_gpus=gpus, needed_bytes=GiB, candidates=[list(g) for g in groups],
                  stale_after_s=stale_after(poke), owner_user="u", now=now, timeout_s=timeout)


def test_join_keeps_the_first_place_and_deadline(autodl_home):
    q = AdmissionQueue()
    t0 = utcnow()
    first = join(q, "a", t0, timeout=100)
    join(q, "b", t0 + timedelta(seconds=1))
    again = join(q, "a", t0 + timedelta(seconds=50), timeout=100)  # a later poll (or a retried task)
    assert again.enqueued_at == first.enqueued_at and again.deadline_at == t0 + timedelta(seconds=100)
    assert again.heartbeat_at == t0 + timedelta(seconds=50)
    assert [e.run_key for e in q.in_order(t0 + timedelta(seconds=51))] == ["a", "b"]
    assert q.leave("a") is True and q.leave("a") is False
    assert [e.run_key for e in q.entries()] == ["b"]


def test_a_waiter_whose_poller_vanished_stops_blocking_but_keeps_its_place(autodl_home):
    q = AdmissionQueue()
    t0 = utcnow()
    join(q, "gone", t0, poke=5)  # stale after 3 * 5 + 60 = 75 s without a poll
    mine = join(q, "mine", t0 + timedelta(seconds=10), poke=5)
    free = frozenset({"G0"})
    now = t0 + timedelta(seconds=30)
    assert decide(mine, q.entries(), free, [], now, lambda f: ["G0"] if "G0" in f else None) is None  # 'gone' is ahead
    now = t0 + timedelta(seconds=80)
    mine = q.heartbeat("mine", now=now)
    grant = decide(mine, q.entries(), free, [], now, lambda f: ["G0"] if "G0" in f else None)
    assert grant is not None and grant.devices == ("G0",)
    assert [e.run_key for e in q.in_order(now)] == ["mine", "gone"]  # stale ones listed last
    join(q, "gone", now)  # it came back: first again
    assert [e.run_key for e in q.in_order(now)] == ["gone", "mine"]
    assert q.purge(now=now + timedelta(seconds=10 * 75 + 1)) == ["gone", "mine"]


def test_the_front_run_gets_the_device_and_a_later_small_run_backfills(autodl_home):
    """First come, first served with backfill: a gang at the front that does not fit now does not stop a
    one-device run behind it; a one-device run at the front takes the only device."""
    q = AdmissionQueue()
    t0 = utcnow()
    gang = join(q, "gang", t0, groups=[("G0", "G1")], gpus=2)
    small = join(q, "small", t0 + timedelta(seconds=1), groups=[("G0", "G1")])
    now = t0 + timedelta(seconds=2)
    free = frozenset({"G1"})  # G0 is leased
    assert decide(gang, q.entries(), free, [], now, lambda f: None) is None
    grant = decide(small, q.entries(), free, [], now, lambda f: sorted(f)[:1])
    assert grant.devices == ("G1",)
    q.leave("gang")
    q.leave("small")
    first = join(q, "first", now, groups=[("G1",)])
    second = join(q, "second", now + timedelta(seconds=1), groups=[("G1",)])
    later = now + timedelta(seconds=2)
    assert decide(second, q.entries(), free, [], later, lambda f: sorted(f)[:1]) is None  # 'first' is ahead
    assert decide(first, q.entries(), free, [], later, lambda f: sorted(f)[:1]).devices == ("G1",)


def test_other_waiters_are_placed_from_their_candidate_groups():
    now = utcnow()
    entry = QueueEntry(run_key="x", num_gpus=2, needed_bytes=GiB, candidates=[["A0", "A1"], ["B0", "B1", "B2"]],
                       enqueued_at=now, heartbeat_at=now, stale_after_s=60)
    assert place_from_candidates(entry, frozenset({"A0", "B0", "B2"})) == ("B0", "B2")
    assert place_from_candidates(entry, frozenset({"A1", "A0"})) == ("A0", "A1")
    assert place_from_candidates(entry, frozenset({"A0", "B1"})) is None


def test_candidate_groups_and_free_devices():
    def dev(i, host, model, gib, healthy=True):
        return Device(device_id=f"{host}-{i}", host=host, index=i, model=model, memory_total_bytes=gib * GiB,
                      healthy=healthy)

    inv = Inventory(source="test", declared=True, devices=[
        dev(1, "h1", "V100-PCIE-32GB", 32), dev(0, "h1", "V100-PCIE-32GB", 32), dev(0, "h2", "A100-SXM4-40GB", 40),
        dev(1, "h2", "A100-SXM4-40GB", 40, healthy=False), dev(0, "h3", "GeForce-RTX-3090", 24)])
    fits = lambda d: d.memory_total_bytes >= 30 * GiB  # noqa: E731
    assert candidate_groups(inv, fits, ranked=[("h2", "A100-SXM4-40GB")]) == [["h2-0", "h2-1"], ["h1-0", "h1-1"]]
    assert free_devices(inv, frozenset({"h1-0"})) == {"h1-1", "h2-0", "h3-0"}


def test_every_waiter_sees_one_order_while_the_expected_runtimes_change(autodl_home):
    """Seen in a real Airflow: both waiters once said "#2 of 2". One way to get that: each poll refreshed its own
    run's expected runtime (the queue's sort key), so each waiter could count the other first. The runtime a run
    joined with stays while it waits."""
    q = AdmissionQueue()
    t0 = utcnow()

    def poll(key, at, runtime_s):
        q.join(key, num_gpus=1, needed_bytes=GiB, candidates=[["G0"]], stale_after_s=stale_after(5.0),
               owner_user="u", now=t0 + timedelta(seconds=at), expected_runtime_s=runtime_s)
        return [e.run_key for e in q.in_order(t0 + timedelta(seconds=at))]

    assert poll("a", 0, 100.0) == ["a"]
    assert poll("b", 1, 200.0) == ["a", "b"]
    # a run of the DAG was recorded meanwhile: a's next poll would have made it the longer job
    seen_by_a = poll("a", 2, 10_000.0)
    seen_by_b = poll("b", 3, 50.0)
    assert seen_by_a == seen_by_b == ["a", "b"]
    assert q.get("a").expected_runtime_s == 100.0
