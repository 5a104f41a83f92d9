"""The admission queue's pure decision (the product's; the simulator extends it): order, aging, reservation, the wait for a faster device."""

from __future__ import annotations

from autodl.policy.admission import (
    AGING_S,
    QueuedRun,
    RunningRun,
    admit,
    decide,
    queue_key,
    queue_order,
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


# ------------------------------------------------------------------ wait for a faster device (off unless asked)
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
