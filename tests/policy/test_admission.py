"""The admission queue's pure decision (shared by the product and the simulator): order, aging, reservation, quotas, comparative advantage."""

from __future__ import annotations

import random

import pytest

from autodl.policy.admission import (
    AGING_S, QueuedRun, RunningRun, admit, decide, queue_key, queue_order,
)


def _first_n(run, free):
    ids = sorted(free)
    return ids[: run.num_gpus] if len(ids) >= run.num_gpus else None


def test_first_come_first_served_and_backfill():
    """Runs without an expected runtime rank as equals: the earlier goes first; the gang that can never
    fit on three devices reserves nothing and blocks nobody."""
    waiting = [QueuedRun("late", 1, 1, enqueued_at=20.0), QueuedRun("gang", 4, 1, enqueued_at=10.0),
               QueuedRun("early", 1, 1, enqueued_at=5.0)]
    grants = admit(waiting, frozenset({"a", "b", "c"}), [], now=30.0, place_on=_first_n)
    assert [(g.run_key, g.devices) for g in grants] == [("early", ("a",)), ("late", ("b",))]


def test_grants_never_share_devices():
    waiting = [QueuedRun(f"r{i}", 2, 1, enqueued_at=float(i)) for i in range(5)]
    grants = admit(waiting, frozenset(range(7)), [], now=9.0, place_on=_first_n)
    used = [d for g in grants for d in g.devices]
    assert len(grants) == 3 and len(used) == len(set(used)) == 6


def test_shortest_expected_run_goes_first():
    """One free device, three runs: the shortest expected GPU-time gets it, whatever the arrival order."""
    waiting = [QueuedRun("long", 1, 1, 0.0, expected_runtime_s=36_000), QueuedRun("short", 1, 1, 10.0, expected_runtime_s=600),
               QueuedRun("mid", 1, 1, 5.0, expected_runtime_s=3_600)]
    assert [g.run_key for g in admit(waiting, frozenset({"d"}), [], 20.0, _first_n)] == ["short"]
    assert [r.run_key for r in queue_order(waiting, 20.0)] == ["short", "mid", "long"]
    # first come, first served when asked
    assert [g.run_key for g in admit(waiting, frozenset({"d"}), [], 20.0, _first_n, order="fcfs")] == ["long"]


def test_gpu_time_not_wall_time_orders_gangs():
    """A 1-hour gang of 8 (8 GPU-hours) ranks after a 2-hour single run (2 GPU-hours)."""
    gang = QueuedRun("gang", 8, 1, 0.0, expected_runtime_s=3_600)
    single = QueuedRun("single", 1, 1, 0.0, expected_runtime_s=7_200)
    assert [r.run_key for r in queue_order([gang, single], 0.0)] == ["single", "gang"]


def test_aging_lets_a_long_run_overtake_newer_short_ones():
    """A run e^k times longer than a newcomer ranks ahead of it after waiting k x AGING_S seconds: nothing
    waits forever behind a stream of short runs."""
    old = QueuedRun("old", 1, 1, enqueued_at=0.0, expected_runtime_s=1000 * 600.0)   # ln(1000) = 6.9
    for waited, first in ((6.0 * AGING_S, "new"), (7.5 * AGING_S, "old")):
        new = QueuedRun("new", 1, 1, enqueued_at=waited, expected_runtime_s=600.0)
        assert queue_order([old, new], waited)[0].run_key == first
    # without aging the short newcomer would always win
    inf = float("inf")
    assert queue_key(old, aging_s=inf) > queue_key(QueuedRun("new", 1, 1, 1e9, expected_runtime_s=600.0), aging_s=inf)


def test_unknown_runtime_ranks_as_a_median_job_and_never_backfills_into_a_reservation():
    """No expected runtime: ordered as UNKNOWN_RUNTIME_S; behind a reservation it may only use devices
    outside it (its runtime could be long)."""
    unknown = QueuedRun("unknown", 1, 1, 0.0)
    long = QueuedRun("long", 1, 1, 0.0, expected_runtime_s=50_000.0)
    short = QueuedRun("short", 1, 1, 0.0, expected_runtime_s=100.0)
    assert [r.run_key for r in queue_order([long, unknown, short], 0.0)] == ["short", "unknown", "long"]
    # two devices busy until t=1000, one free; the gang of 3 reserves all three; the unknown run waits,
    # a run that ends before t=1000 backfills
    running = [RunningRun("r", ("a", "b"), expected_end=1000.0)]
    gang = QueuedRun("gang", 3, 1, 0.0, expected_runtime_s=10.0)   # shortest GPU-time: it is the head
    adm = decide([gang, unknown], frozenset({"c"}), running, 0.0, _first_n)
    assert adm.reservation.run_key == "gang" and adm.reservation.devices == frozenset({"a", "b", "c"})
    assert adm.reservation.start_by == 1000.0
    assert adm.grants == () and "reserved" in adm.waiting_reasons["unknown"]
    adm = decide([gang, unknown, QueuedRun("quick", 1, 1, 1.0, expected_runtime_s=500.0)], frozenset({"c"}),
                 running, 0.0, _first_n)
    assert [g.run_key for g in adm.grants] == ["quick"] and adm.grants[0].backfilled


def test_reservation_holds_devices_for_the_blocked_gang():
    """A gang of 4 waits for 3 busy devices; a long single run may not take the one free device it
    needs (it would delay the gang), a short one may, and a device outside the reservation is free for
    all: a run that ends before the reserved start fills the reserved device first, leaving the other."""
    running = [RunningRun("r1", ("a",), expected_end=100.0), RunningRun("r2", ("b",), expected_end=200.0),
               RunningRun("r3", ("c",), expected_end=300.0)]
    gang = QueuedRun("gang", 4, 1, 0.0, expected_runtime_s=10.0)
    long = QueuedRun("long", 1, 1, 1.0, expected_runtime_s=5_000.0)

    def place_abcd(run, free):          # only a, b, c, d form a host the gang can use
        ids = sorted(d for d in free if d in "abcd") if run.num_gpus > 1 else sorted(free)
        return ids[: run.num_gpus] if len(ids) >= run.num_gpus else None

    adm = decide([gang, long], frozenset({"d"}), running, 0.0, place_abcd)
    assert adm.grants == () and adm.reservation.start_by == 300.0
    short = QueuedRun("short", 1, 1, 2.0, expected_runtime_s=250.0)
    adm = decide([gang, long, short], frozenset({"d"}), running, 0.0, place_abcd)
    assert [g.run_key for g in adm.grants] == ["short"]
    adm = decide([gang, long, short], frozenset({"d", "e"}), running, 0.0, place_abcd)
    assert {g.run_key: g.devices for g in adm.grants} == {"long": ("e",), "short": ("d",)}
    # greedy backfill (no reservation) lets the long run take d: the gang's start slips by hours
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


# ------------------------------------------------------------------ wait for a faster device (off by default)
def _fastest_first(speed):
    """Placement that takes the fastest free devices of one type (device ids 'type:host:slot')."""
    def place(run, free):
        by_type = {}
        for d in free:
            by_type.setdefault(d.split(":")[0], []).append(d)
        for t in sorted(by_type, key=lambda t: -speed[t]):
            if len(by_type[t]) >= run.num_gpus:
                return sorted(by_type[t])[: run.num_gpus]
        return None
    return place


SPEED = {"a100": 2.0, "t4": 0.5}
WAIT_KW = dict(device_type=lambda d: d.split(":")[0], host_of=lambda d: d.rsplit(":", 1)[0])


def _run(key, n, rt, t=0.0):
    return QueuedRun(key, n, 1, t, expected_runtime_s=rt, speed_by_type=SPEED)


def test_long_run_waits_for_a_faster_device_that_frees_soon():
    """A 10-hour run (V100 units) offered a T4 (20 h there) while an A100 frees in 1 h (then 5 h): it
    waits, and says for what; a 10-minute run behind it takes the T4 (40 min there beats 1 h + 5 min).
    Without wait_margin the long run takes the T4."""
    running = [RunningRun("busy", ("a100:h1:0",), expected_end=3_600.0)]
    free = frozenset({"t4:h2:0"})
    waiting = [_run("long", 1, 36_000.0), _run("short", 1, 600.0, t=1.0)]
    # the short run ranks first by SJF: keep it out to see the long run's own choice
    adm = decide([waiting[0]], free, running, 0.0, _fastest_first(SPEED), wait_margin=0.25, **WAIT_KW)
    assert adm.grants == ()
    assert "waits for a100" in adm.waiting_reasons["long"] and "t=3600" in adm.waiting_reasons["long"]
    adm = decide(waiting, free, running, 0.0, _fastest_first(SPEED), wait_margin=0.25, **WAIT_KW)
    assert [(g.run_key, g.devices) for g in adm.grants] == [("short", ("t4:h2:0",))]
    # off (the default): the long run takes the slow device
    adm = decide([waiting[0]], free, running, 0.0, _fastest_first(SPEED), **WAIT_KW)
    assert [g.run_key for g in adm.grants] == ["long"]


def test_no_wait_when_the_faster_device_frees_too_late_or_its_end_is_unknown():
    """Waiting 20 h for the A100 (then 5 h) is worse than 20 h on the T4 now; a holder past its expected
    end, or with none, is never waited for (it may hold on indefinitely)."""
    free = frozenset({"t4:h2:0"})
    run = _run("long", 1, 36_000.0)
    place = _fastest_first(SPEED)
    for running, now in (([RunningRun("busy", ("a100:h1:0",), expected_end=72_000.0)], 0.0),
                         ([RunningRun("busy", ("a100:h1:0",), expected_end=None)], 0.0),
                         ([RunningRun("busy", ("a100:h1:0",), expected_end=100.0)], 200.0)):
        adm = decide([run], free, running, now, place, wait_margin=0.25, **WAIT_KW)
        assert [g.run_key for g in adm.grants] == ["long"], running
    # the margin: 1 h + 5 h = 6 h against 20 h passes 0.25; against 7 h on a faster 'slow' type it does not
    speed = {"a100": 2.0, "v100": 36_000.0 / 25_200.0}
    slow = QueuedRun("long", 1, 1, 0.0, expected_runtime_s=36_000.0, speed_by_type=speed)
    adm = decide([slow], frozenset({"v100:h2:0"}), [RunningRun("busy", ("a100:h1:0",), expected_end=3_600.0)], 0.0,
                 _fastest_first(speed), wait_margin=0.25, **WAIT_KW)
    assert [g.run_key for g in adm.grants] == ["long"]      # 6 h is not 25% below 7 h
    adm = decide([slow], frozenset({"v100:h2:0"}), [RunningRun("busy", ("a100:h1:0",), expected_end=3_600.0)], 0.0,
                 _fastest_first(speed), wait_margin=0.1, **WAIT_KW)
    assert adm.grants == ()                                   # but it is 10% below


def test_two_runs_do_not_count_on_the_same_faster_device():
    """One A100 frees in 1 h and the first long run in order counts on it; the next two find no other
    A100 expected free and take the T4s, instead of all three waiting for one device."""
    running = [RunningRun("busy", ("a100:h1:0",), expected_end=3_600.0)]
    free = frozenset({"t4:h2:0", "t4:h2:1"})
    runs = [_run(f"long{i}", 1, 36_000.0 + i) for i in range(3)]
    adm = decide(runs, free, running, 0.0, _fastest_first(SPEED), wait_margin=0.25, **WAIT_KW)
    assert [g.run_key for g in adm.grants] == ["long1", "long2"]
    assert "waits for a100" in adm.waiting_reasons["long0"]


def test_a_gang_counts_only_devices_on_one_host():
    """A gang of 4 offered four T4s of one host: four A100s free in 1 h, but two on each of two 4-device
    hosts whose other two devices are held with no known end. Counted per host they never hold the
    gang, so it takes the T4s; counted together (no host_of) it would wait."""
    running = [RunningRun("b1", ("a100:h1:0", "a100:h1:1"), expected_end=3_600.0),
               RunningRun("b2", ("a100:h3:0", "a100:h3:1"), expected_end=3_600.0),
               RunningRun("forever", ("a100:h1:2", "a100:h1:3", "a100:h3:2", "a100:h3:3"), expected_end=None)]
    free = frozenset(f"t4:h2:{i}" for i in range(4))
    gang = _run("gang", 4, 36_000.0)
    adm = decide([gang], free, running, 0.0, _fastest_first(SPEED), wait_margin=0.25, **WAIT_KW)
    assert [g.run_key for g in adm.grants] == ["gang"]
    adm = decide([gang], free, running, 0.0, _fastest_first(SPEED), wait_margin=0.25, device_type=WAIT_KW["device_type"])
    assert adm.grants == () and "waits for a100" in adm.waiting_reasons["gang"]
    # four on one host: it waits, host-aware too; a gang of 8 counts two whole hosts
    running = [RunningRun("b1", tuple(f"a100:h1:{i}" for i in range(4)), expected_end=3_600.0),
               RunningRun("b3", tuple(f"a100:h3:{i}" for i in range(4)), expected_end=7_200.0)]
    adm = decide([gang], free, running, 0.0, _fastest_first(SPEED), wait_margin=0.25, **WAIT_KW)
    assert adm.grants == () and "t=3600" in adm.waiting_reasons["gang"]
    free8 = frozenset(f"t4:h2:{i}" for i in range(4)) | frozenset(f"t4:h4:{i}" for i in range(4))
    adm = decide([_run("gang8", 8, 36_000.0)], free8, running, 0.0, _fastest_first(SPEED), wait_margin=0.25, **WAIT_KW)
    assert adm.grants == () and "t=7200" in adm.waiting_reasons["gang8"]


# ------------------------------------------------------------------ big gangs first after a while (off by default)
def test_a_gang_waiting_past_gang_first_s_goes_first_and_reserves():
    """An 8-device gang (160 GPU-hours) that has waited past gang_first_s goes ahead of a short run and, not
    fitting, becomes the head with the reservation; the short run may only backfill off it. A single
    run as old is not moved; without gang_first_s the order is shortest first."""
    from autodl.policy.admission import GANG_FIRST_MIN_GPUS, GANG_FIRST_S

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
