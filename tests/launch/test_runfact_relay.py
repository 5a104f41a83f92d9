"""The start-up hook's relay (``AUTODL_RUNFACTS=log``): the run's files reach its stderr once, from one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from autodl.launch.local import CHILD_PATH
from autodl.runfacts import PREFIX, FactSink, split_fact

SCRIPT = r'''
import json, os, subprocess, sys, time
path = os.environ["AUTODL_METRICS_FILE"]
def step(i):
    with open(path, "a") as fh:
        fh.write(json.dumps({"step": i, "t": 100.0 + i, "samples": 8}) + "\n")
step(0)
time.sleep(0.7)  # one relay period passes while the script runs
# a child Python process (as paddle.distributed.launch starts ranks) loads the hook too, but never relays
subprocess.run([sys.executable, "-c", "import time; time.sleep(0.8)"], check=True)
step(1)
with open(path, "a") as fh:
    fh.write('{"step": 2, "t": 1')  # torn: never relayed half
with open(os.environ["AUTODL_REPORT_FILE"], "w") as fh:
    json.dump({"epoch": 3}, fh)
print("done", flush=True)
'''


def test_relay_sends_each_line_and_the_report_once_and_never_a_torn_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTODL_")}
    env.update(PYTHONPATH=CHILD_PATH, AUTODL_RUNFACTS="log", AUTODL_METRICS_FILE=str(tmp_path / "m.jsonl"),
               AUTODL_REPORT_FILE=str(tmp_path / "report.json"), AUTODL_PEAK_HOOK="0")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    facts = [split_fact(line)[1] for line in proc.stderr.splitlines() if PREFIX in line]
    assert facts.count('report {"epoch":3}') == 1
    steps = [json.loads(f.split(" ", 1)[1])["step"] for f in facts if f.startswith("metrics ")]
    assert steps == [0, 1], proc.stderr
    assert proc.stdout == "done\n", "the relay writes to stderr only"
    sink = FactSink(tmp_path / "kept.jsonl", tmp_path / "kept-report.json")
    for fact in facts:
        sink.take(fact)
    assert sink.rejected == 0 and sink.kept == 2 and sink.reports == 1


def test_without_runfacts_log_nothing_is_relayed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTODL_")}
    env.update(PYTHONPATH=CHILD_PATH, AUTODL_METRICS_FILE=str(tmp_path / "m.jsonl"),
               AUTODL_REPORT_FILE=str(tmp_path / "report.json"), AUTODL_PEAK_HOOK="0")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    assert PREFIX not in proc.stderr
