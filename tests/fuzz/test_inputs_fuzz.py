"""Property-based fuzzing of every input path (issue 13): specs, pool files and scripts.

Every generated input must end in a clear :class:`~autodl.errors.AutoDLError` of the right kind (or, through
the CLI, its documented exit code and a one-line message), or in a valid result — never a traceback, a hang
or a wrong acceptance. "Valid" is checked against oracles written independently of the code under test:
numbers finite and in range and never booleans, no uid 0, no mount holding the Docker socket, scripts Python
itself would compile, a plain ``nn.Linear(a, b)`` counted as ``a*b + b`` parameters.

Deterministic (``derandomize=True``, no example database) so CI is stable; no deadlines (tests never time
anything). At least 1,000 cases per run: see :data:`EXAMPLES`.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from autodl.catalog import load_catalog
from autodl.errors import AutoDLError, InventoryError, LaunchError, ProfileError, SpecError
from autodl.inventory.declared import read_pool_file
from autodl.launch.mounts import check_host_paths
from autodl.spec import TaskSpec, load_spec
from tests.fuzz import strategies as S

pytestmark = pytest.mark.fuzz

EXAMPLES = {"spec": 500, "pool": 300, "script": 400, "cli": 100}
"""Cases per property and run: with the Linear property (100) and the paths one (60), 1,460 in all (the issue
asks for at least 1,000)."""

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                       HealthCheck.large_base_example])

CASES = Path(__file__).resolve().parents[1] / "cases" / "bad-input"
SOCKET_DIRS = ("/var/run/docker.sock", "/run/docker.sock")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with the scripts the specs name (model.py) and the pool the CLI plans on."""
    folder = tmp_path_factory.mktemp("fuzz")
    for name in ("model.py", "cnn.py", "pool4.yaml"):
        shutil.copy(CASES / name, folder / name)
    return folder


def finite_numbers(value, path="") -> None:
    """Assert every number in a JSON-like value is finite and no boolean sits where a number was meant."""
    if isinstance(value, float):
        assert math.isfinite(value), f"{path}: {value}"
    elif isinstance(value, dict):
        for k, v in value.items():
            finite_numbers(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            finite_numbers(v, f"{path}[{i}]")


def holds_engine_socket(source: str, *, here: bool = True) -> bool:
    """Independent oracle: the mount source, normalised (and with ``here``, resolved on this host), is or contains
    the Docker socket."""
    name = "/" + posixpath.normpath(source).lstrip("/")
    names = {name, os.path.realpath(name)} if here else {name}
    return any(n == "/" or sock == n or sock.startswith(n.rstrip("/") + "/") or n.endswith("docker.sock")
               for n in names for sock in SOCKET_DIRS)


HOST_TREES = ("/proc", "/sys", "/dev", "/etc", "/root", "/var/lib/docker", "/run", "/var/run")
"""Independent oracle (sectest): host folders a mount must never be, lie in or hold."""

ACCELERATOR = re.compile(r"/dev/(kfd|dri(/(card|renderD)\d+)?|davinci\d+|davinci_manager|devmm_svm|hisi_hdc|xpu\d+|xpuctrl"
                         r"|nvidia\d+|nvidiactl|nvidia-uvm(-tools)?|nvidia-modeset)")
"""Independent oracle (sectest): the device nodes of accelerators, the only ones a container may be given."""


def mount_gives_the_host(source: str, *, here: bool = True) -> bool:
    name = "/" + posixpath.normpath(source).lstrip("/")
    names = {name, os.path.realpath(name)} if here else {name}
    return any(n == "/" or n == t or n.startswith(t + "/") or t.startswith(n.rstrip("/") + "/")
               for n in names for t in HOST_TREES) or any(c in source for c in ":,")


def check_valid_spec(spec: TaskSpec) -> None:
    dump = spec.model_dump(mode="json")
    json.dumps(dump, allow_nan=False)
    finite_numbers(dump)
    task, launcher = spec.task, spec.launcher
    for name in ("batch_size_per_gpu", "sequence_length"):
        value = getattr(task, name)
        assert value is None or (type(value) is int and 0 < value <= 1 << 30), (name, value)
    assert task.num_gpus_estimate == "auto" or type(task.num_gpus_estimate) is int and task.num_gpus_estimate >= 1
    assert all(type(d) is int and d > 0 for d in task.input_shape or [])
    assert 0 < spec.resource_policy.memory_threshold <= 1
    assert all(type(v) in (int, float) and math.isfinite(v) for v in spec.resource_policy.tag_priorities.values())
    user = getattr(launcher, "user", "1000")  # the container launchers' field (local runs as the worker's user)
    uid = user.split(":")[0]
    assert uid.isascii() and uid.isdigit() and int(uid) != 0, user
    gid = user.split(":")[1] if ":" in user else None
    assert gid is None or int(gid) != 0, user
    for mount in getattr(launcher, "mounts", []):  # the spec checks the path by name; the launcher, on its host
        assert not holds_engine_socket(mount.source, here=False), mount.source
        assert not mount_gives_the_host(mount.source, here=False), mount.source
        if holds_engine_socket(mount.source) or mount_gives_the_host(mount.source):
            with pytest.raises(SpecError, match=r"field 'launcher.mounts.0.source'"):
                check_host_paths([mount], [], "fuzz")
    net = (getattr(launcher, "network", None) or "").strip().lower()
    assert net != "host" and not net.startswith("container:"), net
    for dev in getattr(launcher, "devices", []):
        host = dev.split(":")[0]
        assert ACCELERATOR.fullmatch("/" + posixpath.normpath(host).lstrip("/")), dev
    for size in (getattr(launcher, "shm_size", None), getattr(launcher, "memory_limit", None)):
        assert size is None or (type(size) is int and 0 < size <= 1 << 50)
    cpus = getattr(launcher, "cpus", None)
    assert cpus is None or (0 < cpus <= 8192)


def outcome(exc: Exception) -> str:
    """A coarse label of an error message for Hypothesis' statistics (``--hypothesis-show-statistics``)."""
    text = str(exc)
    for label in ("binary", "not UTF-8", "duplicate key", "tag", "too large", "finite", "more than", "nest",
                  "unknown key", "syntax error", "symlink", "too long", "not valid YAML", "launcher.user",
                  "socket", "field"):
        if label in text:
            return label
    return "other"


def write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


@settings(FUZZ, max_examples=EXAMPLES["spec"])
@given(data=S.spec_bytes())
def test_specs_end_in_a_spec_error_or_a_valid_spec(workdir, data):
    path = write(workdir, "spec.yaml", data)
    try:
        spec = load_spec(path)
    except SpecError as exc:
        assert str(exc) and len(str(exc)) < 4000 and "Traceback" not in str(exc)
        event(f"SpecError: {outcome(exc)}")
        return
    check_valid_spec(spec)
    event("valid spec")
    # a valid spec renders for every launcher, or refuses with a LaunchError; never uid 0 in a pod
    from autodl.launch import LaunchRequest, get_launcher

    code = workdir / "model.py"
    request = LaunchRequest(run_key="fuzz", script=str(code), on_cpu=True, vendor=load_catalog().vendor("nvidia"),
                            options=spec.launcher.model_dump(exclude={"type"}))
    for name in ("local", "docker", "kubernetes"):
        try:
            rendered = get_launcher(name).render(request)
        except LaunchError:
            continue
        json.dumps(rendered, allow_nan=False, default=str)
        if name == "kubernetes":
            assert rendered["pod"]["spec"]["securityContext"]["runAsUser"] != 0


@settings(FUZZ, max_examples=EXAMPLES["pool"])
@given(data=S.pool_bytes())
def test_pool_files_end_in_an_inventory_error_or_a_valid_inventory(workdir, data):
    path = write(workdir, "pool.yaml", data)
    try:
        inventory = read_pool_file(path, load_catalog())
    except InventoryError as exc:
        assert str(exc) and len(str(exc)) < 4000
        event(f"InventoryError: {outcome(exc)}")
        return
    event("valid inventory")
    dump = inventory.to_json()
    json.dumps(dump, allow_nan=False)
    finite_numbers(dump)
    assert inventory.devices
    for d in inventory.devices:
        assert type(d.index) is int and d.index >= 0
        assert type(d.memory_total_bytes) is int and 0 < d.memory_total_bytes <= 1 << 42
        assert type(d.memory_used_bytes) is int and 0 <= d.memory_used_bytes <= d.memory_total_bytes
        assert 0 <= d.utilization_pct <= 100 and type(d.healthy) is bool


def python_compiles(source: bytes) -> bool:
    try:
        text = source.decode("utf-8-sig")  # Python reads a UTF-8 byte order mark as such
        compile(text, "x.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, UnicodeDecodeError, OverflowError):
        return False
    return b"\x00" not in source


def profile(path: Path):
    """What `autodl profile SCRIPT --no-probe` does, in-process: resolve the script, static analysis only."""
    from autodl.profile import profile_script

    spec = TaskSpec()
    return profile_script(spec.script_path(str(path)), spec, catalog=load_catalog(), probe=False)


def check_profile(prof) -> None:
    dump = prof.to_json()
    json.dumps(dump, allow_nan=False)
    finite_numbers(dump)
    if prof.params is None:  # unknown, never 0: only when the model was not found, and a warning says so
        assert prof.method == "cold_start" and prof.trainable_params is None
        assert any(f.code == "cold-start" and "parameters are unknown" in f.message for f in prof.findings)
    else:
        assert prof.params >= 0 and prof.trainable_params >= 0
    assert prof.peak_memory_bytes > 0
    if prof.flops_per_step is None:   # unknown with the parameter count, never 0
        assert prof.params is None
    else:
        assert prof.flops_per_step >= 0
    assert prof.batch_size > 0 and prof.num_gpus >= 1
    assert all(v >= 0 for v in prof.breakdown.model_dump().values())


@settings(FUZZ, max_examples=EXAMPLES["script"])
@given(data=S.script_bytes())
def test_scripts_end_in_a_profile_error_or_a_valid_profile(workdir, data):
    path = write(workdir, "train.py", data)
    compiles = python_compiles(data)
    try:
        prof = profile(path)
    except (ProfileError, SpecError) as exc:
        assert str(exc) and len(str(exc)) < 4000
        assert not compiles or "nested" in str(exc), f"Python compiles it, but autodl refused: {exc}"
        event(f"{type(exc).__name__}: {outcome(exc)}")
        return
    assert compiles, "accepted a script Python would not compile"
    check_profile(prof)
    event(f"profile ({prof.method}{', error finding' if prof.errors else ''})")


@settings(FUZZ, max_examples=EXAMPLES["script"] // 4)
@given(case=S.linear_script())
def test_a_plain_linear_model_is_unknown_not_taken_as_zero(workdir, case):
    """s_huge_linear.py (``model = nn.Linear(1000000, 1000000)``) was "0 params, fits in 1.38 GiB": unmeasured, its
    size is unknown (null), never 0 (the dry run measures it: tests/core/test_bad_input.py)."""
    source, known = case
    path = write(workdir, "linear.py", source.encode())
    try:
        prof = profile(path)
    except ProfileError:
        return
    check_profile(prof)
    if known is not None and not prof.errors:
        assert prof.params is None and prof.method == "cold_start", (known, prof.params)


@settings(FUZZ, max_examples=EXAMPLES["cli"],
          suppress_health_check=[*FUZZ.suppress_health_check, HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["plan", "profile", "inventory"]), spec=S.spec_bytes(), script=S.script_bytes(),
       pool=S.pool_bytes())
def test_the_cli_answers_every_input_with_a_documented_exit_code(workdir, capsys, kind, spec, script, pool):
    """`autodl plan|profile|inventory` as a user runs them: exit codes 0/2/3/4/5/7/8 and a one-line message;
    never 1 (an internal error) nor a traceback."""
    from autodl.cli import main

    write(workdir, "spec.yaml", spec)
    write(workdir, "train.py", script)
    write(workdir, "pool.yaml", pool)
    old = os.getcwd()
    os.chdir(workdir)
    try:
        if kind == "plan":
            code = main(["plan", "spec.yaml", "--pool", "pool4.yaml", "--no-probe", "--json"])
        elif kind == "profile":
            code = main(["profile", "train.py", "--no-probe", "--json"])
        else:
            code = main(["inventory", "--pool", "pool.yaml", "--json"])
    finally:
        os.chdir(old)
    out, err = capsys.readouterr()
    event(f"{kind}: exit {code}")
    assert "Traceback" not in out + err and "internal error" not in err, err
    assert code in (0, 2, 3, 4, 5, 7, 8), (code, err)
    if code in (0, 3, 4) and out:
        json.loads(out, parse_constant=lambda c: pytest.fail(f"--json printed {c}"))
    if code not in (0, 3, 4):
        assert err.startswith("autodl: error: ") and out == ""


def test_every_error_kind_is_an_autodl_error():
    assert all(issubclass(e, AutoDLError) for e in (SpecError, InventoryError, ProfileError, LaunchError))


PATH_KINDS = ["long-name", "long-path", "loop", "dangling", "folder", "fifo", "empty", "dot", "text", "ok"]


def make_path(workdir: Path, kind: str, name: str) -> str:
    """A path of the given kind under ``workdir`` (created on the fly)."""
    base = workdir / "paths"
    base.mkdir(exist_ok=True)
    safe = "".join(c for c in name if c not in "/\x00") or "x"
    if kind == "long-name":
        return str(base / (safe * 300)[:300])
    if kind == "long-path":
        return str(base / "/".join([safe[:10] or "d"] * 600))
    if kind == "loop":
        a, b = base / "loop_a", base / "loop_b"
        for p, target in ((a, b), (b, a)):
            if not p.is_symlink():
                p.symlink_to(target)
        return str(a)
    if kind == "dangling":
        link = base / "dangling"
        if not link.is_symlink():
            link.symlink_to(base / "nowhere")
        return str(link)
    if kind == "folder":
        return str(base)
    if kind == "fifo":
        fifo = base / "fifo"
        if not fifo.exists():
            os.mkfifo(fifo)
        return str(fifo)
    if kind == "empty":
        (base / "empty").write_bytes(b"")
        return str(base / "empty")
    if kind == "dot":
        return "."
    if kind == "text":
        return str(base / safe[:200])
    return str(workdir / "pool4.yaml")


@settings(FUZZ, max_examples=60)
@given(kind=st.sampled_from(PATH_KINDS), name=st.text(max_size=30),
       use=st.sampled_from(["spec", "pool", "script", "catalog"]))
def test_any_path_is_read_or_refused_clearly(workdir, kind, name, use):
    """Long names, symlink loops, folders and FIFOs (reading one would block forever) as every kind of input."""
    from autodl.catalog import _load_cached
    from autodl.errors import CatalogError

    path = make_path(workdir, kind, name)
    try:
        if use == "spec":
            load_spec(path)
        elif use == "pool":
            read_pool_file(path, load_catalog())
        elif use == "script":
            profile(Path(path))
        else:
            _load_cached(path, path)
    except (SpecError, InventoryError, ProfileError, CatalogError) as exc:
        assert len(str(exc)) < 1000
        event(f"{use}: {outcome(exc)}")
        return
    event(f"{use}: read")
