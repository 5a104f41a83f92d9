"""Fixtures for running DAGs in-process: a migrated embedded metadata database (SQLite)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def airflow_db():
    """Migrate the session's embedded Airflow metadata DB once (``airflow db migrate``)."""
    home = Path(os.environ["AIRFLOW_HOME"])
    marker = home / ".migrated"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, env=os.environ.copy(),
                       stdout=subprocess.DEVNULL)
        marker.write_text("ok")
    return home
