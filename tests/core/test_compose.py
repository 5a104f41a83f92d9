"""docker-compose.yaml: parses, pins the Airflow version of requirements.txt, keeps autodl's store apart."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_compose_matches_the_pinned_stack():
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    airflow_pin = re.search(r"^apache-airflow==(\S+)$", (REPO / "requirements.txt").read_text(), re.M).group(1)
    services = compose["services"]
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        svc = services[name]
        assert svc["image"] == f"apache/airflow:{airflow_pin}-python3.11"
        env = svc["environment"]
        assert env["AUTODL_STORE_URL"] != env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]  # never Airflow's metadata DB
        for volume in svc["volumes"]:
            host = volume.split(":")[0]
            assert (REPO / host).exists(), volume
    assert services["airflow-scheduler"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert (REPO / "docker" / "postgres-init.sql").is_file()
