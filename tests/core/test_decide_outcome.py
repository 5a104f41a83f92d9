"""The release step's outcome is decided from its facts alone (autodl.steps.record.decide_outcome): no store, no launcher."""

from datetime import datetime, timezone

from autodl.steps.record import ReleaseFacts, decide_outcome
from autodl.types import LaunchHandle, StopMark

HANDLE = LaunchHandle(launcher="local", run_key="k", lease_id="L1", pid=1, pgid=1)
STOP = StopMark(lease_id="L1", run_key="k", by="alice", at=datetime(2026, 12, 1, 4, 0, tzinfo=timezone.utc))


def test_a_run_never_launched_with_no_reason_names_the_step_airflow_ended():
    assert decide_outcome(ReleaseFacts()).error.startswith("profile: never started, and no step recorded why")
    facts = ReleaseFacts(profile_out={"script": "train.py"}, selection={"placement": {}})
    outcome = decide_outcome(facts)
    assert outcome.outcome == "not_started" and outcome.error.startswith("launch: never started")


def test_a_requeued_booking_that_never_launched_says_why_it_was_requeued():
    facts = ReleaseFacts(profile_out={}, requeued={"message": "no worker of host gpu-2 picked up the launch"})
    outcome = decide_outcome(facts)
    assert outcome.outcome == "not_started"
    assert outcome.error == "launch: never started: no worker of host gpu-2 picked up the launch"


def test_a_step_failure_of_a_run_never_launched_is_its_error():
    outcome = decide_outcome(ReleaseFacts(failures={"select_device": "no fit"}))
    assert (outcome.outcome, outcome.error) == ("not_started", "select_device: no fit")


def test_a_training_that_ended_with_zero_succeeded_even_when_stopped_by_hand_later():
    outcome = decide_outcome(ReleaseFacts(handle=HANDLE, exit_code=0, stopped=STOP, metrics={"oom": {"x": 1}}))
    assert (outcome.outcome, outcome.error, outcome.stopped, outcome.oom) == ("succeeded", None, None, None)


def test_a_stop_by_hand_is_stopped_its_mark_first_and_the_collects_word_on_it_not_repeated():
    facts = ReleaseFacts(handle=HANDLE, exit_code=143, stopped=STOP,
                         failures={"collect": f"training {STOP.describe()}", "launch": "slow start"})
    outcome = decide_outcome(facts)
    assert outcome.outcome == "stopped" and outcome.stopped == STOP
    assert outcome.error == (f"stopped: {STOP.describe()} (the training exited with 143 on the stop signal); "
                             "launch: slow start")


def test_an_out_of_memory_failure_adds_its_explanation_and_keeps_the_finding():
    oom = {"explanation": "activations need 30 GiB on a 24 GiB device"}
    outcome = decide_outcome(ReleaseFacts(handle=HANDLE, exit_code=1, metrics={"oom": oom},
                                          failures={"collect": "training failed"}))
    assert outcome.outcome == "failed" and outcome.oom == oom
    assert outcome.error == "collect: training failed; out of memory: activations need 30 GiB on a 24 GiB device"


def test_a_failure_with_no_reason_recorded_gives_its_exit_code_and_an_unknown_code_gives_none():
    assert decide_outcome(ReleaseFacts(handle=HANDLE, exit_code=2)).error == "training failed with exit code 2"
    unknown = decide_outcome(ReleaseFacts(handle=HANDLE))
    assert (unknown.outcome, unknown.error) == ("failed", None)
