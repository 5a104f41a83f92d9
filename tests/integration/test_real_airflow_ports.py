"""The real-Airflow harness (:class:`tests.integration.real_airflow.RealAirflow`) checks its fixed ports on
127.0.0.1 before it starts anything. No Airflow runs here: sockets only, so this is in the fast job.

Seen: a CI run killed mid-way left its Airflow listening on 127.0.0.1:28080; the next run's fixture started its
own Airflow (whose api-server failed to bind) and the tests talked to the leftover server, failing with
"HTTP Error 401: Unauthorized", far from the cause.
"""

from __future__ import annotations

import socket

import pytest

from tests.integration import browser
from tests.integration.browser import PortInUse, check_ports_free
from tests.integration.real_airflow import RealAirflow


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (the kernel's choice, released again)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture
def leftover():
    """A listener on 127.0.0.1, as a leftover Airflow's api-server (uvicorn sets SO_REUSEADDR): its port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def test_a_port_in_use_is_named_with_what_to_do(leftover):
    other, = free_ports(1)
    with pytest.raises(PortInUse) as err:
        check_ports_free([other, leftover])
    message = str(err.value)
    assert f"127.0.0.1:{leftover} is in use" in message
    assert f"ss -ltnp 'sport = :{leftover}'" in message
    assert "leftover Airflow" in message and "stop it and rerun" in message
    assert str(other) not in message


def test_free_ports_pass():
    check_ports_free(free_ports(4))


def test_a_port_left_in_time_wait_by_a_stopped_server_is_free():
    """A server that stopped cleanly leaves TIME_WAIT connections on its port for a minute; the next Airflow
    binds there (uvicorn sets SO_REUSEADDR), so the check must not refuse it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn, _ = server.accept()
    conn.close()  # the server closes first: its side of the connection is left in TIME_WAIT
    client.recv(1)
    client.close()
    server.close()
    check_ports_free([port])


def test_start_fails_on_a_taken_port_before_starting_anything(leftover, tmp_path, monkeypatch):
    started = []

    def no_process(*args, **kwargs):
        started.append(args)
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(browser.subprocess, "run", no_process)
    monkeypatch.setattr(browser.subprocess, "Popen", no_process)
    ports = (leftover, *free_ports(3))
    af = RealAirflow(tmp_path / "airflow", bundles={}, ports=ports)
    with pytest.raises(PortInUse, match=f"127.0.0.1:{leftover} is in use"):
        af.start()
    assert started == [] and af.procs == {}


def test_every_configured_port_is_checked(tmp_path, monkeypatch):
    """The api-server's port and the log and health ports the components are configured with."""
    checked: list[int] = []

    def record(ports):
        checked.extend(ports)
        raise PortInUse("stop here, before anything starts")

    monkeypatch.setattr(browser, "check_ports_free", record)
    ports = tuple(free_ports(4))
    af = RealAirflow(tmp_path / "airflow", bundles={}, ports=ports)
    with pytest.raises(PortInUse):
        af.start()
    assert checked == list(ports)
    assert {af.env[k] for k in ("AIRFLOW__API__PORT", "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT",
                                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT",
                                "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT")} == {str(p) for p in ports}
