"""A security review's inputs (issue 13, helper sectest), each through the CLI with its right behaviour.

Written after the fuzzer's cases (tests/core/test_bad_input.py), in forms it did not use. What the unfixed CLI
did with each is in its test id or docstring: container options that hand the training the host (``network:
host``, ``devices: [/dev/sda]``, mounts of ``/proc``, ``/etc``, of a folder holding PostgreSQL's socket, of
AUTODL_HOME or the store's database, gid 0), pool entries the NVIDIA runtime reads as *all* devices, a terminal
escape in a pool's host name, YAML 1.1 octal numbers, scripts in a declared encoding, a model name too long for
a folder name (an internal error), and pieces of the store's password in a driver's error message. The inputs
are in tests/cases/bad-input/st_*; the ones that depend on this machine's paths are written by the tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.core.test_bad_input import cases, plan, run  # noqa: F401 - the same case folder (fixture) and CLI runner

SPEC_CASES = [
    pytest.param("st_spec_network_host.yaml", ["launcher.network", "host"], id="network-host-was-accepted"),
    pytest.param("st_spec_network_container.yaml", ["launcher.network", "container:"],
                 id="network-of-another-container-was-accepted"),
    pytest.param("st_spec_device_disk.yaml", ["launcher.devices", "/dev/sda", "not an accelerator"],
                 id="device-dev-sda-rwm-was-accepted"),
    pytest.param("st_spec_device_mem_renamed.yaml", ["launcher.devices", "/dev/mem"],
                 id="dev-mem-mapped-to-dev-kfd-was-accepted"),
    pytest.param("st_spec_mount_proc.yaml", ["launcher.mounts.0.source", "/proc"], id="mount-proc-was-accepted"),
    pytest.param("st_spec_mount_etc.yaml", ["launcher.mounts.0.source", "/etc"], id="mount-etc-ssl-was-accepted"),
    pytest.param("st_spec_mount_colon.yaml", ["launcher.mounts.0.source", "':'"],
                 id="colon-in-mount-source-was-passed-to-docker-binds"),
    pytest.param("st_spec_user_root_group.yaml", ["launcher.user", "gid 0"], id="user-65534-0-was-accepted"),
    pytest.param("st_spec_pod_root_group.yaml", ["launcher.user", "gid 0"],
                 id="pod-runAsGroup-0-fsGroup-0-was-rendered"),
    pytest.param("st_spec_pod_kube_system.yaml", ["launcher.namespace", "kube-system"],
                 id="pod-in-kube-system-was-accepted"),
    pytest.param("st_spec_image_flags.yaml", ["launcher.image", "not an image reference"],
                 id="image-with-spaces-and-flags-was-accepted"),
    pytest.param("st_spec_octal_batch.yaml", ["st_spec_octal_batch.yaml:1", "task.batch_size_per_gpu", "511", "777"],
                 id="batch-0777-was-silently-511"),
    pytest.param("st_spec_long_model_name.yaml", ["task.model_name", "200"],
                 id="300-char-model-name-was-internal-error-ENAMETOOLONG"),
]


@pytest.mark.parametrize("name, needles", SPEC_CASES)
def test_spec_cases_are_refused_naming_the_field(cases, capsys, name, needles):
    code, out, err = plan(capsys, name)
    assert code == 2, (out, err)
    for needle in needles:
        assert needle in err, (needle, err)


POOL_CASES = [
    pytest.param("st_pool_uuid_all.yaml", ["devices.0.uuid", "'all'"],
                 id="uuid-all-was-accepted-NVIDIA_VISIBLE_DEVICES-all"),
    pytest.param("st_pool_uuid_list.yaml", ["devices.0.uuid", "GPU-aaaa,GPU-bbbb"], id="uuid-list-was-accepted"),
    pytest.param("st_pool_host_escape.yaml", ["field 'host'", "not a host name"],
                 id="terminal-escape-in-host-was-printed-raw"),
    pytest.param("st_pool_octal_index.yaml", ["st_pool_octal_index.yaml:3", "devices[0].index", "octal"],
                 id="index-010-was-silently-8"),
    pytest.param("st_pool_healthy_text.yaml", ["devices.0.healthy", "boolean"], id="healthy-string-was-a-bool"),
]


@pytest.mark.parametrize("name, needles", POOL_CASES)
def test_pool_cases_are_refused_naming_the_field(cases, capsys, name, needles):
    code, out, err = run(capsys, "inventory", "--pool", name)
    assert code == 5, (out, err)
    for needle in needles:
        assert needle in err, (needle, err)
    assert "\x1b" not in err  # an escape in the file is shown escaped, never sent to the terminal


def test_a_script_in_a_declared_encoding_is_read_as_python_reads_it(cases, capsys):
    """Seen: a latin-1 script with ``# -*- coding: latin-1 -*-`` (Python runs it) was refused as "not UTF-8"."""
    code, out, err = run(capsys, "profile", "st_s_latin1_cookie.py", "--no-probe", "--json")
    assert code == 0, err
    out = json.loads(out)
    assert out["model_name"] == "Net" and out["params"] is None  # read (the model class found), unmeasured


@pytest.mark.parametrize("name, needle", [
    pytest.param("st_s_unknown_cookie.py", "unknown encoding", id="unknown-codec-was-accepted"),
    pytest.param("st_s_rot13_cookie.py", "not a text encoding", id="rot13-codec-was-accepted"),
])
def test_a_script_python_cannot_decode_is_refused(cases, capsys, name, needle):
    """Seen: accepted (profiled as if UTF-8); ``python script.py`` refuses both."""
    code, out, err = run(capsys, "profile", name, "--no-probe")
    assert code == 3 and needle in err and name in err, err


def test_a_script_of_too_many_tokens_is_refused_before_python_parses_it(cases, capsys):
    """Seen: a 4 MB script of 2,000,000 list elements took the CLI (an Airflow worker) to 2 GB of memory in
    ``compile`` and ``ast.parse``. Now more than MAX_SCRIPT_TOKENS tokens is an error before the parser runs."""
    from autodl.inputs import MAX_SCRIPT_TOKENS

    body = "0," * (MAX_SCRIPT_TOKENS // 2 + 10)
    Path("st_many_tokens.py").write_text(f"import paddle.nn as nn\nT = [{body}]\nmodel = nn.Linear(4, 4)\n")
    code, out, err = run(capsys, "profile", "st_many_tokens.py", "--no-probe")
    assert code == 3 and "tokens" in err and f"{MAX_SCRIPT_TOKENS:,}" in err, err


def test_a_large_but_bounded_script_is_still_profiled(cases, capsys):
    """The token bound leaves room: 100,000 tokens of constants are analysed."""
    body = "1," * 50_000
    Path("st_big_ok.py").write_text("import paddle.nn as nn\nT = [" + body + "]\nmodel = nn.Linear(4, 4)\n")
    code, out, err = run(capsys, "profile", "st_big_ok.py", "--no-probe", "--json")
    assert code == 0 and json.loads(out)["model_name"] == "Linear", err


def _mount_spec(folder: Path, source: str) -> str:
    (folder / "st_mount.yaml").write_text("task: {script: model.py, input_shape: [32]}\n"
                                          f"launcher: {{type: docker, mounts: [{{source: {json.dumps(source)}, target: /d}}]}}\n")
    return "st_mount.yaml"


def test_a_plain_data_folder_is_still_mounted(cases, capsys, tmp_path):
    data = tmp_path / "datasets"
    data.mkdir()
    code, out, err = plan(capsys, _mount_spec(cases, str(data)), "--json")
    assert code == 0, err
    volumes = json.loads(out)["launch"]["create_kwargs"]["volumes"]
    assert volumes[str(data)] == {"bind": "/d", "mode": "ro"}


@pytest.mark.parametrize("node", ["/dev/kfd", "/dev/dri", "/dev/dri/renderD128", "/dev/davinci3", "/dev/xpuctrl",
                                  "/dev/kfd:/dev/kfd:rw"])
def test_accelerator_device_nodes_pass(cases, capsys, node):
    Path("st_dev.yaml").write_text("task: {script: model.py, input_shape: [32]}\n"
                                   f"launcher: {{type: docker, devices: [{json.dumps(node)}]}}\n")
    code, out, err = plan(capsys, "st_dev.yaml")
    assert code == 0, err


def test_every_node_of_the_vendor_table_is_an_accelerator_node():
    """The allow-list of launcher.devices and include/catalog/vendors.yaml stay in step."""
    from autodl.catalog import load_catalog
    from autodl.launch.mounts import check_device_node

    for vendor in load_catalog().vendors.values():
        for node in [*vendor.docker_shared_device_nodes, *(n.format(index=7) for n in vendor.docker_device_nodes)]:
            check_device_node(node)


@pytest.mark.parametrize("user", ["65534:65534", "1000:1000", "1000"])
def test_non_root_users_and_groups_pass(cases, capsys, user):
    Path("st_user.yaml").write_text("task: {script: model.py, input_shape: [32]}\n"
                                    f"launcher: {{type: kubernetes, user: '{user}'}}\n")
    code, out, err = plan(capsys, "st_user.yaml", "--json")
    assert code == 0, err
    sc = json.loads(out)["launch"]["pod"]["spec"]["securityContext"]
    assert sc["runAsUser"] != 0 and sc.get("runAsGroup") != 0 and sc.get("fsGroup") != 0


@pytest.mark.parametrize("url, pieces", [
    pytest.param("postgresql+psycopg2://autodl:p@ss-s3cr3t-X1@1@127.0.0.1:1/x", ["ss-s3cr3t-X1", "s3cr3t"],
                 id="raw-at-psycopg2-quoted-ss-SECRET@1@host"),
    pytest.param("postgresql+psycopg2://autodl:pw s3cr3t/X2@127.0.0.1:1/x", ["s3cr3t/X2", "s3cr3t"],
                 id="space-and-slash-in-password-was-printed-whole"),
])
def test_no_piece_of_the_store_password_is_printed(cases, capsys, monkeypatch, url, pieces):
    monkeypatch.setenv("AUTODL_STORE_URL", url)
    for argv in (["leases"], ["leases", "--json"], ["runs"], ["leases", "--release", "k"]):
        code, out, err = run(capsys, *argv)
        assert code == 9, err
        for piece in pieces:
            assert piece not in out + err, (argv, err)


def test_a_docker_line_keeps_its_run_key_label(cases, capsys):
    """Seen: ``autodl plan`` showed ``--label autodl.run_key=***`` (``run_key`` looked like a secret's name)."""
    Path("st_d.yaml").write_text("task: {script: model.py, input_shape: [32]}\nlauncher: {type: docker}\n")
    code, out, err = plan(capsys, "st_d.yaml", "--json")
    assert code == 0, err
    assert "--label autodl.run_key=plan" in json.loads(out)["launch"]["shell"]


def test_model_names_that_differ_only_in_replaced_characters_get_different_output_folders(tmp_path):
    """Seen: ``a/b`` and ``a_b`` (and ``a b``) shared ``$AUTODL_HOME/outputs/a_b``: one model's nightly run would
    resume from the other's checkpoint. Safe short names keep their folder name (existing outputs stay found)."""
    from autodl.spec import output_dir_name

    names = ["a/b", "a_b", "a b", "a\\b", "..", "model", "é", "e", "x" * 300, "x" * 301]
    folders = [output_dir_name(n) for n in names]
    assert len(set(folders)) == len(names)
    assert output_dir_name("a_b") == "a_b" and output_dir_name("simple_cnn") == "simple_cnn"
    assert all(len(f.encode()) <= 100 and "/" not in f and not f.startswith(".") for f in folders)


@pytest.mark.parametrize("text", ["a: 0777", "a: -010", "a: 0_7"])
def test_yaml_1_1_octal_numbers_are_refused(text):
    """YAML 1.1 reads ``0777`` as 511, YAML 1.2 (Kubernetes, most other tools) as 777: refused, never guessed."""
    from autodl.errors import SpecError
    from autodl.inputs import parse_yaml

    with pytest.raises(SpecError, match="starts with 0"):
        parse_yaml(text, SpecError, "f.yaml")
    assert parse_yaml("a: 0x1f\nb: 0\nc: '0777'", SpecError, "f.yaml") == {"a": 31, "b": 0, "c": "0777"}
