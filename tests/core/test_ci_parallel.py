""".ci/run's jobs in pytest-xdist workers, as .ci/run starts them, on a small suite that loads this suite's
tests/conftest.py: each worker has its own Airflow home, a module runs whole in one worker, and the modules marked
``minutes`` run first."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, os

def _log(name):
    with open(os.environ["CI_PARALLEL_LOG"], "a") as f:
        f.write(json.dumps([__name__, name, os.environ["PYTEST_XDIST_WORKER"], os.environ["AIRFLOW_HOME"]]) + "\\n")
"""


def _ci_options(job: str) -> list[str]:
    """The xdist options .ci/run passes to ``job`` (``job NAME MARKERS WORKERS``)."""
    run = (REPO / ".ci/run").read_text()
    workers = dict(re.findall(r'job (\w+) "[^"]+" (\d+)', run))[job]
    line = next(ln for ln in run.splitlines() if "scripts/test.sh" in ln and "-n " in ln)
    options = line.split('-n "$workers"', 1)[1].split("-m", 1)[0].split()
    return ["-n", workers, *options]


def _run_suite(tmp_path: Path, options: list[str]) -> list[list[str]]:
    suite = tmp_path / "suite"
    suite.mkdir()
    modules = [(f"test_{letter}_quick", "") for letter in "abcd"] + [("test_z_long", "pytest.mark.minutes")]
    for module, mark in modules:  # more modules than workers: collected last, the long one would never be first
        body = f"import pytest\n{PROBE}\npytestmark = [{mark}]\n"
        body += "".join(f"\ndef test_{i}():\n    _log('{i}')\n" for i in range(3))
        (suite / f"{module}.py").write_text(body)
    log = tmp_path / "order.jsonl"
    env = {**os.environ, "CI_PARALLEL_LOG": str(log), "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'plugins'}"}
    env.pop("AIRFLOW_HOME", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
                          "--rootdir", str(suite), "-c", os.devnull, "-q", *options, str(suite)],
                         capture_output=True, text=True, env=env, cwd=suite)
    assert out.returncode == 0, out.stdout + out.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_services_jobs_workers_start_the_minutes_modules_first_and_keep_each_module_whole(tmp_path):
    ran = _run_suite(tmp_path, _ci_options("services"))
    assert len(ran) == 15
    workers_of = {}
    for module, _, worker, _ in ran:
        workers_of.setdefault(module, set()).add(worker)
    assert all(len(w) == 1 for w in workers_of.values()), workers_of
    firsts = {}
    for module, _, worker, _ in ran:
        firsts.setdefault(worker, module)
    assert "test_z_long" in firsts.values(), f"the minutes module was not the first any worker ran: {firsts}"


def test_each_worker_has_an_airflow_home_of_its_own(tmp_path):
    ran = _run_suite(tmp_path, _ci_options("fast"))
    homes = {worker: {home for _, _, w, home in ran if w == worker} for _, _, worker, _ in ran}
    assert len(homes) == 2, f"the fast job's two workers did not both run: {homes}"
    assert all(len(h) == 1 for h in homes.values()), homes
    (one,), (other,) = homes.values()
    assert one != other and all(worker in home for worker, (home,) in homes.items())
