"""hwtest's DCGM cases against a real Prometheus server (Debian's ``prometheus``) on 127.0.0.1: dcgm-exporter text
with NaN values, a GPU without a ``UUID`` label, the same GPU exported by two targets, and an exporter that goes
down (``tests/cases/hardware/hwtest/prometheus/exporter_*.txt``).

Ports (``AUTODL_TEST_DCGM_PORT_BASE``, default 29093): base = Prometheus, base+1..base+3 = the exporters (node-a,
node-b, a duplicate of node-a's GPU 0 under another job). The module starts and stops its own Prometheus (config and
storage in a temporary folder) and its own exporters.
"""

from __future__ import annotations

import http.server
import json
import math
import os
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest

from autodl.inventory import read_inventory
from tests.integration.conftest import require_service
from tests.integration.http_wait import get_json as _get
from tests.integration.http_wait import stop_server
from tests.integration.http_wait import wait_for as _wait

pytestmark = pytest.mark.integration

BASE_PORT = int(os.environ.get("AUTODL_TEST_DCGM_PORT_BASE", "29093"))
PROM_PORT, NODE_A, NODE_B, DUP = BASE_PORT, BASE_PORT + 1, BASE_PORT + 2, BASE_PORT + 3
TEXTS = Path(__file__).resolve().parents[1] / "cases" / "hardware" / "hwtest" / "prometheus"
MiB = 1 << 20


class Exporter:
    """Serves a dcgm-exporter text file as ``/metrics``; ``down = True`` answers 503 (Prometheus: ``up == 0``)."""

    def __init__(self, port: int, text: Path):
        self.text, self.down = text.read_bytes(), False
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if owner.down or self.path.split("?")[0] != "/metrics":
                    self.send_response(503)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(owner.text)))
                self.end_headers()
                self.wfile.write(owner.text)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()






@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    binary = shutil.which("prometheus")
    require_service(binary is not None, "Prometheus", "install Debian's prometheus package (`bash .ci/prometheus.sh`)")
    folder = tmp_path_factory.mktemp("prometheus-dcgm")
    exporters = {"a": Exporter(NODE_A, TEXTS / "exporter_node_a.txt"), "b": Exporter(NODE_B, TEXTS / "exporter_node_b.txt"),
                 "dup": Exporter(DUP, TEXTS / "exporter_node_a_duplicate.txt")}
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: dcgm\n    honor_labels: true\n    static_configs: [{{targets: ['127.0.0.1:{NODE_A}', '127.0.0.1:{NODE_B}']}}]\n"
        f"  - job_name: dcgm-dup\n    static_configs: [{{targets: ['127.0.0.1:{DUP}']}}]\n")
    log = open(folder / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                             f"--web.listen-address=127.0.0.1:{PROM_PORT}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{PROM_PORT}/-/ready", timeout=5).status == 200,
              "Prometheus ready")
        _wait(lambda: len(_get(f"http://127.0.0.1:{PROM_PORT}/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP")["data"]["result"]) == 7,
              "DCGM series of the three exporters scraped")
        yield exporters
    finally:
        stop_server(proc)
        log.close()
        for e in exporters.values():
            e.server.shutdown()
            e.server.server_close()


def test_nan_no_uuid_and_duplicates_through_a_real_prometheus(prometheus, catalog):
    """NaN values are unknown (no traceback, valid JSON, never ranked idle); a GPU without a UUID label is listed
    unhealthy, not dropped; a GPU exported twice takes the busier values and a note says so."""
    inv = read_inventory(f"prometheus+http://127.0.0.1:{PROM_PORT}?max_age_s=30", catalog=catalog)
    json.dumps(inv.to_json(), allow_nan=False)
    by = {d.device_id: d for d in inv.devices}
    assert by["GPU-bbbb0003-1111-2222-3333-000000000003"].memory_used_bytes is None
    nan_util = by["GPU-bbbb0001-1111-2222-3333-000000000001"]
    assert nan_util.utilization_pct is None and not any(
        isinstance(v, float) and math.isnan(v) for v in (nan_util.temperature_c, nan_util.power_w))
    assert not by["node-b:2"].healthy and "no UUID label" in by["node-b:2"].health_reason
    dup = by["GPU-aaaa0000-1111-2222-3333-000000000000"]
    assert dup.memory_used_bytes == 30000 * MiB and dup.utilization_pct == 99
    assert any("exported by 2 targets" in n for n in inv.notes)


def test_an_exporter_going_down_is_stale_before_max_age(prometheus, catalog):
    """When Prometheus reports node-b's exporter down (up == 0), node-b's GPUs are unknown at once, although their
    last samples are far younger than max_age_s (an hour here: age alone would never make them stale)."""
    prometheus["b"].down = True
    try:
        url = f"prometheus+http://127.0.0.1:{PROM_PORT}?max_age_s=3600&window_s=3600"

        def node_b_down():
            i = read_inventory(url, catalog=catalog)
            return i if all(not d.healthy for d in i.devices if d.host == "node-b") else None

        inv = _wait(node_b_down, "node-b reported down")
        node_b = [d for d in inv.devices if d.host == "node-b"]
        assert all("down (up == 0)" in d.health_reason and d.memory_used_bytes is None for d in node_b)
        assert all(d.healthy for d in inv.devices if d.host == "node-a")
    finally:
        prometheus["b"].down = False
