"""Inputs the reliability fuzz accepted wrongly, each refused with the field and the fix (issue 23):
a NUL in ``task.args``, ``code_dir: /.``, an unknown catalog tag, a run key longer than the store's
column, and a pool URL's password in what autodl logs."""

from __future__ import annotations

import base64
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from autodl.catalog import load_catalog
from autodl.errors import InventoryError, SpecError
from autodl.fields import MAX_RUN_KEY_CHARS
from autodl.inventory.prometheus import read_prometheus
from autodl.pipeline import make_run_key
from autodl.spec import parse_spec

DOCKER = {"type": "docker", "image": "paddle:cpu"}


@pytest.mark.parametrize("where, data", [
    ("task.args", {"task": {"script": "a.py", "args": ["--lr", "0.1\x00; rm -rf /"]}}),
    ("launcher.env", {"task": {"script": "a.py"}, "launcher": {**DOCKER, "env": {"A": "b\x00"}}}),
    ("launcher.env", {"task": {"script": "a.py"}, "launcher": {**DOCKER, "env": {"A\x00": "b"}}}),
])
def test_a_nul_anywhere_is_refused_naming_the_innermost_field(where, data):
    with pytest.raises(SpecError, match=rf"field '{where}': contains a NUL"):
        parse_spec(data)


@pytest.mark.parametrize("code_dir", ["/", "/.", "//", "/./", "/workspace/..", "relative"])
def test_code_dir_naming_the_root_in_any_spelling_is_refused(code_dir):
    with pytest.raises(SpecError, match="launcher.code_dir"):
        parse_spec({"task": {"script": "a.py"}, "launcher": {**DOCKER, "code_dir": code_dir}})


def test_code_dir_is_normalised():
    spec = parse_spec({"task": {"script": "a.py"}, "launcher": {**DOCKER, "code_dir": "/work/./code/"}})
    assert spec.launcher.code_dir == "/work/code"


def test_an_unknown_tag_priority_is_refused_with_the_nearest_tag():
    with pytest.raises(SpecError, match=r"tag_priorities.*unknown catalog tag 'domestc' \(did you mean 'domestic'\?\)"):
        parse_spec({"task": {"script": "a.py"}, "resource_policy": {"tag_priorities": {"domestc": 1.0}}})


def test_a_known_tag_priority_is_kept():
    spec = parse_spec({"task": {"script": "a.py"}, "resource_policy": {"tag_priorities": {"domestic": 1.0}}})
    assert spec.resource_policy.tag_priorities == {"domestic": 1.0}


def test_the_longest_ids_airflow_allows_make_a_run_key_the_store_holds():
    key = make_run_key("d" * 250, "g" * 250, "manual__" + "r" * 242)
    other = make_run_key("d" * 250, "g" * 250, "manual__" + "r" * 241 + "s")
    assert len(key) == MAX_RUN_KEY_CHARS and len(other) == MAX_RUN_KEY_CHARS
    assert key != other                                   # still one key per run
    assert key == make_run_key("d" * 250, "g" * 250, "manual__" + "r" * 242)   # the same in every step
    assert make_run_key("dag", "train", "manual__1") == "dag.train.manual__1"    # short keys unchanged


class _OneSeries(BaseHTTPRequestHandler):
    seen_auth: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen_auth.append(self.headers.get("Authorization", ""))
        body = {"status": "success", "data": {"resultType": "matrix", "result": []}}
        if "DCGM_FI_DEV" in self.path:
            body["data"]["result"] = [{"metric": {"__name__": "DCGM_FI_DEV_FB_FREE", "Hostname": "h1", "gpu": "0",
                                                  "UUID": "GPU-1", "modelName": "NVIDIA A100-SXM4-40GB"},
                                       "values": [[0.0, "1000"]]}]
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("query", ["", "?max_age_s=x", "?max_age_s=600&window_s=1", "?colour=red"])
def test_a_pool_url_password_is_not_in_the_inventory_error(query):
    url = f"prometheus+http://ops:s3cretPW@127.0.0.1:{_free_port()}{query}"
    with pytest.raises(InventoryError) as err:
        read_prometheus(url, load_catalog())
    assert "s3cretPW" not in str(err.value) and "ops:***@" in str(err.value)


def test_a_pool_url_password_is_not_in_the_inventory_source():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OneSeries)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"prometheus+http://ops:s3cretPW@127.0.0.1:{server.server_address[1]}"
        inventory = read_prometheus(url, load_catalog(), now=1.0)
    finally:
        server.shutdown()
    assert inventory.devices and "s3cretPW" not in inventory.source and "***" in inventory.source
    # the credentials reach the server as Basic auth (urllib alone would take them for part of the host)
    assert _OneSeries.seen_auth and set(_OneSeries.seen_auth) == {"Basic " + base64.b64encode(b"ops:s3cretPW").decode()}


def test_two_owners_models_of_one_script_name_get_their_own_checkpoint_folders(tmp_path):
    """Issue 23: two owners' models with the same script name shared one checkpoint folder (one resumed from and
    overwrote the other's). A DAG's run keys its folder by DAG and owner; a run outside Airflow keeps the old one."""
    from autodl.spec import output_dir_path

    spec = parse_spec({"task": {"script": "train.py"}})
    alice = output_dir_path(spec, "train.py", tmp_path, dag_id="nightly", owner="alice")
    bob = output_dir_path(spec, "train.py", tmp_path, dag_id="nightly", owner="bob")
    other_dag = output_dir_path(spec, "train.py", tmp_path, dag_id="weekly", owner="alice")
    assert len({alice, bob, other_dag}) == 3
    assert alice == output_dir_path(spec, "train.py", tmp_path, dag_id="nightly", owner="alice")  # night after night
    assert alice == (tmp_path / "outputs" / "nightly" / "alice" / "train").resolve()
    assert output_dir_path(spec, "train.py", tmp_path) == (tmp_path / "outputs" / "train").resolve()
    # a name with characters a folder cannot hold is still one folder level, never a path
    odd = output_dir_path(spec, "train.py", tmp_path, dag_id="a/../b", owner="../../etc")
    assert odd.parent.parent.parent == (tmp_path / "outputs").resolve()
