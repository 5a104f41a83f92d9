"""A DAG's relative script and spec paths are read as its author meant them, whatever the worker's folder."""

from __future__ import annotations

import os
from types import SimpleNamespace

from autodl.operators.steps import AutoDLProfileOperator


def test_a_relative_spec_path_is_read_beside_the_dag_file_when_the_workers_folder_lacks_it(tmp_path, monkeypatch):
    """The README's DAG names ``include/specs/simple_cnn.yaml``: a worker whose folder is elsewhere found no such
    file. It is read from the DAG file's folder, or the folder above it (``dags/`` beside ``include/``)."""
    project = tmp_path / "project"
    (project / "dags").mkdir(parents=True)
    (project / "include" / "specs").mkdir(parents=True)
    spec = project / "include" / "specs" / "cnn.yaml"
    spec.write_text("task: {}\n")
    (project / "dags" / "local.yaml").write_text("task: {}\n")
    elsewhere = tmp_path / "worker"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    op = AutoDLProfileOperator(task_id="train.profile", group_id="train")
    context = {"dag": SimpleNamespace(fileloc=str(project / "dags" / "train.py"))}
    assert op._input("include/specs/cnn.yaml", context) == str(spec)
    assert op._input("local.yaml", context) == str(project / "dags" / "local.yaml")
    assert op._input("include/specs/absent.yaml", context) == "include/specs/absent.yaml"  # the error says where
    (elsewhere / "include" / "specs").mkdir(parents=True)
    (elsewhere / "include" / "specs" / "cnn.yaml").write_text("task: {}\n")
    assert op._input("include/specs/cnn.yaml", context) == "include/specs/cnn.yaml"  # the worker's own folder first
    assert op._input(str(spec), context) == str(spec) and op._input("", context) is None
    assert os.getcwd() == str(elsewhere)
