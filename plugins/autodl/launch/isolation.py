"""The local training's isolation: its command wrapped in bubblewrap namespaces, so it cannot read the worker.

Details: docs/security.md#autodllaunchisolation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from autodl.catalog import VendorInfo
from autodl.errors import LaunchError
from autodl.launch.devnodes import booked_nodes
from autodl.types import Device

ISOLATION_ENV = "AUTODL_LOCAL_ISOLATION"
"""Environment variable choosing the local training's isolation: ``auto``, ``bwrap`` or ``none``."""

MODES = ("auto", "bwrap", "none")

PRIVATE_TREES = ("/tmp", "/run", "/var/run", "/dev/shm")
"""Host folders replaced by private, empty ones: where the host's Unix sockets live (PostgreSQL's in ``/tmp`` or
``/run/postgresql``, Docker's in ``/run``)."""


IGNORE_STOP = "import os, signal, sys; [signal.signal(s, signal.SIG_IGN) for s in (2, 15)]; os.execv(sys.argv[1], sys.argv[1:])"
"""Shim run before ``bwrap``: it ignores SIGINT and SIGTERM (bubblewrap does not forward them and would die, taking
the training with it before it can checkpoint), then execs ``bwrap``. The training itself gets the launcher's
SIGTERM directly (:meth:`autodl.launch.local.LocalLauncher.stop` signals every process of the attempt)."""

RESTORE_STOP = "import os, signal, sys; [signal.signal(s, signal.SIG_DFL) for s in (2, 15)]; os.execvp(sys.argv[1], sys.argv[1:])"
"""Shim run inside the namespaces before the training: SIGINT and SIGTERM back to their default actions."""


class Isolation(BaseModel):
    """How a local training is wrapped.

    :ivar mode: ``bwrap`` or ``none``.
    :ivar prefix: the command put before the training's argv (empty for ``none``).
    :ivar note: why the training runs without isolation, or what its isolation assumed (device nodes not
        narrowed), for its log; None when fully isolated.
    """

    model_config = ConfigDict(frozen=True)

    mode: str
    prefix: list[str]
    note: str | None = None


def isolation_mode(environ: Mapping[str, str] | None = None) -> str:
    """``$AUTODL_LOCAL_ISOLATION`` (default ``auto``).

    :raises LaunchError: when it is set to something else than :data:`MODES`.
    """
    value = ((os.environ if environ is None else environ).get(ISOLATION_ENV) or "auto").strip().lower()
    if value not in MODES:
        raise LaunchError(f"{ISOLATION_ENV}={value!r} is not one of {', '.join(MODES)}; set it to 'auto' (bubblewrap "
                          "where available), 'bwrap' (required) or 'none'.")
    return value


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _hidden_files(protected: Sequence[Path], airflow_home: Path) -> list[Path]:
    """Files replaced by empty ones: protected files (a store's SQLite file) and Airflow's own files at the top of
    its home (``airflow.cfg``, ``webserver_config.py``, ``*.db``)."""
    from autodl.sandbox import PROTECTED_NAMES, PROTECTED_SUFFIXES

    out = [p for p in protected if p.is_file()]
    try:
        out += [p for p in airflow_home.iterdir() if p.is_file() and not p.is_symlink()
                and (p.name in PROTECTED_NAMES or p.name.lower().endswith(PROTECTED_SUFFIXES))]
    except OSError:
        pass
    return list(dict.fromkeys(out))


def bwrap_args(exe: str, *, run_folder: Path, workdir: Path, keep: Sequence[Path] = (),
               writable: Sequence[Path] = (), environ: Mapping[str, str] | None = None,
               device_nodes: Sequence[str] = (), dev: Path = Path("/dev"), read_only: Sequence[Path] = (),
               read_only_after: Sequence[Path] = ()) -> list[str]:
    """The ``bwrap ... --`` prefix of a local training (see the module docstring).

    :param run_folder: this run's folder (stays writable; with ``writable``, the only parts of autodl's home shown).
    :param writable: more folders bound back wherever they lie, autodl's home included (the run's output folder,
        ``$AUTODL_OUTPUT_DIR``: its checkpoints).
    :param device_nodes: accelerator nodes bound into the fresh ``/dev``, relative to it
        (:attr:`autodl.launch.devnodes.DeviceNodes.names`); ``dev/<name>`` is bound at ``/dev/<name>``.
    :param dev: the folder holding the host's nodes (``/dev``; a temporary folder in tests).
    :param read_only: folders bound read-only (:func:`import_paths`), except the working folder, which stays
        writable wherever it lies.
    :param read_only_after: folders bound back read-only after the writable ones (the run folder's ``status/``: the
        attempts' exit files, which only the runner wrapper outside the namespaces writes).
    :param workdir: the training's working folder (stays as the worker sees it).
    :param keep: more paths that must stay visible (the script's folder, the interpreter's prefix, autodl's
        start-up hook folder).
    """
    from autodl.sandbox import airflow_home, protected_paths

    protected = protected_paths(workdir, environ)
    af = airflow_home(environ)
    dirs = [p for p in protected if p.is_dir()]
    private = [Path(t) for t in PRIVATE_TREES]
    frozen = [p for p in dict.fromkeys(Path(x).resolve() for x in read_only) if p.is_dir() and p != Path("/")]
    args = [exe, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--cap-drop", "ALL",
            "--bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    for p in frozen:  # before any mask: a read-only view of the host's folder, masked again below
        if not _under(p, private):
            args += ["--ro-bind", str(p), str(p)]
    for name in device_nodes:
        args += ["--dev-bind", str(dev / name), f"/dev/{name}"]
    for tree in PRIVATE_TREES:
        if Path(tree).is_dir() and not Path(tree).is_symlink():
            args += ["--tmpfs", tree]
    for p in dict.fromkeys(Path(x).resolve() for x in keep):  # under a private tree: shown again
        if p.exists() and _under(p, private):
            args += ["--ro-bind" if _under(p, frozen) else "--bind", str(p), str(p)]
    for p in frozen:
        if _under(p, private):
            args += ["--ro-bind", str(p), str(p)]
    wd = Path(workdir).resolve()
    if wd.exists() and (_under(wd, private) or _under(wd, frozen)):
        args += ["--bind", str(wd), str(wd)]  # the training's own folder stays writable
    for d in dirs:  # last but the run's folders: nothing bound above shows autodl's or Airflow's state again
        args += ["--tmpfs", str(d)]
    for f in _hidden_files(protected, af):
        args += ["--ro-bind", "/dev/null", str(f)]
    args += _bound_back("--bind", (run_folder, *writable)) + _bound_back("--ro-bind", read_only_after)
    args += ["--chdir", str(workdir), "--"]
    return args


def _bound_back(how: str, folders: Sequence[Path]) -> list[str]:
    """``how`` (``--bind`` / ``--ro-bind``) of each existing folder at its own path, once each, in order."""
    out: list[str] = []
    for p in dict.fromkeys(Path(x).resolve() for x in folders):
        if p.is_dir():
            out += [how, str(p), str(p)]
    return out


def user_site_root(environ: Mapping[str, str] | None = None) -> Path:
    """The folder holding every Python version's user site of a process with ``environ``:
    ``$PYTHONUSERBASE/lib``, default ``$HOME/.local/lib`` (``site.USER_BASE``; the user site is
    ``<it>/pythonX.Y/site-packages``)."""
    env = os.environ if environ is None else environ
    base = env.get("PYTHONUSERBASE") or str(Path(env.get("HOME") or Path.home()) / ".local")
    return Path(base) / "lib"


def import_paths(extra: Sequence[Path] = (), environ: Mapping[str, str] | None = None) -> list[Path]:
    """Folders a later Python imports from (its ``sitecustomize``, ``usercustomize`` and ``.pth`` files run at
    start-up): ``/usr``, ``/etc`` (``ld.so.preload``), ``extra``, this interpreter's site-packages and every folder
    on its ``sys.path`` (autodl's own package and start-up hook, Airflow's DAG and plugin folders), and the user
    sites of this process and of ``environ`` (:func:`user_site_root`, created if missing, mode 0700, so that a
    training cannot create one with a ``.pth`` in it). Bound read-only into a local training's namespaces: what it
    plants there would run in the worker, in later profiles and in other tenants' trainings.

    A ``sys.path`` entry that does not exist (``lib/python311.zip`` in most builds) lies under the interpreter's
    prefix, which is bound read-only with it, so a training cannot create it either."""
    import site

    roots = {user_site_root(), user_site_root(environ)}
    for root in roots:
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            pass  # the worker cannot create it: nor can a training running as the worker's uid
    paths = [Path("/usr"), Path("/etc"), *extra, *roots, *map(Path, site.getsitepackages()),
             *(Path(p) for p in sys.path if p)]
    return [p for p in dict.fromkeys(x.resolve() for x in paths) if p.is_dir()]


@lru_cache(maxsize=4)
def _bwrap_works(exe: str) -> str | None:
    """None when a training's namespaces can be made here, else why not (checked once per process)."""
    try:
        r = subprocess.run([exe, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--cap-drop", "ALL", "--bind",
                            "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--", "/bin/true"],
                           capture_output=True, text=True, errors="replace", timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap ({exe}) could not be started: {exc}"
    if r.returncode != 0:
        why = (r.stderr or "").strip().splitlines()
        return f"bwrap ({exe}) cannot make the namespaces here ({why[-1] if why else f'exit {r.returncode}'})"
    return None


def training_isolation(*, run_folder: Path, workdir: Path, python: str = sys.executable, keep: Sequence[Path] = (),
                       writable: Sequence[Path] = (), environ: Mapping[str, str] | None = None,
                       devices: Sequence[Device] = (), vendor: VendorInfo | None = None, on_cpu: bool = False,
                       dev: Path = Path("/dev"), read_only: Sequence[Path] = (),
                       training_env: Mapping[str, str] | None = None,
                       read_only_after: Sequence[Path] = ()) -> Isolation:
    """How to wrap a local training here, by :func:`isolation_mode`.

    :param python: the interpreter that runs the signal shims (:data:`IGNORE_STOP`, :data:`RESTORE_STOP`).
    :param devices: the booked devices: only their nodes are bound (:func:`autodl.launch.devnodes.booked_nodes`);
        none (or ``on_cpu``) binds no accelerator's node.
    :param read_only: more folders the training's Pythons import from (its ``PYTHONPATH``), bound read-only with
        :func:`import_paths`.
    :param training_env: the training's environment: its user site (``HOME``, ``PYTHONUSERBASE``) is read-only too.

    :raises LaunchError: in mode ``bwrap`` when bubblewrap is missing or cannot make the namespaces here, or the
        booked devices' nodes cannot be narrowed.
    """
    mode = isolation_mode(environ)
    if mode == "none":
        return Isolation(mode="none", prefix=[], note=f"{ISOLATION_ENV}=none: the training runs without isolation "
                         "(it can read its ancestors' /proc/<pid>/environ and the worker's files)")
    from autodl.sandbox import bwrap_path

    exe = bwrap_path()
    why = "bubblewrap (bwrap) is not installed (Debian/Ubuntu package 'bubblewrap')" if exe is None else _bwrap_works(exe)
    if exe is None or why:  # no bwrap, or one that cannot make a sandbox here (why says which)
        if mode == "bwrap":
            raise LaunchError(f"{ISOLATION_ENV}=bwrap but {why}; install bubblewrap or set {ISOLATION_ENV}=auto.")
        return Isolation(mode="none", prefix=[], note=f"{why}: the training runs without isolation (it can read its "
                         "ancestors' /proc/<pid>/environ and the worker's files); use the Docker or Kubernetes launcher "
                         "for tenants that must not trust each other")
    nodes = booked_nodes(devices, vendor, on_cpu=on_cpu, strict=mode == "bwrap", dev=dev)
    wrapped = bwrap_args(exe, run_folder=run_folder, workdir=workdir, keep=keep, writable=writable, environ=environ,
                         device_nodes=nodes.names, dev=dev, read_only=import_paths([*read_only, *python_dirs()], training_env),
                         read_only_after=read_only_after)
    return Isolation(mode="bwrap", prefix=[python, "-c", IGNORE_STOP, *wrapped, python, "-c", RESTORE_STOP],
                     note=nodes.note)


def python_dirs() -> list[Path]:
    """The interpreter's prefix and the virtual environment: kept visible for the training."""
    return sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
                   Path(sys.executable).resolve().parent.parent})


__all__ = ["ISOLATION_ENV", "Isolation", "bwrap_args", "import_paths", "isolation_mode", "python_dirs",
           "training_isolation"]
