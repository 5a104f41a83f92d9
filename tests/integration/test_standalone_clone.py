"""The repository stands alone: a clone with no ``shared/`` folder beside it passes the tests that read data.

Seen before (issue 12): a fresh clone outside this workplace failed a test, because the tests read the
data from the workplace's handed-over folder beside the repository (not part of it). The data now lives in ``include/data/`` with its sources
and licences; this test copies the tracked files into a temporary folder (nothing beside it) and runs the
data-reading tests there, with the copy's own package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_wheel_install import _tracked_copy

pytestmark = [pytest.mark.integration, pytest.mark.minutes]

REPO = Path(__file__).resolve().parents[2]
DATA_TESTS = ["tests/simulate", "tests/profile/test_runtime.py", "tests/policy/test_place.py",
              "tests/core/test_catalog.py", "tests/core/test_config.py"]
HANDED_DATA = "shared" + "/data"  # spelled apart so that this file does not match its own search


def test_no_tracked_file_reads_the_handed_data_folder():
    out = subprocess.run(["git", "grep", "-l", HANDED_DATA], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.split() == [], out.stdout
    readme = (REPO / "include/data/README.md").read_text()
    assert "CC BY 4.0" in readme and "gpu-relative-throughput.csv" in readme
    sim_readme = (REPO / "sim/src/autodl_sim/data/README.md").read_text()
    assert "CC BY 4.0" in sim_readme and "philly-jobs.csv" in sim_readme and "estimate-errors.csv" in sim_readme


def test_data_tests_pass_in_a_clone_with_nothing_beside_it(tmp_path):
    clone = tmp_path / "alone" / "autodl"
    _tracked_copy(clone)
    assert sorted(p.name for p in clone.parent.iterdir()) == ["autodl"]
    assert not (clone.parent / "shared").exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTODL_", "AIRFLOW", "PYTHONPATH"))}
    which = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'plugins'); import autodl.config as c; "
                            "print(c.__file__); print(c.include_dir())"],
                           cwd=clone, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert Path(which[0]).is_relative_to(clone) and Path(which[1]) == (clone / "include").resolve()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not integration",
                          *DATA_TESTS], cwd=clone, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout.splitlines()[-1] and "skipped" not in out.stdout.splitlines()[-1], out.stdout[-500:]
