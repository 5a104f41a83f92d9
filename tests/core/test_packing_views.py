"""Packing where platform teams look (issue 24, a fresh user's trial): ``autodl leases`` and ``autodl runs`` say
which leases and runs shared a device and with whom, ``autodl plan`` says what a packed run would reserve, the
wait log names every fitting device's holders and why a packed run waits, and a pair-bar refusal is logged once.
Through the real CLI (``autodl.cli.main``) and the real wait step, SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autodl import cli, pipeline
from autodl.ledger import Ledger
from tests.core.test_packing_queue import PACKED, pool_file, poll, profile_out
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the schema-per-test fixture

GB = 10**9
GiB = 1 << 30


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, monkeypatch, autodl_home):
    if request.param == "postgresql":
        monkeypatch.setenv("AUTODL_STORE_URL", request.getfixturevalue("pg_url"))
    return request.param


def test_the_leases_table_shows_each_shared_lease_with_its_reservation_and_co_tenant(store, tmp_path, capsys):
    pool = pool_file(tmp_path, 2)
    out = profile_out(tmp_path, "packed", PACKED, peak=20 * GB)
    alone = profile_out(tmp_path, "alone", None, peak=20 * GB)
    assert poll("p1", out, pool) is not None and poll("x1", alone, pool) is not None
    assert poll("p2", out, pool) is not None   # beside p1: the other device is x1's alone
    capsys.readouterr()
    assert cli.main(["leases"]) == 0
    table = capsys.readouterr().out
    rows = {line.split("│")[2].strip(): line for line in table.splitlines() if line.count("│") > 3}
    reserved = Ledger().get("p2").reserved_bytes
    assert f"shared {20 * GB / GiB:.2f} GiB with p2" in rows["p1"], table
    assert f"shared {reserved / GiB:.2f} GiB with p1" in rows["p2"], table
    assert "exclusive" in rows["x1"] and "shared" not in rows["x1"], table


def test_the_runs_table_says_whom_a_packed_run_shared_with(autodl_home, capsys):
    from autodl.records import RecordStore
    from autodl.types import RunRecord

    for key, sharing, co, cap in (("a", "shared", ["b"], 569 * 2**20), ("b", "shared", ["a"], None),
                                  ("c", "exclusive", [], None)):
        RecordStore().write(RunRecord(run_key=key, script=f"/{key}.py", outcome="succeeded", declared_pool=False,
                                      sharing=sharing, co_tenants=co, device_memory_cap_bytes=cap))
    capsys.readouterr()
    assert cli.main(["runs"]) == 0
    table = capsys.readouterr().out
    rows = {key: line for line in table.splitlines() for key in ("a", "b", "c") if f" {key}.py " in line}
    assert "shared 0.56 GiB with b" in rows["a"], table
    assert "shared reservation unknown with a" in rows["b"], table
    assert "exclusive" in rows["c"], table
