"""Store faults lose nothing and hang nothing (issue 23): a PostgreSQL restart under a running training, a
server that accepts and never answers, a SQLite file deleted or replaced mid-run, a full disk."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import uuid
from contextlib import closing

import pytest
from sqlalchemy.engine import make_url

from autodl.errors import StoreError, StoreUnavailable
from autodl.ledger import Ledger
from autodl.pipeline import CollectGuard, CollectLimits, RunContext
from autodl.store_faults import classify
from autodl.types import LaunchHandle
from tests.cli_helpers import run_cli
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in front of PostgreSQL that can be cut (every connection closed, new ones
    refused) and restored: what a server restart looks like from the client."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            server = socket.create_connection(self.upstream)
            with self.lock:
                self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with closing(s):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def cut(self) -> None:
        self.up = False
        with self.lock:
            for s in self.conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns.clear()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def proxied_lease(pg_url, monkeypatch):  # noqa: F811 - pg_url is test_store_postgres's schema-per-test store
    """A lease booked through a cuttable proxy in front of the test's PostgreSQL schema, and a collect guard
    heartbeating it every 6 s with a 30 s TTL: (proxy, store URL, lease, guard, log lines, start time)."""
    target = make_url(pg_url)
    proxy = CuttableProxy((target.host, target.port))
    store = target.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    monkeypatch.setenv("AUTODL_STORE_URL", store)
    monkeypatch.setenv("AUTODL_LEASE_TTL", "30")
    lease = Ledger(store).book(f"dag.train.manual__{uuid.uuid4().hex[:6]}", ["GPU-0"])
    handle = LaunchHandle(launcher="local", run_key=lease.run_key, lease_id=lease.lease_id)
    logged: list[str] = []
    guard = CollectGuard(RunContext(run_key=lease.run_key), handle, launcher=None,
                         limits=CollectLimits(heartbeat_every_s=6.0), log=logged.append)
    try:
        yield proxy, store, lease, guard, logged, handle.started_at.timestamp()
    finally:
        proxy.close()


def test_a_postgresql_restart_under_a_training_keeps_its_lease(proxied_lease):
    proxy, store, lease, guard, logged, t = proxied_lease
    assert guard.check(now=t + 6) is None            # a beat that the store answers
    proxy.cut()                                       # the server restarts
    with pytest.raises(StoreUnavailable, match="AUTODL_STORE_URL"):
        Ledger(store).heartbeat(lease.run_key, lease.lease_id)
    assert guard.check(now=t + 12) is None            # the run goes on; the beat is retried
    assert guard.check(now=t + 13) is None
    assert any("no answer from the store" in line for line in logged)
    proxy.restore()
    assert guard.check(now=t + 14) is None            # answered again: the lease was kept alive
    held = Ledger(store).get(lease.run_key)
    assert held is not None and held.lease_id == lease.lease_id


def test_a_store_down_longer_than_the_ttl_stops_the_training_saying_why(proxied_lease):
    proxy, _store, _lease, guard, _logged, t = proxied_lease
    assert guard.check(now=t + 6) is None
    proxy.cut()
    assert guard.check(now=t + 12) is None
    stopped = guard.check(now=t + 40)
    assert stopped is not None and stopped.status == "lease_lost"
    assert "has not answered" in str(stopped) and "TTL" in str(stopped)


def test_a_store_that_accepts_and_never_answers_fails_the_command_with_exit_9(capsys):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)                  # accepts (the kernel completes the handshake) and never says a word
    try:
        url = f"postgresql+psycopg2://autodl:pw@127.0.0.1:{silent.getsockname()[1]}/autodl"
        done = run_cli(capsys, "leases", env={"AUTODL_STORE_URL": url})
        assert done.returncode == 9, done.stderr
        assert "AUTODL_STORE_URL" in done.stderr and "pw" not in done.stderr.replace("password", "")
    finally:
        silent.close()


def test_a_sqlite_store_deleted_mid_run_fails_loudly(tmp_path):
    db = tmp_path / "autodl.db"
    url = f"sqlite:///{db}"
    ledger = Ledger(url)
    ledger.book("dag.train.manual__1", ["GPU-0"])
    for suffix in ("", "-wal", "-shm"):
        if (tmp_path / f"autodl.db{suffix}").exists():
            os.unlink(tmp_path / f"autodl.db{suffix}")
    with pytest.raises(StoreError, match="deleted or replaced"):
        ledger.heartbeat("dag.train.manual__1")


def test_a_sqlite_store_replaced_mid_run_fails_loudly(tmp_path):
    db = tmp_path / "autodl.db"
    url = f"sqlite:///{db}"
    ledger = Ledger(url)
    ledger.book("dag.train.manual__1", ["GPU-0"])
    other = tmp_path / "other.db"
    sqlite3.connect(other).close()
    os.replace(other, db)
    with pytest.raises(StoreError, match="deleted or replaced"):
        ledger.get("dag.train.manual__1")


@pytest.mark.parametrize("message, kind", [
    ("database or disk is full", "fatal"),
    ("attempt to write a readonly database", "fatal"),
    ("database is locked", None),         # SQLite's busy timeout already waited: the caller's business
])
def test_sqlite_errors_are_told_apart(message, kind):
    assert classify(sqlite3.OperationalError(message)) == kind
