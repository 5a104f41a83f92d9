"""The admission queue's pure decision (shared by the product and the simulator)."""

from autodl.policy.admission import QueuedRun, admit


def _first_n(run, free):
    ids = sorted(free)
    return ids[: run.num_gpus] if len(ids) >= run.num_gpus else None


def test_first_come_first_served_and_backfill():
    waiting = [QueuedRun("late", 1, 1, enqueued_at=20.0), QueuedRun("gang", 4, 1, enqueued_at=10.0),
               QueuedRun("early", 1, 1, enqueued_at=5.0)]
    grants = admit(waiting, frozenset({"a", "b", "c"}), [], now=30.0, place_on=_first_n)
    # "early" first; the 4-GPU gang cannot start on the two devices left; "late" backfills
    assert [(g.run_key, g.devices) for g in grants] == [("early", ("a",)), ("late", ("b",))]


def test_grants_never_share_devices():
    waiting = [QueuedRun(f"r{i}", 2, 1, enqueued_at=float(i)) for i in range(5)]
    grants = admit(waiting, frozenset(range(7)), [], now=9.0, place_on=_first_n)
    used = [d for g in grants for d in g.devices]
    assert len(grants) == 3 and len(used) == len(set(used)) == 6
