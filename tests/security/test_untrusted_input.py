"""The pure cores that decide what untrusted code is shown and what of its output is kept (issue 19, items 1, 3)."""

from __future__ import annotations

import json
import os
import socket

import pytest

from autodl.redact import MASK, REPORT_MAX_BYTES, REPORT_MAX_DEPTH, REPORT_MAX_ITEMS, REPORT_MAX_STRING, sanitize_report
from autodl.sandbox import protected_paths, stage_tree


def stage(src, dest, **kw):
    dest.mkdir()
    return stage_tree(src, dest, protected=kw.pop("protected", []), max_files=kw.pop("max_files", 100),
                      max_bytes=kw.pop("max_bytes", 1 << 20), max_depth=kw.pop("max_depth", 3))


def test_only_regular_files_and_folders_are_copied(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "train.py").write_text("x")
    (src / "sub" / "cfg.yaml").write_text("y")
    os.mkfifo(src / "pipe")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(src / "db.sock"))
    (src / "inside").symlink_to(src / "train.py")
    (src / "out").symlink_to("/etc/hostname")
    (src / "dirlink").symlink_to(src / "sub")
    try:
        got = stage(src, tmp_path / "dest")
    finally:
        s.close()
    names = sorted(str(p.relative_to(tmp_path / "dest")) for p in got.files)
    assert names == ["inside", "sub/cfg.yaml", "train.py"]
    assert not (tmp_path / "dest" / "inside").is_symlink()  # a link inside the folder becomes a copy
    reasons = " ".join(got.left_out)
    assert "pipe (not a regular file" in reasons and "db.sock (not a regular file" in reasons
    assert "out (a link out" in reasons and "dirlink (a link out" in reasons


def test_autodl_and_airflow_state_is_never_copied_wherever_it_lies(tmp_path, monkeypatch):
    src = tmp_path / "project"
    home = src / "deep" / "af"
    home.mkdir(parents=True)
    (home / "airflow.cfg").write_text("secret")
    (src / "somewhere").mkdir()
    (src / "somewhere" / "airflow.cfg").write_text("secret")
    (src / "x.db").write_text("secret")
    (src / ".env").write_text("secret")
    (src / "key.pem").write_text("secret")
    (src / "copy_of_home").mkdir()
    (src / "copy_of_home" / "autodl.db").write_text("secret")
    (src / "copy_of_home" / "notes.txt").write_text("ok?")
    (src / "data.csv").write_text("1,2")
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    got = stage(src, tmp_path / "dest", protected=protected_paths(src))
    assert [p.name for p in got.files] == ["data.csv"], got.left_out


def test_copies_are_bounded_in_count_size_and_depth(tmp_path):
    src = tmp_path / "src"
    deep = src / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    (deep / "too_deep.txt").write_text("x")
    for i in range(5):
        (src / f"f{i}.txt").write_text("x" * 100)
    got = stage(src, tmp_path / "d1", max_files=3)
    assert len(got.files) == 3 and any("more than 3 files" in e for e in got.left_out)
    got = stage(src, tmp_path / "d2", max_bytes=250)
    assert got.bytes <= 250 and any("bytes together" in e for e in got.left_out)
    got = stage(src, tmp_path / "d3", max_depth=3)
    assert not any(p.name == "too_deep.txt" for p in got.files) and any("nested" in e for e in got.left_out)


def test_a_report_is_schema_checked_bounded_and_redacted():
    env = {"SECRET_TOKEN": "worker-secret-0123456789", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
           "postgresql://airflow:db-password-987654@pg/airflow"}
    deep: dict = {}
    node = deep
    for _ in range(REPORT_MAX_DEPTH + 3):
        node["n"] = {}
        node = node["n"]
    r = sanitize_report({"epoch": 2, "loss": float("nan"), "Api_Token": "abc", "note": "got worker-secret-0123456789",
                         "pw": "db-password-987654", "pem": "-----BEGIN RSA PRIVATE KEY-----\nMII",
                         "long": "y" * (REPORT_MAX_STRING + 10), "deep": deep, 7: "int key"}, env)
    d = r.data
    assert d["epoch"] == 2 and "loss" not in d and d["Api_Token"] == MASK
    assert "worker-secret" not in json.dumps(d) and "db-password" not in json.dumps(d) and d["pem"] == MASK
    assert len(d["long"]) == REPORT_MAX_STRING + 3 and r.redacted >= 4 and r.dropped >= 3
    depth, node = 0, d["deep"]
    while isinstance(node, dict) and "n" in node:
        depth, node = depth + 1, node["n"]
    assert depth < REPORT_MAX_DEPTH


@pytest.mark.parametrize("bad,why", [
    (b"x" * (REPORT_MAX_BYTES + 1), "refused whole"),
    ("[1, 2]", "JSON object"),
    ("{not json", "not JSON"),
    ("[" * 30_000, "not JSON"),
])
def test_a_bad_report_is_refused_with_a_reason(bad, why):
    with pytest.raises(ValueError, match=why):
        sanitize_report(bad, {})


def test_a_report_with_too_many_entries_keeps_the_first(tmp_path):
    r = sanitize_report({"xs": list(range(REPORT_MAX_ITEMS * 2))}, {})
    assert len(r.data["xs"]) < REPORT_MAX_ITEMS and r.dropped > REPORT_MAX_ITEMS
