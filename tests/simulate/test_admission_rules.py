"""The simulator's queue rules on the product's admission decision (autodl_sim.admission): first come first
served, greedy and no backfill, owner quotas, comparative advantage, big gangs first, the reservation's fast path."""

from __future__ import annotations

import random

import pytest

from autodl.policy.admission import QueuedRun, RunningRun
from autodl_sim.admission import admit, decide

pytestmark = pytest.mark.simulator


def _first_n(run, free):
    ids = sorted(free)
    return ids[: run.num_gpus] if len(ids) >= run.num_gpus else None


def test_first_come_first_served_when_asked():
    """One free device, three runs: under fcfs the earliest gets it, whatever its expected runtime."""
    waiting = [QueuedRun("long", 1, 1, 0.0, expected_runtime_s=36_000), QueuedRun("short", 1, 1, 10.0, expected_runtime_s=600),
               QueuedRun("mid", 1, 1, 5.0, expected_runtime_s=3_600)]
    assert [g.run_key for g in admit(waiting, frozenset({"d"}), [], 20.0, _first_n, order="fcfs")] == ["long"]
    assert [g.run_key for g in admit(waiting, frozenset({"d"}), [], 20.0, _first_n)] == ["short"]


def test_greedy_backfill_lets_a_long_run_delay_the_blocked_gang():
    """No reservation: the long run takes the one free device the gang of 4 needs; the gang's start slips."""
    running = [RunningRun("r1", ("a",), expected_end=100.0), RunningRun("r2", ("b",), expected_end=200.0),
               RunningRun("r3", ("c",), expected_end=300.0)]
    gang = QueuedRun("gang", 4, 1, 0.0, expected_runtime_s=10.0)
    long = QueuedRun("long", 1, 1, 1.0, expected_runtime_s=5_000.0)

    def place_abcd(run, free):          # only a, b, c, d form a host the gang can use
        ids = sorted(d for d in free if d in "abcd") if run.num_gpus > 1 else sorted(free)
        return ids[: run.num_gpus] if len(ids) >= run.num_gpus else None

    assert admit([gang, long], frozenset({"d"}), running, 0.0, place_abcd) == []
    assert [g.run_key for g in admit([gang, long], frozenset({"d"}), running, 0.0, place_abcd, backfill="greedy")] == ["long"]


def test_no_backfill_blocks_behind_the_head():
    waiting = [QueuedRun("gang", 2, 1, 0.0), QueuedRun("small", 1, 1, 1.0)]
    assert admit(waiting, frozenset({"a"}), [], 2.0, _first_n, order="fcfs", backfill="none") == []
    assert [g.run_key for g in admit(waiting, frozenset({"a"}), [], 2.0, _first_n, order="fcfs", backfill="greedy")] == ["small"]


def test_quota_skips_a_run_without_blocking_others():
    """Owner 'ann' holds 3 of her 4 devices: her gang of 2 waits (reason given), bob's run starts."""
    running = [RunningRun("x", ("a", "b", "c"), owner="ann")]
    waiting = [QueuedRun("ann2", 2, 1, 0.0, owner="ann"), QueuedRun("bob1", 1, 1, 5.0, owner="bob"),
               QueuedRun("ann1", 1, 1, 6.0, owner="ann")]
    adm = decide(waiting, frozenset({"d", "e", "f"}), running, 10.0, _first_n, quotas={"ann": 4})
    assert [g.run_key for g in adm.grants] == ["bob1", "ann1"]
    assert "quota" in adm.waiting_reasons["ann2"]
    # a default quota for every owner
    adm = decide(waiting, frozenset({"d", "e", "f"}), running, 10.0, _first_n, quotas={"*": 3})
    assert [g.run_key for g in adm.grants] == ["bob1"]


def _typed(types):
    """place_on choosing the fastest free type for the run (by its speed_by_type), device ids 'type:n'."""
    def place_on(run, free):
        best = None
        for d in sorted(free):
            t = d.split(":")[0]
            s = (run.speed_by_type or {}).get(t)
            if s is None:
                continue
            if best is None or s > best[0]:
                best = (s, d)
        return (best[1],) if best else None
    return place_on


def test_comparative_advantage_gives_the_freed_device_to_the_run_that_gains_most():
    """One fast device frees: of the next runs that can take it, the long one gets it (it saves hours),
    not the short one ahead of it; a run that fits only on the fast type gains most of all."""
    speeds = {"fast": 2.0, "slow": 0.5}
    short = QueuedRun("short", 1, 1, 0.0, expected_runtime_s=600.0, speed_by_type=speeds)
    long = QueuedRun("long", 1, 1, 0.0, expected_runtime_s=3_000.0, speed_by_type=speeds)
    counts = {"fast": 4, "slow": 4}
    kw = dict(device_type=lambda d: d.split(":")[0], type_counts=counts, window=4)
    adm = decide([short, long], frozenset({"fast:0"}), [], 0.0, _typed(speeds), **kw)
    assert [g.run_key for g in adm.grants] == ["long"] and "comparative advantage" in adm.grants[0].reason
    # both free: the long run takes the fast device, the short one the slow device
    adm = decide([short, long], frozenset({"fast:0", "slow:0"}), [], 0.0, _typed(speeds), **kw)
    assert {g.run_key: g.devices for g in adm.grants} == {"long": ("fast:0",), "short": ("slow:0",)}
    # a big-memory run that fits only on 'fast' beats a longer run that could use either
    big = QueuedRun("big", 1, 1, 0.0, expected_runtime_s=2_000.0, speed_by_type={"fast": 2.0})
    adm = decide([short, big, long], frozenset({"fast:0"}), [], 0.0, _typed(speeds), **kw)
    assert [g.run_key for g in adm.grants] == ["big"]
    # window 1 or no device types: the order alone decides
    assert [g.run_key for g in admit([short, long], frozenset({"fast:0"}), [], 0.0, _typed(speeds), **{**kw, "window": 1})] == ["short"]
    assert [g.run_key for g in admit([short, long], frozenset({"fast:0"}), [], 0.0, _typed(speeds))] == ["short"]


def test_unknown_options_are_refused():
    with pytest.raises(ValueError, match="backfill"):
        admit([], frozenset(), [], 0.0, _first_n, backfill="sometimes")
    with pytest.raises(ValueError, match="order"):
        admit([], frozenset(), [], 0.0, _first_n, order="lifo")


@pytest.mark.parametrize("seed", range(5))
def test_random_decisions_are_consistent(seed):
    """Random queues, hosts and holders: grants use only free devices, never overlap, respect quotas and
    the gang size; the fast path of the reservation search gives the generic search's answer."""
    rng = random.Random(seed)
    hosts = {f"h{h}": [f"h{h}:{i}" for i in range(4)] for h in range(6)}
    every = [d for ds in hosts.values() for d in ds]

    def place_on(run, free):
        best = None
        for h, ds in hosts.items():
            f = [d for d in ds if d in free]
            if len(f) >= run.num_gpus and (best is None or len(f) < len(best)):
                best = f
        return tuple(best[: run.num_gpus]) if best else None

    def earliest(run, free, timeline):
        for k in range(len(timeline) + 1):
            pool = set(free).union(*(devs for _, devs in timeline[:k])) if k else set(free)
            hit = place_on(run, frozenset(pool))
            if hit:
                return hit, k
        return None

    for _ in range(30):
        busy = rng.sample(every, rng.randrange(0, len(every)))
        running, i = [], 0
        while i < len(busy):
            k = rng.choice([1, 1, 2, 4])
            running.append(RunningRun(f"run{i}", tuple(busy[i:i + k]), expected_end=rng.choice([None, rng.uniform(1, 500)]),
                                      owner=rng.choice(["a", "b", None])))
            i += k
        free = frozenset(every) - set(busy)
        waiting = [QueuedRun(f"w{j}", rng.choice([1, 1, 2, 3, 4]), 1, rng.uniform(0, 50), owner=rng.choice(["a", "b", None]),
                             expected_runtime_s=rng.choice([None, rng.uniform(10, 5000)])) for j in range(rng.randrange(1, 12))]
        quotas = rng.choice([None, {"a": 6}, {"*": 5}])
        for backfill in ("easy", "greedy", "none"):
            adm = decide(waiting, free, running, 0.0, place_on, backfill=backfill, quotas=quotas)
            fast = decide(waiting, free, running, 0.0, place_on, backfill=backfill, quotas=quotas, earliest=earliest)
            assert fast.grants == adm.grants and fast.reservation == adm.reservation
            used = [d for g in adm.grants for d in g.devices]
            assert len(used) == len(set(used)) and set(used) <= free
            size = {r.run_key: r for r in waiting}
            for g in adm.grants:
                assert len(g.devices) == size[g.run_key].num_gpus
            if quotas:
                held = {}
                for r in running:
                    held[r.owner] = held.get(r.owner, 0) + len(r.devices)
                for g in adm.grants:
                    o = size[g.run_key].owner
                    if o is not None:
                        held[o] = held.get(o, 0) + len(g.devices)
                        assert held[o] <= quotas.get(o, quotas.get("*", 10**9)) or held[o] - len(g.devices) < 0
            if adm.reservation is not None:
                for g in adm.grants:
                    if g.backfilled and set(g.devices) & adm.reservation.devices:
                        rt = size[g.run_key].expected_runtime_s
                        assert rt is not None and adm.reservation.start_by is not None and rt <= adm.reservation.start_by


# ------------------------------------------------------------------ big gangs first after a while (off by default)
def test_a_gang_waiting_past_gang_first_s_goes_first_and_reserves():
    """An 8-device gang (160 GPU-hours) that has waited past gang_first_s goes ahead of a short run and, not
    fitting, becomes the head with the reservation; the short run may only backfill off it. A single
    run as old is not moved; without gang_first_s the order is shortest first."""
    from autodl_sim.admission import GANG_FIRST_MIN_GPUS, GANG_FIRST_S

    assert GANG_FIRST_MIN_GPUS == 8
    now = GANG_FIRST_S + 10.0
    gang = QueuedRun("gang", 8, 1, 0.0, expected_runtime_s=20 * 3600.0)
    old_single = QueuedRun("old1", 1, 1, 0.0, expected_runtime_s=100 * 3600.0)
    short = QueuedRun("short", 1, 1, now - 5.0, expected_runtime_s=600.0)
    free = frozenset(range(4))
    running = [RunningRun("r", tuple(range(4, 8)), expected_end=now + 3600.0)]
    adm = decide([short, gang, old_single], free, running, now, _first_n, gang_first_s=GANG_FIRST_S)
    assert adm.reservation.run_key == "gang" and adm.reservation.devices == frozenset(range(8))
    assert [g.run_key for g in adm.grants] == ["short"]          # ends before the reserved start
    assert "old1" in adm.waiting_reasons and "reserved" in adm.waiting_reasons["old1"]
    # off: shortest first; the old single run takes a free device and the gang only then reserves
    adm = decide([short, gang, old_single], free, running, now, _first_n)
    assert [g.run_key for g in adm.grants] == ["short", "old1"]
    # not yet waited that long: not moved
    adm = decide([short, gang, old_single], free, running, GANG_FIRST_S - 10.0, _first_n, gang_first_s=GANG_FIRST_S)
    assert [g.run_key for g in adm.grants] == ["short", "old1"]
