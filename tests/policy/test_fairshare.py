"""Team queues in the admission decision: nominal quota per device type first, borrowing only idle quota, weighted
fair sharing, priorities within a team, held queues (autodl.policy.fairshare through autodl.queue.admission)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from autodl.errors import ConfigError
from autodl.policy.admission import RunningRun
from autodl.queue import QueueRules, admission, place_from_candidates
from autodl.queue_hold import QueueHold
from autodl.quota import TeamQueues, parse_team_queues
from autodl.types import QueueEntry, utcnow

GiB = 1 << 30
T0 = utcnow()
A100 = [f"A{i}" for i in range(4)]
V100 = [f"V{i}" for i in range(4)]
TYPES = {**{d: "A100-SXM4-80GB" for d in A100}, **{d: "V100-SXM2-32GB" for d in V100}}


def entry(key: str, team: str, *, at: float = 0.0, runtime: float | None = 100.0, gpus: int = 1, priority: int = 0,
          groups=(A100,)) -> QueueEntry:
    when = T0 + timedelta(seconds=at)
    return QueueEntry(run_key=key, num_gpus=gpus, needed_bytes=GiB, candidates=[list(g) for g in groups],
                      enqueued_at=when, heartbeat_at=when, stale_after_s=600, expected_runtime_s=runtime, team=team,
                      priority=priority, owner_user=team)


def rules(queues: dict | None = None, holds=()) -> QueueRules:
    parsed = parse_team_queues(queues, "test-queues.yaml") if queues is not None else TeamQueues()
    return QueueRules(queues=parsed, holds=tuple(holds), device_type=lambda d: TYPES[d])


def grants(entries, free, running=(), r: QueueRules | None = None, *, at: float = 10.0) -> dict[str, tuple]:
    by_key = {e.run_key: e for e in entries}
    out = admission(entries, frozenset(free), list(running), (T0 + timedelta(seconds=at)).timestamp(),
                    lambda run, f: place_from_candidates(by_key[run.run_key], f), r)
    return {g.run_key: g.devices for g in out.grants}


def teams_of(granted: dict, entries) -> dict[str, int]:
    team = {e.run_key: e.team for e in entries}
    out: dict[str, int] = {}
    for key, devs in granted.items():
        out[team[key]] = out.get(team[key], 0) + len(devs)
    return out


TWO_TEAMS = {"teams": {"vision": {"nominal_quota": {"A100-SXM4-80GB": 2}},
                       "nlp": {"nominal_quota": {"A100-SXM4-80GB": 2}}}}


def test_each_team_gets_its_nominal_quota_though_the_other_has_many_shorter_runs_queued_first():
    """Shortest-first alone gives all four A100s to vision's eight 10 s runs queued first; with a nominal quota
    of 2 each, nlp's long runs get two of them."""
    waiting = [entry(f"v{i}", "vision", at=i, runtime=10) for i in range(8)]
    waiting += [entry(f"n{i}", "nlp", at=20 + i, runtime=5000) for i in range(4)]
    assert teams_of(grants(waiting, A100, r=rules()), waiting) == {"vision": 4}  # no teams: the short runs win
    assert teams_of(grants(waiting, A100, r=rules(TWO_TEAMS)), waiting) == {"vision": 2, "nlp": 2}


def test_a_team_borrows_idle_quota_up_to_its_borrowing_limit():
    waiting = [entry(f"v{i}", "vision", at=i) for i in range(6)]
    assert teams_of(grants(waiting, A100, r=rules(TWO_TEAMS)), waiting) == {"vision": 4}  # nlp asks for nothing
    limited = {"teams": {**TWO_TEAMS["teams"], "vision": {"nominal_quota": {"A100-SXM4-80GB": 2},
                                                            "borrowing_limit": {"A100-SXM4-80GB": 1}}}}
    assert teams_of(grants(waiting, A100, r=rules(limited)), waiting) == {"vision": 3}


def test_borrowing_never_takes_devices_another_team_waits_for_within_its_quota():
    """vision holds 3 A100s (one borrowed while nlp asked for nothing); one A100 is free and nlp's gang of 2 waits
    within its quota: vision's short run may not borrow that one, nlp is owed it."""
    running = [RunningRun(f"v-old{i}", (f"A{i}",), team="vision") for i in range(3)]
    waiting = [entry("v-next", "vision", at=0, runtime=1), entry("n-gang", "nlp", at=5, runtime=9000, gpus=2)]
    by_key = {e.run_key: e for e in waiting}
    out = admission(waiting, frozenset({"A3"}), running, (T0 + timedelta(seconds=10)).timestamp(),
                    lambda run, f: place_from_candidates(by_key[run.run_key], f), rules(TWO_TEAMS), explain=True)
    assert out.grants == () and out.reservation.run_key == "n-gang"
    assert "vision" in out.waiting_reasons["v-next"] and "owed to other teams" in out.waiting_reasons["v-next"]


def test_quotas_are_per_device_type():
    """vision's quota is on A100s only: beyond it, it takes the V100s nlp has no claim on."""
    queues = {"teams": {"vision": {"nominal_quota": {"A100-SXM4-80GB": 1}},
                        "nlp": {"nominal_quota": {"A100-SXM4-80GB": 3}}}}
    waiting = [entry(f"v{i}", "vision", at=i, groups=(A100, V100)) for i in range(3)]
    waiting += [entry(f"n{i}", "nlp", at=10 + i) for i in range(3)]
    got = grants(waiting, A100 + V100, r=rules(queues))
    on_a100 = {k for k, devs in got.items() if devs[0].startswith("A")}
    assert {k for k in on_a100 if k.startswith("v")} == {"v0"} and {f"n{i}" for i in range(3)} <= on_a100
    assert {k for k, devs in got.items() if devs[0].startswith("V")} == {"v1", "v2"}


def test_weights_share_what_no_nominal_quota_covers():
    """No nominal quotas: six devices between a team of weight 2 and one of weight 1 go 4 and 2."""
    devices = A100 + V100[:2]
    queues = {"teams": {"vision": {"weight": 2}, "nlp": {"weight": 1}}}
    waiting = [entry(f"n{i}", "nlp", at=i, runtime=10, groups=(A100, V100)) for i in range(6)]
    waiting += [entry(f"v{i}", "vision", at=10 + i, runtime=500, groups=(A100, V100)) for i in range(6)]
    assert teams_of(grants(waiting, devices, r=rules(queues)), waiting) == {"vision": 4, "nlp": 2}


def test_a_team_of_many_short_runs_never_holds_more_than_its_share_while_the_other_waits():
    """Replayed over time (short runs end and leave, new ones keep coming): while nlp waits, vision holds at most
    its nominal 2 of the 4 A100s; without teams it holds all 4 until its stream ends."""
    def replay(r: QueueRules) -> list[int]:
        waiting = [entry(f"v{i}", "vision", at=i, runtime=10) for i in range(40)]
        waiting += [entry(f"n{i}", "nlp", at=1 + i, runtime=1000) for i in range(3)]
        running: list[RunningRun] = []
        held_by_vision_while_nlp_waits = []
        for step in range(60):
            now = 50.0 + 10 * step
            running = [h for h in running if h.expected_end is None or h.expected_end > now]
            free = [d for d in A100 if not any(d in h.devices for h in running)]
            for key, devs in grants(waiting, free, running, r, at=now).items():
                e = next(e for e in waiting if e.run_key == key)
                running.append(RunningRun(key, devs, now + e.expected_runtime_s, team=e.team))
                waiting.remove(e)
            if any(e.team == "nlp" for e in waiting):
                held_by_vision_while_nlp_waits.append(sum(len(h.devices) for h in running if h.team == "vision"))
        return held_by_vision_while_nlp_waits

    assert max(replay(rules(TWO_TEAMS))) <= 2
    assert max(replay(rules())) == 4


def test_priority_orders_runs_within_a_team_but_not_across_teams():
    queues = {"teams": {"vision": {"nominal_quota": {"A100-SXM4-80GB": 1}},
                        "nlp": {"nominal_quota": {"A100-SXM4-80GB": 1}}}, "priority_classes": {"high": 100}}
    parsed = parse_team_queues(queues, "q.yaml")
    urgent = parsed.priority("high")
    waiting = [entry("v-short", "vision", at=0, runtime=10), entry("v-urgent", "vision", at=5, runtime=900,
                                                                    priority=urgent),
               entry("n-urgent", "nlp", at=1, runtime=900, priority=urgent)]
    got = grants(waiting, A100[:2], r=rules(queues))
    assert set(got) == {"v-urgent", "n-urgent"}
    # without teams, priority orders the whole queue
    flat = [entry("low", "x", at=0, runtime=10), entry("high", "y", at=5, runtime=900, priority=5)]
    assert set(grants(flat, A100[:1], r=rules())) == {"high"}


def test_an_unknown_priority_class_is_an_error_naming_the_field_and_the_classes():
    with pytest.raises(ConfigError, match=r"scheduler.priority: priority class 'urgent'.*classes: high"):
        parse_team_queues({"priority_classes": {"high": 1}}, "q.yaml").priority("urgent")


def test_a_held_queue_admits_nothing_and_blocks_nobody():
    waiting = [entry("v0", "vision", at=0), entry("n0", "nlp", at=1)]
    team_hold = QueueHold(team="vision", reason="driver upgrade", held_by="ops", held_at=T0)
    by_key = {e.run_key: e for e in waiting}
    out = admission(waiting, frozenset(A100), [], T0.timestamp() + 10,
                    lambda run, f: place_from_candidates(by_key[run.run_key], f), rules(TWO_TEAMS, [team_hold]),
                    explain=True)
    assert [g.run_key for g in out.grants] == ["n0"]
    assert "team 'vision''s queue is held for maintenance by ops" in out.waiting_reasons["v0"]
    assert "driver upgrade" in out.waiting_reasons["v0"]
    whole = QueueHold(team="*", reason="PDU swap", held_at=T0)
    assert grants(waiting, A100, r=rules(TWO_TEAMS, [whole])) == {}


@pytest.mark.parametrize("bad, field", [
    ({"teams": {"vision": {"weight": 0}}}, "teams.vision.weight"),
    ({"teams": {"vision": {"nominal_quota": {"A100-SXM4-80GB": -1}}}}, "nominal_quota"),
    ({"teams": {"vision": {"quota": 2}}}, "quota"),
    ({"teams": ["vision"]}, "teams"),
])
def test_a_bad_team_queues_file_names_the_file_and_the_field(bad, field):
    with pytest.raises(ConfigError, match=rf"q.yaml: .*{field}"):
        parse_team_queues(bad, "q.yaml")


def test_the_shipped_example_team_queues_read_through_the_setting(monkeypatch):
    from autodl.config import include_dir
    from autodl.quota import load_team_queues

    monkeypatch.setenv("AUTODL_TEAM_QUEUES", str(include_dir() / "queues" / "example.yaml"))
    queues = load_team_queues()
    assert queues.quota("vision").nominal("A100-SXM4-80GB") == 4 and queues.quota("vision").weight == 2
    assert queues.quota("anyone").nominal("A100-SXM4-80GB") == 0 and queues.priority("low") == -100
    monkeypatch.setenv("AUTODL_TEAM_QUEUES", str(include_dir() / "queues" / "missing.yaml"))
    with pytest.raises(ConfigError, match=r"missing.yaml.*team queues file"):
        load_team_queues()


def test_a_team_waiting_within_its_quota_is_told_who_borrowed_it():
    """nlp borrowed all four A100s while vision asked for nothing; vision's run now waits within its quota and
    is told so (its devices come back as nlp's runs end: autodl never preempts)."""
    running = [RunningRun(f"n-old{i}", (f"A{i}",), expected_end=T0.timestamp() + 600, team="nlp") for i in range(4)]
    waiting = [entry("v0", "vision", at=0)]
    out = admission(waiting, frozenset(), running, T0.timestamp() + 10,
                    lambda run, f: place_from_candidates(waiting[0], f), rules(TWO_TEAMS), explain=True)
    assert out.grants == ()
    assert "team 'vision''s nominal quota of A100-SXM4-80GB is lent to 'nlp'" in out.waiting_reasons["v0"]
    assert out.waiting_reasons["v0"].startswith("no device is free now; ") and "no preemption" in out.waiting_reasons["v0"]


def test_two_shared_leases_on_one_device_count_as_one_device_of_quota():
    """Fractional leases (docs/reference/fractional-leases.md): vision's two packed runs share A0, so vision holds one
    A100 of its nominal two and may take one more; the same two runs held exclusively on A0 and A1 use its quota up
    (and the two free devices are owed to nlp's two waiting runs, so vision may not borrow)."""
    waiting = [entry("v9", "vision"), entry("n0", "nlp", runtime=5000), entry("n1", "nlp", runtime=5000)]
    shared = [RunningRun("p1", ("A0",), team="vision", device_share=0.5),
              RunningRun("p2", ("A0",), team="vision", device_share=0.5)]
    whole = [RunningRun("x1", ("A0",), team="vision"), RunningRun("x2", ("A1",), team="vision")]
    free = ["A2", "A3"]
    assert "v9" in grants(waiting, free, shared, rules(TWO_TEAMS))
    assert "v9" not in grants(waiting, free, whole, rules(TWO_TEAMS))
