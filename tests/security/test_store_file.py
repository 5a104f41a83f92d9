"""The SQLite store file is its owner's only (issue 19): it holds every tenant's run keys, leases and records.

Seen: the store ``airflow_home/autodl/autodl.db`` was created with the process's umask (0644 under the usual
022), so any local user could read other tenants' run keys and leases.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from autodl.ledger import Ledger
from autodl.store_file import secure_sqlite_file


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_a_new_store_and_its_wal_and_shm_files_and_folder_are_owner_only(tmp_path, monkeypatch, umask_022):
    """The default store, in a new autodl home: the folder 0700, the database and its WAL files 0600."""
    home = tmp_path / "fresh" / "autodl_home"
    db = home / "autodl.db"
    monkeypatch.setenv("AUTODL_HOME", str(home))
    monkeypatch.delenv("AUTODL_STORE_URL")
    ledger = Ledger()
    ledger.book("dag/run/train", ["gpu-0"], host="h")
    assert ledger.get("dag/run/train") is not None  # the store works, in WAL mode
    assert mode(db) == 0o600
    assert mode(db.parent) == 0o700
    side = [db.with_name(db.name + s) for s in ("-wal", "-shm")]
    assert any(p.exists() for p in side)
    for p in side:
        if p.exists():
            assert mode(p) == 0o600, (p, oct(mode(p)))


def test_an_existing_store_readable_by_others_is_tightened_with_a_warning(tmp_path, monkeypatch, caplog):
    db = tmp_path / "autodl.db"
    sqlite3.connect(db).close()
    os.chmod(db, 0o644)
    wal = db.with_name(db.name + "-wal")
    wal.write_bytes(b"")
    os.chmod(wal, 0o666)
    monkeypatch.setenv("AUTODL_STORE_URL", f"sqlite:///{db}")
    with caplog.at_level(logging.WARNING, logger="autodl.store_file"):
        Ledger().book("dag/run/train", ["gpu-0"], host="h")
    assert mode(db) == 0o600 and mode(wal) == 0o600
    assert f"{db} had mode 0644; tightened to 0600" in caplog.text
    assert f"{wal} had mode 0666" in caplog.text
    assert Ledger().get("dag/run/train") is not None  # nothing recorded is lost


def test_a_store_folder_others_may_write_is_warned_about_not_changed(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    [warning] = secure_sqlite_file(str(folder / "autodl.db"))
    assert str(folder) in warning and "0777" in warning and "chmod" in warning
    assert mode(folder) == 0o777 and mode(folder / "autodl.db") == 0o600


def test_a_sticky_shared_folder_is_not_warned_about(tmp_path):
    folder = tmp_path / "tmp-like"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    assert secure_sqlite_file(str(folder / "autodl.db")) == []


def test_an_in_memory_store_is_left_alone():
    assert secure_sqlite_file(":memory:") == [] and secure_sqlite_file(None) == []
