"""The hardware cases (tests/cases/hardware, copied from the shared cases): a fake ``pynvml`` driven by JSON scenarios."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).resolve().parents[1] / "cases" / "hardware"
FAKE_NVML = CASES / "fake_nvml" / "pynvml.py"
GiB = 1 << 30
MiB = 1 << 20


def load_fake_nvml():
    """A fresh copy of the fake NVML module (its clock for time series starts now)."""
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_nvml(monkeypatch, tmp_path):
    """``use(case)``: installs the fake as ``pynvml`` with scenario ``case`` (a file name in nvml/, or a dict);
    returns the module. ``FAKE_NVML_LOG`` records the calls (``tmp_path/nvml.log``)."""

    def use(case: str | dict):
        if isinstance(case, dict):
            path = tmp_path / "nvml-scenario.json"
            path.write_text(json.dumps(case))
        else:
            path = CASES / "nvml" / case
        monkeypatch.setenv("FAKE_NVML_CONFIG", str(path))
        monkeypatch.setenv("FAKE_NVML_LOG", str(tmp_path / "nvml.log"))
        module = load_fake_nvml()
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return use


def nvml_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "nvml.log"
    return log.read_text().splitlines() if log.exists() else []
