""".ci/run stops every service it started, by pid, when it ends, and leaves alone those it found running.

Seen before (issue 12): .ci/run started PostgreSQL and dockerd and left them running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of ours still answers kill 0: look at its state
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")


def test_started_services_are_stopped_on_exit_and_found_ones_left_running(tmp_path):
    found = subprocess.Popen(["sleep", "300"], start_new_session=True)  # a service that was already running
    script = tmp_path / "run.sh"
    script.write_text(f"""set -euo pipefail
source {REPO / '.ci/services.sh'}
trap 'rc=$?; autodl_ci_stop_started; exit $rc' EXIT
sleep 300 & echo "$!" > {tmp_path / 'term.pid'}; autodl_ci_started sleeper $! TERM
sleep 301 & echo "$!" > {tmp_path / 'int.pid'}; autodl_ci_started second $! TERM
false  # the tests failed: the services are stopped all the same and the exit status kept
""")
    try:
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=None)
        assert out.returncode == 1, out.stderr
        term, stubborn = (int((tmp_path / f"{n}.pid").read_text()) for n in ("term", "int"))
        time.sleep(0.2)
        assert not _alive(term) and not _alive(stubborn), out.stderr
        lines = out.stderr.splitlines()
        stops = [line for line in lines if line.startswith("ci: stopping")]
        assert stops == [f"ci: stopping second (pid {stubborn}, SIGTERM)", f"ci: stopping sleeper (pid {term}, SIGTERM)"]
        assert found.poll() is None, "a service found running must be left alone"
    finally:
        found.send_signal(signal.SIGTERM)
        found.wait()


def test_ci_scripts_record_what_they_start():
    run = (REPO / ".ci/run").read_text()
    assert run.index("source .ci/services.sh") < run.index("\ntrap ") < run.index("source .ci/postgres.sh")
    assert "autodl_ci_started postgresql" in (REPO / ".ci/postgres.sh").read_text()
    assert "autodl_ci_started dockerd" in (REPO / ".ci/docker.sh").read_text()


def test_docker_sh_records_the_engine_it_starts_and_the_trap_stops_it(tmp_path):
    """.ci/docker.sh with stand-ins for docker, dockerd and pgrep (the machine's real engine is not touched):
    the engine it starts is recorded with its pid and stopped by the EXIT trap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    up = tmp_path / "engine-up"
    (bin_dir / "docker").write_text(f"#!/bin/sh\n[ \"$1\" = info ] && [ -f {up} ]\n")
    (bin_dir / "dockerd").write_text(f"#!/bin/sh\ntouch {up}\necho $$ > {tmp_path / 'dockerd.pid'}\nexec sleep 300\n")
    (bin_dir / "pgrep").write_text("#!/bin/sh\nexit 1\n")  # no engine of anyone else's
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = tmp_path / "run.sh"
    script.write_text(f"""set -euo pipefail
export PATH={bin_dir}:$PATH AUTODL_DOCKERD_LOG={tmp_path / 'dockerd.log'} AUTODL_DOCKERD_WAIT_S=30
source {REPO / '.ci/services.sh'}
trap 'rc=$?; autodl_ci_stop_started; exit $rc' EXIT
source {REPO / '.ci/docker.sh'}
echo "ready=$AUTODL_DOCKER_READY"
""")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert "ready=1" in out.stdout
    pid = int((tmp_path / "dockerd.pid").read_text())
    assert f"ci: started dockerd (pid {pid})" in out.stderr and f"ci: stopping dockerd (pid {pid}, SIGTERM)" in out.stderr
    time.sleep(0.2)
    assert not _alive(pid)


def test_ci_runs_every_test_in_exactly_one_of_its_two_jobs():
    """The fast job's marker expression is the services job's negated, so no test is in both or in neither, and
    the daemons start between the two jobs (tests/conftest.py marks who needs them)."""
    run = (REPO / ".ci/run").read_text()
    jobs = dict(re.findall(r'job (\w+) "([^"]+)"', run))
    assert set(jobs) == {"fast", "services"}, jobs
    assert jobs["fast"] == f"not ({jobs['services']})"
    assert run.index("job fast ") < run.index("source .ci/postgres.sh") < run.index("job services ")
    assert run.index("source .ci/bubblewrap.sh") < run.index("job fast ")
