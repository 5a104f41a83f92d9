"""The dry run: run the user's training script itself in the sandbox for a few optimizer steps and measure each phase.

Details: docs/reference/estimator.md#autodlprofiledryrun.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from autodl.profile.dryrun_report import dryrun_report
from autodl.profile.memory import TRAINING_FLOPS_FACTOR
from autodl.profile.probe import REPORT_MAX_BYTES, report_text
from autodl.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    Staged,
    protected_paths,
    read_output,
    run_sandboxed,
    stage_tree,
    why_protected,
)
from autodl.types import Finding, PhasePeak

CHILD = Path(__file__).with_name("dryrun_child")
"""The dry-run child's package folder, run by path (``python dryrun_child CONFIG``: its ``__main__.py``)."""

FLOPS_COUNTER = Path(__file__).with_name("_flops.py")
"""The FLOPs counter the child loads from next to its folder (shared with the probe child)."""


def child_files() -> dict[str, Path]:
    """The child's own files, relative to the folder that holds :data:`CHILD`: its modules and the FLOPs counter
    (no ``__pycache__``: exactly what a container or pod must carry)."""
    files = {f"{CHILD.name}/{p.name}": p for p in sorted(CHILD.glob("*.py"))}
    files[FLOPS_COUNTER.name] = FLOPS_COUNTER
    return files

DRY_RUN_TIMEOUT_S = 150.0
"""Hard wall-clock limit of one dry run (env ``AUTODL_DRYRUN_TIMEOUT_S``); the tree is killed after it."""

DRY_RUN_BUDGET_S = 40.0
"""Soft budget for the measured steps (env ``AUTODL_DRYRUN_BUDGET_S``): the child picks batch sizes so that the
steps it still needs end within it, and stops measuring once it is spent. With Paddle's import (~2-5 s) and the
script's own set-up this keeps the profile near 60 s on two CPU cores."""

DRY_RUN_ADDRESS_SPACE_BYTES = 12 << 30
"""RLIMIT_AS of the dry run (env ``AUTODL_PROBE_MEMORY_BYTES`` overrides): Paddle's CPU import reserves ~0.75 GiB
of address space (measured, VmPeak), the rest is for the script's data and the measured steps."""

DRY_RUN_TENSOR_BUDGET_BYTES = 3 << 30
"""Allocator bytes the child lets a step reach when it chooses the large batch (well inside the address space)."""

NATIVE_STEP_FLOPS = 1.5e11
"""Training FLOPs under which the script runs at its own batch from the start (~3-5 s per step at the 30-50 GFLOPS
oneDNN fp32 reaches on two cores, measured on the benchmark models); above it the child starts small."""

NATIVE_STEP_ACT_BYTES = 2 << 30
"""Activation bytes under which the script runs at its own batch from the start."""

DRY_RUN_DISK_BYTES = SandboxLimits.disk_bytes
"""Bytes the dry run may put into its working folder (env ``AUTODL_DRYRUN_DISK_BYTES``): the sandbox's own bound
(1 GiB, :class:`autodl.sandbox.SandboxLimits`), also the largest single file (``RLIMIT_FSIZE``). Checkpoints, logs
and outputs the script writes during its measured steps count against it (they land in the working folder: its
relative paths and ``AUTODL_OUTPUT_DIR`` point there); a script that writes more is stopped -- the dry run's
limit, not the script's error: what was measured before is kept, else the profile falls back."""

OUT_DIR = ".autodl-dryrun"
"""Folder (inside the working folder) where the child writes ``result.json`` and ``alloc_events.json``."""


class DryRunConfig(BaseModel):
    """What the parent tells the dry-run child (``CFG`` in :mod:`autodl.profile.dryrun_child.state`, written as JSON):
    every default is here once; the child reads each key as given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    script: str = Field(description="the training script's path where the child runs")
    result: str = Field(default="", description="the report file's path where the child runs (set by the venue)")
    argv: list[str] = Field(default_factory=list, description="the script's arguments (task.args)")
    user_dirs: list[str] = Field(default_factory=list, description="folders whose files are the user's code")
    target_batch: int | None = Field(default=None, description="the spec's batch the estimate is for")
    lo: int | None = Field(default=None, description="the small batch the schedule starts from (None: the script's)")
    budget_s: float = Field(default=DRY_RUN_BUDGET_S, description="soft budget of the measured steps (s)")
    mem_budget_bytes: int = Field(default=DRY_RUN_TENSOR_BUDGET_BYTES,
                                  description="allocator bytes a step may reach at the large batch")
    eval_expected: bool = Field(default=False, description="the script has an evaluation pass: wait for it")
    native_batches: list[int] = Field(default_factory=list, description="the batches the script is known to use")
    reduce: bool = Field(default=True, description="the child may reduce the script's batch")
    record_allocations: bool = Field(default=False, description="record the allocator's events for the replay")
    max_eval_batches: int = Field(default=2, description="evaluation batches measured per call")
    max_extra_steps: int = Field(default=6, description="training steps run after measuring, waiting for an eval")
    max_eval_calls: int = Field(default=4, description="evaluation calls measured before the run ends")
    container: dict[str, Any] | None = Field(
        default=None, description="the container entry's section (autodl.profile.container.container_config)")


def disk_bound() -> int:
    """:data:`DRY_RUN_DISK_BYTES`, or ``$AUTODL_DRYRUN_DISK_BYTES`` when it is a positive integer."""
    try:
        v = int(os.environ.get("AUTODL_DRYRUN_DISK_BYTES") or 0)
    except ValueError:
        v = 0
    return v if v > 0 else DRY_RUN_DISK_BYTES


MAX_STAGED_FILES = 256
"""Files of the script's folder copied into the dry run's working directory (read-only there), so that relative
paths the script reads (configs, small data files) resolve as they do when the launcher runs it there."""

MAX_STAGED_BYTES = 256 << 20
"""Bytes of the script's folder copied, together (256 MiB: code, configs and a small sample of data; a data set
is named in ``task.args`` instead and mounted read-only, see :func:`arg_paths`)."""

MIRROR_DEPTH = 3
"""Deepest sub-folder of the script's folder copied (as a real, writable folder holding read-only copies)."""

ENV_ERRORS = {
    "FileNotFoundError": "a file it reads is not here (the dry run runs the script in a copy of its own folder, "
                         "its working folder: a relative path is read from there, and a path above it "
                         "is not shown; besides, it sees the existing absolute paths named in task.args: name the "
                         "data there by its absolute path)",
    "NotADirectoryError": "a path it reads is not here",
    "IsADirectoryError": "a path it reads is not here",
    "PermissionError": "it writes outside its working directory",
    "ConnectionError": "it uses the network",
    "ConnectionRefusedError": "it uses the network",
    "ConnectionResetError": "it uses the network",
    "TimeoutError": "it uses the network",
    "gaierror": "it uses the network",
    "URLError": "it downloads",
    "HTTPError": "it downloads",
    "SSLError": "it uses the network",
    "ProxyError": "it uses the network",
    "ReadTimeout": "it uses the network",
    "ConnectTimeout": "it uses the network",
    "ModuleNotFoundError": "it imports a package that is not installed here",
    "ImportError": "it imports something that is not installed here",
    "MemoryError": "it ran out of the dry run's memory limit",
    "KeyboardInterrupt": "it was interrupted",
}
"""Exception types that mean "cannot run here", not "the script is wrong" (the sandbox has no network, sees only the
script's folder, has no GPU and a memory cap)."""

ENV_PATTERNS = [
    (re.compile(r"\bCUDA|\bcuda\b|\bGPU\b|\bgpu\b|cu[dD][nN][nN]|not compiled with|CUDAPlace|\bXPU\b|\bNPU\b"),
     "it needs a GPU (the dry run is CPU only)"),
    (re.compile(r"out of memory|bad_alloc|ResourceExhausted|Cannot allocate memory|MemoryError", re.I),
     "it ran out of the dry run's memory limit"),
    (re.compile(r"kernel .*not registered|not registered .*kernel|float16.*CPU|CPU.*float16|bfloat16", re.I),
     "it uses an operation Paddle has no CPU kernel for"),
    (re.compile(r"Network is unreachable|Name or service not known|Temporary failure in name resolution|"
                r"download", re.I), "it downloads"),
    (re.compile(r"Read-only file system|Errno 30|Errno 13", re.I), "it writes outside its working directory"),
    # Paddle's own "file not found" is a ValueError (paddle.jit.load, paddle.load, set_state_dict from a path):
    # the dry run shows the script only its own folder, so a path elsewhere is missing here, not in the run
    (re.compile(r"\b(path|file|dir|directory|model|checkpoint)\b[^\n]{0,300}?\b(not exists?|does not exist|doesn't "
                r"exist|not found)\b|No such file or directory", re.I),
     "a file it reads is not here (the dry run shows the script only its own folder and the existing paths named "
     "in task.args)"),
]


@dataclass
class DryRun:
    """What the dry run measured, extrapolated to the run's batch (bytes, FLOPs, seconds), or why it could not.

    :ivar outcome: see the module docstring.
    :ivar reason: one sentence for the profile's finding (why this path, or why not).
    :ivar tensor_peak_bytes: the largest phase peak (train at ``batch``, eval at its own batch).
    :ivar train_peak_bytes: the training step's peak at ``batch``.
    :ivar act_bytes_per_sample: slope of the training step's peak in the batch (bytes per sample).
    """

    outcome: str
    reason: str
    seconds: float
    batch: int | None = None
    params: int | None = None
    trainable: int | None = None
    optimizer: str | None = None
    tensor_peak_bytes: int | None = None
    train_peak_bytes: int | None = None
    act_bytes_per_sample: int | None = None
    slope_source: str | None = None
    axis: str = "model"
    axis_ratio: float | None = None
    forward_flops_per_sample: float | None = None
    step_flops_per_sample: float | None = None
    pair_flops_share: float = 0.0  # of the forward FLOPs, products of two activations (attention), largest of the steps
    phases: list[PhasePeak] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    inputs: list[dict] | None = None
    loaders: list[dict] = field(default_factory=list)
    num_workers: int | None = None
    amp: str | None = None
    distributed: str | None = None
    has_conv: bool | None = None
    findings: list[Finding] = field(default_factory=list)
    raw: dict = field(default_factory=dict)
    error_line: int | None = None
    failed_alloc: FailedAllocation | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "measured"


@dataclass(frozen=True)
class FailedAllocation:
    """One allocation the script asked for in the dry run that is larger than the dry run's whole memory limit: the
    script's own need, not the limit's doing (a smaller dry-run batch would not have asked for more).

    :ivar request_bytes: the failed request (Paddle's ``Fail to alloc memory of N size``, NumPy's ``Unable to allocate``).
    :ivar batch: the batch the dry run ran at when it failed (None: not known).
    :ivar scaling: ``fixed`` (the same request at two batch sizes), ``scales`` (it grew with the batch) or
        ``unknown`` (one batch size seen).
    :ivar batches: every batch size it failed at, with its request: ``[(batch, bytes)]``.
    :ivar limit_bytes: the dry run's memory limit (address space) it was larger than.
    """

    request_bytes: int
    batch: int | None
    scaling: str
    batches: tuple[tuple[int | None, int], ...]
    limit_bytes: int


# ----------------------------------------------------------------------------------------------- planning
def first_batch(batch: int, act_per_sample: int | None, fwd_flops_per_sample: float | None,
                params: int | None) -> int:
    """``lo`` of the dry run's schedule (``lo // 2`` twice, ``lo`` twice, then the largest affordable batch twice):
    the run's own batch when the static hints say a step is cheap (no extrapolation at all), else small enough
    for a step within the probe's budgets (:data:`autodl.profile.probe.PROBE_STEP_FLOPS`,
    :data:`~autodl.profile.probe.PROBE_ACTIVATION_BYTES`), so that the child chooses the large batch from a
    measurement. Without hints: the run's own up to 8 (models under 20M parameters), else 4.
    """
    from autodl.profile.probe import PROBE_ACTIVATION_BYTES, PROBE_STEP_FLOPS

    if batch <= 2:
        return batch
    if fwd_flops_per_sample and act_per_sample is not None:
        if 3 * fwd_flops_per_sample * batch <= NATIVE_STEP_FLOPS and act_per_sample * batch <= NATIVE_STEP_ACT_BYTES:
            return batch
        cap = int(PROBE_STEP_FLOPS // (3 * fwd_flops_per_sample))
        if act_per_sample:
            cap = min(cap, int(PROBE_ACTIVATION_BYTES // 2 // act_per_sample))
        return max(1, min(batch // 2, cap))
    if batch <= 8 and (params or 0) < 20_000_000:
        return batch
    return max(1, min(batch // 2, 4))


# ---------------------------------------------------------------------------------------------- the run
def stage_script(script_dir: Path, workdir: Path) -> Staged:
    """The user's code and data files of the script's folder, copied into the working directory (see
    :func:`autodl.sandbox.stage_tree`: regular files and folders only, never autodl's or Airflow's state, bounded by
    :data:`MAX_STAGED_FILES`, :data:`MAX_STAGED_BYTES`, :data:`MIRROR_DEPTH`). The folders are the sandbox's own
    (the script can write ``checkpoints/`` there: it counts against the working folder's bound); the copies are
    mounted read-only over themselves."""
    return stage_tree(script_dir, workdir, protected=protected_paths(script_dir), max_files=MAX_STAGED_FILES,
                      max_bytes=MAX_STAGED_BYTES, max_depth=MIRROR_DEPTH)


def _staging_note(staged: Staged) -> str | None:
    """One sentence naming what of the script's folder the dry run did not show, or None."""
    left = [e for e in staged.left_out if not e.endswith("(a hidden entry)")]  # .git, .venv: never the script's input
    if not left:
        return None
    shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
    return f"not shown to the script (its folder's entries left out): {shown}"


MAX_ARG_SCAN = 10_000
"""Entries of a folder named in ``task.args`` checked before it is mounted; a larger folder is refused (it could
hide a socket or autodl's state past what was checked)."""


def _arg_folder_problem(real: Path, protected: list[Path]) -> str | None:
    """Why a folder named in ``task.args`` must not be mounted: it holds a socket, FIFO or device, a link out of it,
    autodl's or Airflow's state, or more than :data:`MAX_ARG_SCAN` entries; None when it may be."""
    n = 0
    for root, dirs, files in os.walk(real):
        for name in dirs + files:
            n += 1
            p = Path(root) / name
            if n > MAX_ARG_SCAN:
                return f"more than {MAX_ARG_SCAN} entries to check"
            try:
                st = p.lstat()
            except OSError:
                return "an entry that cannot be checked"
            if stat.S_ISLNK(st.st_mode):
                try:
                    if real not in p.resolve().parents:
                        return f"a link out of it ({p})"
                except (OSError, RuntimeError):
                    return f"a link that cannot be followed ({p})"
            elif not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                return f"a socket, FIFO or device ({p})"
            why = why_protected(p, protected)
            if why and why != "a hidden entry":
                return f"{why} ({p})"
    return None


MAX_ARG_PATHS = 16
"""Paths named in ``task.args`` that the dry run shows the script (read-only), at most."""

_SYSTEM_TREES = ("/proc", "/sys", "/dev", "/run", "/var/run", "/boot", "/etc", "/root", "/var/lib", "/var/log")


def arg_paths(argv: list[str] | None) -> tuple[list[Path], list[str]]:
    """Existing absolute paths named in the script's arguments (``--data /d``, ``--data=/d``), to be mounted
    read-only in the dry run -- the data a run is given on its command line -- and the ones refused, with why.

    The spec's author chose these arguments and the real run reads them with the same rights; still refused: the
    root, system trees (:data:`_SYSTEM_TREES`), hidden entries (``~/.ssh``, ``.aws``), the home folder itself,
    ``$AUTODL_HOME``/``$AIRFLOW_HOME`` (autodl's store and Airflow's configuration live there).
    """
    out: list[Path] = []
    refused: list[str] = []
    guard = protected_paths()
    home = Path.home().resolve() if os.environ.get("HOME") else None
    for a in argv or []:
        text = a.split("=", 1)[1] if a.startswith("-") and "=" in a else a
        if not text.startswith("/") or "\x00" in text or len(text) > 4096:
            continue
        try:
            real = Path(text).resolve()
            if not real.exists():
                continue
        except (OSError, RuntimeError):
            continue
        why = None
        if real == Path("/") or any(real == Path(t) or Path(t) in real.parents for t in _SYSTEM_TREES):
            why = "a system folder"
        elif any(part.startswith(".") for part in real.parts[1:]):
            why = "a hidden file or folder"
        elif home is not None and real == home:
            why = "the home folder"
        elif any(real == g or g in real.parents or real in g.parents for g in guard):
            why = "autodl's or Airflow's own folder"
        elif (w := why_protected(real, guard)) and w != "a hidden entry":
            why = w
        elif not (real.is_file() or real.is_dir()):
            why = "not a regular file or folder (a socket, FIFO or device)"
        elif real.is_dir():
            why = _arg_folder_problem(real, guard)
        if why:
            refused.append(f"{text} ({why})")
        elif real not in out and len(out) < MAX_ARG_PATHS:
            out.append(real)
    return out, refused


def child_env(batch_env: int | None, workdir: Path, launch_env: dict[str, str] | None = None) -> dict[str, str]:
    """The child's whole environment: the spec's ``launcher.env`` as the training gets it, then the launcher's
    contract (``AUTODL_PADDLE_DEVICE``, the planned batch, an output folder -- here inside the working directory, so
    checkpoints land in the sandbox), which wins as it does at launch; nothing of the caller's."""
    env = {str(k): str(v) for k, v in (launch_env or {}).items()}
    env |= {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_VISIBLE_DEVICES": "", "AUTODL_PADDLE_DEVICE": "cpu",
           "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
           "GLOG_minloglevel": "2", "LANG": "C.UTF-8", "PYTHONWARNINGS": "ignore", "AUTODL_DRY_RUN": "1",
           "AUTODL_OUTPUT_DIR": str(workdir / ".autodl-output")}
    if batch_env:
        env["AUTODL_BATCH_SIZE_PER_GPU"] = str(batch_env)
    return env


@dataclass
class ChildOutput:
    """What the dry-run child left in its output folder, as read back (untrusted: the user's code wrote there too).

    :ivar result: the bytes of ``result.json``; None when it is missing or was refused.
    :ivar events: the bytes of ``alloc_events.json``; None when missing or refused.
    :ivar refused: why ``result.json`` was not read although something is there (a link, a FIFO, too large).
    """

    result: bytes | None = None
    events: bytes | None = None
    refused: str | None = None


class DryRunVenue(Protocol):
    """Where the dry-run child runs: the worker's bubblewrap sandbox (:func:`_run_in_sandbox`) or the launcher's
    image (:class:`autodl.profile.container.DockerVenue`, :class:`autodl.profile.pod.PodVenue`).

    ``run`` stages ``script``'s folder, runs ``python dryrun_child CONFIG`` with ``cfg`` (its paths rewritten
    for where it runs), the environment of :func:`child_env` and ``limits``, and reads the output back.
    """

    name: str

    def run(self, script: Path, cfg: DryRunConfig, *, limits: SandboxLimits, batch_env: int | None,
            launch_env: dict[str, str] | None) -> tuple[ChildOutput, SandboxResult, Staged]: ...


def read_back(out: ChildOutput) -> dict:
    """The child's checked report (:func:`dryrun_report`) with the allocator replay of its events; a report that
    cannot be used is ``{"report_error": why}``; ``{}`` when the child left nothing."""
    raw: dict = {}
    if out.result is not None:
        try:
            raw = dryrun_report(out.result.decode("utf-8", errors="replace"))
        except ValueError as exc:
            raw = {"report_error": report_text(str(exc))}
    elif out.refused:
        raw = {"report_error": out.refused}
    if out.events is not None and raw and not raw.get("report_error"):
        from autodl.profile.allocator import replay_auto_growth
        try:
            events = [(int(a), int(d)) for a, d in json.loads(out.events)
                      if type(a) is int and type(d) is int and abs(d) <= REPORT_MAX_BYTES]
            rr = replay_auto_growth(events, preexisting=[raw.get("alloc_preexisting") or 0])
            raw["alloc_replay"] = {"peak_allocated": rr.peak_allocated, "peak_reserved": rr.peak_reserved,
                                   "chunks": rr.chunks, "events": rr.events, "unmatched_frees": rr.unmatched_frees}
        except (ValueError, TypeError, RecursionError) as exc:
            raw["alloc_error"] = report_text(str(exc))
    return raw


def _run_in_sandbox(script: Path, cfg: DryRunConfig, *, limits: SandboxLimits, batch_env: int | None,
                    launch_env: dict[str, str] | None) -> tuple[ChildOutput, SandboxResult, Staged]:
    """The worker's venue: the child in :func:`autodl.sandbox.run_sandboxed` (bubblewrap), its folder staged in a
    temporary working directory (:func:`stage_script`), the paths ``task.args`` names mounted read-only."""
    with tempfile.TemporaryDirectory(prefix="autodl-dryrun-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        staged = stage_script(script.parent, work)
        out = work / OUT_DIR
        out.mkdir()
        # the script runs as <workdir>/<name> (a copy: Path(__file__).resolve() stays there too): what it writes
        # beside itself (runs/, checkpoints/) lands in the working folder, as in a writable checkout
        here = work / script.name
        try:
            if here.is_symlink() or here.exists():
                here.unlink()
            here.write_bytes(script.read_bytes())
            cfg = cfg.model_copy(update={"script": str(here), "user_dirs": [*cfg.user_dirs, str(work)]})
        except OSError:
            pass
        cfg = cfg.model_copy(update={"result": str(out / "result.json")})
        cfg_path = Path(tmp) / "dryrun.json"
        cfg_path.write_text(cfg.model_dump_json())
        result = run_sandboxed([sys.executable, "-s", str(CHILD), str(cfg_path)], workdir=work,
                               env=child_env(batch_env, work, launch_env), limits=limits,
                               read_only_paths=[*staged.files, CHILD, FLOPS_COUNTER, cfg_path,
                                                *arg_paths(cfg.argv)[0]])
        # read back without trusting what the script may have done to them: no link followed out of the dry
        # run's own folder, regular files of bounded size only (autodl.sandbox.read_output)
        got = ChildOutput(result=read_output(work, f"{OUT_DIR}/result.json", max_bytes=REPORT_FILE_BYTES))
        if got.result is None and (out.is_symlink() or not out.is_dir() or os.path.lexists(out / "result.json")):
            got.refused = (f"it is not a regular file of at most {REPORT_FILE_BYTES >> 20} MiB in the dry run's own "
                           "folder")
        if got.result is not None:
            got.events = read_output(work, f"{OUT_DIR}/alloc_events.json", max_bytes=8 * REPORT_FILE_BYTES)
    return got, result, staged


def _run_child(script: Path, cfg: DryRunConfig, *, timeout: float, memory: int, batch_env: int | None,
               launch_env: dict[str, str] | None = None, venue: DryRunVenue | None = None
               ) -> tuple[dict, SandboxResult]:
    limits = SandboxLimits(timeout_s=timeout, memory_bytes=memory, disk_bytes=disk_bound())
    run = venue.run if venue is not None else _run_in_sandbox
    got, result, staged = run(script, cfg, limits=limits, batch_env=batch_env, launch_env=launch_env)
    raw = read_back(got)
    note = _staging_note(staged)
    if note and isinstance(raw, dict):
        raw["notes"] = [*(raw.get("notes") or []), note]
    return raw, result


def run_dry_run(
    script: Path,
    *,
    argv: list[str] | None = None,
    batch: int | None,
    script_batch: int | None = None,
    batch_from_spec: bool = False,
    hints: dict[str, Any] | None = None,
    eval_expected: bool = False,
    timeout_s: float | None = None,
    budget_s: float | None = None,
    env: dict[str, str] | None = None,
    venue: DryRunVenue | None = None,
) -> DryRun:
    """Run ``script`` in the sandbox with the dry-run hooks and turn what it measured into a :class:`DryRun`.

    :param script: the training script.
    :param argv: its arguments (``task.args``).
    :param batch: the per-device batch the estimate is for (the spec's, else the script's as read statically;
        None when unknown: the script's own, as seen, is used).
    :param script_batch: the batch the script itself uses (static reading), for tensors it creates itself.
    :param batch_from_spec: the batch comes from the spec (then it reaches the script as
        ``AUTODL_BATCH_SIZE_PER_GPU`` and the loaders are driven up to it).
    :param hints: ``act_bytes_per_sample``, ``forward_flops_per_sample``, ``params`` when known beforehand (the profile
        passes none: nothing is estimated before the dry run).
    :param eval_expected: the script has an evaluation pass (``no_grad``/``eval()``): wait for it.
    :param timeout_s: hard limit; default ``$AUTODL_DRYRUN_TIMEOUT_S`` or :data:`DRY_RUN_TIMEOUT_S`.
    :param budget_s: soft budget of the measured steps; default ``$AUTODL_DRYRUN_BUDGET_S`` or :data:`DRY_RUN_BUDGET_S`.
    :param env: the spec's ``launcher.env``: the script sees it as the training will (autodl's own variables win).
    :param venue: where the child runs; None: the worker's bubblewrap sandbox (see :class:`DryRunVenue`).
    :returns: the dry run; failures are outcomes with a reason, never exceptions.
    """
    t0 = time.monotonic()
    hints = hints or {}
    timeout = float(timeout_s or os.environ.get("AUTODL_DRYRUN_TIMEOUT_S") or os.environ.get("AUTODL_PROBE_TIMEOUT_S")
                    or DRY_RUN_TIMEOUT_S)
    budget = float(budget_s or os.environ.get("AUTODL_DRYRUN_BUDGET_S") or min(DRY_RUN_BUDGET_S, timeout * 0.5))
    plan_batch = batch or script_batch  # the script's own batch (static reading) sizes the first steps too
    lo = first_batch(plan_batch, hints.get("act_bytes_per_sample"), hints.get("forward_flops_per_sample"),
                     hints.get("params")) if plan_batch else None
    natives = sorted({b for b in (batch, script_batch) if isinstance(b, int) and b > 1})
    cfg = DryRunConfig(script=str(script.resolve()), argv=list(argv or []), user_dirs=[str(script.resolve().parent)],
                       target_batch=batch if batch_from_spec else None, lo=lo, budget_s=budget,
                       mem_budget_bytes=DRY_RUN_TENSOR_BUDGET_BYTES, eval_expected=eval_expected,
                       native_batches=natives, reduce=True,
                       record_allocations=os.environ.get("AUTODL_DRYRUN_RECORD_ALLOCATIONS") == "1")
    attempt = _Attempt(script=script, cfg=cfg, timeout=timeout, t0=t0, target=batch, batch_from_spec=batch_from_spec,
                       memory=int(os.environ.get("AUTODL_PROBE_MEMORY_BYTES") or DRY_RUN_ADDRESS_SPACE_BYTES),
                       env=env, venue=venue)
    try:
        dr = attempt.run(timeout)
    except SandboxUnavailable as exc:  # user code never runs unisolated
        return DryRun(outcome="no-isolation", reason=str(exc), seconds=round(time.monotonic() - t0, 3))
    dr = _repeat_if_reduced_batch_broke(attempt, dr)
    dr = _repeat_if_steps_ran_out(attempt, dr)
    dr = _repeat_if_batch_axis_unknown(attempt, dr)
    if dr.outcome == "cannot-run" and (request := failed_request(dr.raw)) is not None and request > attempt.memory:
        dr = _tell_failed_allocation(dr, request, script, attempt.cfg, memory=attempt.memory, env=env,
                                     left=attempt.left(), batch_env=attempt.batch_env, venue=venue)
    dr.findings.extend(_path_findings(argv, venue))
    dr.seconds = round(time.monotonic() - t0, 3)
    return dr


@dataclass
class _Attempt:
    """One dry run's child config, bounds (seconds, bytes) and clock, shared by its repeats."""

    script: Path
    cfg: DryRunConfig
    timeout: float
    t0: float
    target: int | None
    batch_from_spec: bool
    memory: int
    env: dict[str, str] | None
    venue: DryRunVenue | None

    @property
    def batch_env(self) -> int | None:
        """The batch the child is told (``AUTODL_BATCH_SIZE_PER_GPU``): the spec's, else none."""
        return self.target if self.batch_from_spec else None

    def left(self) -> float:
        """Seconds of the hard limit not yet spent."""
        return self.timeout - (time.monotonic() - self.t0)

    def early(self) -> bool:
        """Less than half the hard limit is spent: a repeat still fits."""
        return time.monotonic() - self.t0 < self.timeout * 0.5

    def run(self, timeout: float) -> DryRun:
        """Run the child with the current config and summarize what it measured."""
        raw, res = _run_child(self.script, self.cfg, timeout=timeout, memory=self.memory, batch_env=self.batch_env,
                              launch_env=self.env, venue=self.venue)
        return summarize(raw, res, target_batch=_target_for(raw, self.target, self.batch_from_spec),
                         timeout=self.timeout)

    def native(self) -> DryRun:
        """Once more at the script's own batch (no reduction), in the time left (at least 10 s). Its findings say
        that the batch was the script's by the repeat's choice, not that the dry run could not change it."""
        self.cfg = self.cfg.model_copy(update={"reduce": False, "lo": None})
        dr = self.run(max(10.0, self.left()))
        dr.findings = [f.model_copy(update={"message": f.message.replace(FIXED_BATCH_TEXT, NATIVE_BATCH_TEXT)})
                       for f in dr.findings]
        return dr


FIXED_BATCH_TEXT = ("the dry run could not change it: the script fixes its batch or builds its batches itself, "
                    "e.g. with a BatchSampler")
"""Why a dry run that reduces batches measured one size only."""

NATIVE_BATCH_TEXT = "the dry run's repeat runs the script at its own batch, unchanged"
"""The same, said of a repeat at the script's own batch (:meth:`_Attempt.native`), which does not try to change it."""


def _repeat_if_reduced_batch_broke(attempt: _Attempt, dr: DryRun) -> DryRun:
    """The reduced batch broke the script (e.g. a label tensor of the full batch) or left no step to measure (the
    slices of a data tensor the dry run shrank came out empty): once more at its own batch."""
    raw = dr.raw
    broke = (dr.outcome == "tool-failure" and (raw.get("error") or {}).get("batch_reduced")) \
        or (dr.outcome == "no-steps" and raw.get("reduced"))
    if not broke or any(s.get("measured") and s.get("batch") for s in dr.raw.get("steps") or []) \
            or not attempt.early():
        return dr
    dr2 = attempt.native()
    text = f"the dry run at a reduced batch failed ({dr.reason}); it was repeated at the script's own batch."
    if dr2.outcome == "user-error":  # the same script failed at its own batch too: not the reduction's doing
        text = ("the dry run at a reduced batch failed; repeated at the script's own batch, the script failed "
                "there too, so the error is the script's own (the script-error finding), not the reduction's.")
    dr2.findings.insert(0, Finding(severity="info", code="dry-run-native", message=text))
    return dr2


def _repeat_if_steps_ran_out(attempt: _Attempt, dr: DryRun) -> DryRun:
    """The script ran out of steps on the dry run's small batches (a short loop, a small data set) before the large
    batch it was to be measured at: the peak would be extrapolated far from tiny batches (measured: -10% to -35%).
    Run it once more at its own batch, which its own steps are enough for. A plan whose sizes were all measured was
    held to the time and memory budgets on purpose: kept."""
    planned = (dr.raw.get("plan") or {}).get("then") if dr.raw.get("plan") else None
    if not (dr.ok and attempt.cfg.reduce and dr.raw.get("end") in ("script-finished", "exit") and dr.batch
            and dr.batch > 2 * max(dr.batch_sizes or [dr.batch]) and attempt.early()
            and (planned is None or any(b not in dr.batch_sizes for b in planned))):
        return dr
    dr2 = attempt.native()
    if dr2.ok and dr2.batch_sizes and max(dr2.batch_sizes) > max(dr.batch_sizes):
        dr2.findings.insert(0, Finding(severity="info", code="dry-run-native", message=(
            f"the script's epoch ended after the dry run's reduced batches {dr.batch_sizes}, far below the batch the "
            f"estimate is for ({dr.batch}); the dry run was repeated at the script's own batch ({dr2.reason}).")))
        return dr2
    dr.findings.append(repeat_fell_short(dr, dr2))
    return dr


def _repeat_if_batch_axis_unknown(attempt: _Attempt, dr: DryRun) -> DryRun:
    """One loader size, model rows of another count: which dimension grows cannot be told; measure the script at the
    spec's batch itself instead of a bound."""
    if not (dr.ok and dr.axis == "unknown" and attempt.cfg.reduce and dr.batch not in dr.batch_sizes
            and attempt.early()):
        return dr
    dr2 = attempt.native()
    if dr2.ok and dr2.batch in dr2.batch_sizes:
        dr2.findings.insert(0, Finding(severity="info", code="dry-run-native", message=(
            f"which input dimension the batch grows could not be told from one loader size ({dr.reason}); "
            f"the dry run was repeated at batch {dr2.batch} itself ({dr2.reason}).")))
        return dr2
    return dr


def _path_findings(argv: list[str] | None, venue: DryRunVenue | None) -> list[Finding]:
    """What the dry run showed the script of the paths its ``task.args`` name, or why not."""
    found: list[Finding] = []
    shown, refused = arg_paths(argv) if venue is None else ([], [])
    if venue is not None and arg_paths(argv)[0]:
        found.append(Finding(severity="info", code="dry-run-paths", message=(
            f"the dry run ran in the launcher's image ({venue.name}): paths task.args names are this worker's and are "
            "not there; the script sees the image and the spec's launcher.mounts (read-only), as the training does.")))
    if shown:
        found.append(Finding(severity="info", code="dry-run-paths", message=(
            "the dry run showed the script, read-only, the paths its task.args name: "
            + ", ".join(str(p) for p in shown) + ".")))
    if refused:
        found.append(Finding(severity="warning", code="dry-run-paths", message=(
            "the dry run did not show the script these paths its task.args name: " + "; ".join(refused)
            + ". If the script needs them the dry run cannot run it; the estimate falls back.")))
    return found


_NUMPY_OOM = re.compile(r"Unable to allocate (?P<n>[0-9.]+) (?P<u>[KMGTPE]?i?B)\b")
"""NumPy's ``MemoryError`` text (``numpy/core/src/multiarray/alloc.c`` via ``_ArrayMemoryError``): sizes in powers
of 1024 (``64.0 GiB``)."""


def failed_request(raw: dict) -> int | None:
    """Bytes of the allocation the script's dry run failed on (Paddle's allocators, :func:`autodl.oom.find_oom`;
    NumPy's ``Unable to allocate``), or None when its error does not say."""
    from autodl.oom import find_oom, to_bytes

    message = str((raw.get("error") or {}).get("message") or "")
    found = find_oom([message])
    if found is not None and found[1].get("req"):
        return int(found[1]["req"])
    m = _NUMPY_OOM.search(message)
    return to_bytes(m.group("n"), m.group("u")) if m else None


def failed_batch(raw: dict) -> int | None:
    """The batch the dry run ran at (its inputs' first dimension) when the script failed, or None."""
    shape = ((raw.get("inputs") or [{}])[0] or {}).get("shape") or []
    return int(shape[0]) if shape and isinstance(shape[0], int) and shape[0] > 0 else None


def _tell_failed_allocation(dr: DryRun, request: int, script: Path, cfg: DryRunConfig, *, memory: int, env, left: float,
                            batch_env: int | None, venue: DryRunVenue | None = None) -> DryRun:
    """A single allocation larger than the dry run's whole memory limit failed: run once more at another batch to
    tell whether it scales with the batch (:data:`autodl.oom.SAME_REQUEST_RATIO`), and keep it on ``dr``."""
    from autodl.oom import SAME_REQUEST_RATIO

    batch = failed_batch(dr.raw)
    seen: list[tuple[int | None, int]] = [(batch, request)]
    if batch is not None and left > 20:
        # the child's schedule starts at lo // 2: lo = batch gives half the batch, lo = 4 gives 2 (from batch 1)
        again = cfg.model_copy(update={"reduce": True, "lo": batch if batch > 1 else 4})
        raw2, _res = _run_child(script, again, timeout=left, memory=memory, batch_env=batch_env, launch_env=env,
                                venue=venue)
        request2, batch2 = failed_request(raw2), failed_batch(raw2)
        if request2 is not None and batch2 is not None and batch2 != batch:
            seen.append((batch2, request2))
    scaling = "unknown"
    if len(seen) == 2:
        (b1, r1), (b2, r2) = seen
        if max(r1, r2) <= SAME_REQUEST_RATIO * min(r1, r2):
            scaling = "fixed"
        elif (r2 > r1) == (b2 > b1):  # type: ignore[operator]
            scaling = "scales"
    dr.failed_alloc = FailedAllocation(request_bytes=request, batch=batch, scaling=scaling, batches=tuple(seen),
                                       limit_bytes=memory)
    dr.reason = (f"the script asked for {request / (1 << 30):.2f} GiB in one allocation"
                 + (f" at batch {batch}" if batch else "") + f", more than the dry run's whole memory limit "
                 f"({memory / (1 << 30):.0f} GiB): the script's own need, not the dry run's limit")
    return dr


# ------------------------------------------------------------------------------------------ the report
REPORT_FILE_BYTES = 32 << 20
"""Largest result file read back from the dry run (bytes): the child writes it in the user's process, so the
script can write anything there, of any size."""


# ----------------------------------------------------------------------------------------- classification
SIZE_ADVICE = ("set task.sequence_length or task.input_shape to the largest the data holds (the figure is then "
               "sized to it), or keep headroom")
"""What a finding on inputs the dry run may not have seen at their largest advises: the profile scales the measured
figure to the spec's size (``_to_spec_size`` in :mod:`autodl.profile`), and says the spec's size instead where the
spec sets one."""

SANDBOX_WORK = re.compile(r"/[^\s'\"]*?/autodl-dryrun-[^/\s'\"]+/work(?=[/'\"\s]|$)")
"""The dry run's working folder in a message (:func:`_run_in_sandbox`'s temporary ``autodl-dryrun-*/work``)."""

SCRIPT_FOLDER = "<the script's folder>"
"""What a message says in its place: the user knows that folder, not the temporary copy."""


def classify(err: dict, script: str | None = None) -> tuple[str, str]:
    """``(outcome, why)`` of an exception the script raised in the dry run (see the module docstring)."""
    etype, msg = err.get("type") or "Exception", SANDBOX_WORK.sub(SCRIPT_FOLDER, err.get("message") or "")
    last = err.get("last_frame") or {}
    if Path(last.get("file") or "").parent.name == CHILD.name:  # a module of the child's package
        return "tool-failure", f"autodl's dry-run hooks failed ({etype}: {msg[:200]})"
    if etype in ENV_ERRORS:
        return "cannot-run", f"{ENV_ERRORS[etype]} ({etype}: {_short(msg)})"
    if etype == "KeyError" and any(f.get("file", "").endswith("/os.py") for f in err.get("frames", [])[-2:]):
        return "cannot-run", f"it reads an environment variable that is not set here ({etype}: {_short(msg)})"
    if err.get("errno") in (27, 28, 122) or re.search(r"File too large|No space left|Disk quota", msg, re.I):
        return "cannot-run", (f"it wrote more than the dry run's bound on written files allows ({etype}: {_short(msg)}; "
                              "the dry run's limit, not an error of the script)")
    if etype == "OSError" or err.get("errno") in (2, 13, 30, 101, 110, 111, 113):
        return "cannot-run", f"it needs a file, directory or network access it does not have here ({etype}: {_short(msg)})"
    for pat, why in ENV_PATTERNS:
        if pat.search(msg) or pat.search(etype):
            return "cannot-run", f"{why} ({etype}: {_short(msg)})"
    code = (last.get("code") or "").strip()
    if err.get("user_frame") and last == err.get("user_frame") and (code.startswith(("raise", "assert"))
                                                                   or etype == "AssertionError"):
        # the script stopped itself: often a check of where it runs (a GPU, a file, a variable), not a bug
        return "cannot-run", f"the script raised {etype} itself at line {last.get('line')} ({_short(msg)})"
    if err.get("batch_reduced"):
        return "tool-failure", (f"the batch the dry run reduced the script to broke it ({etype}: {_short(msg)}): autodl's change, "
                                "not an error of the script")
    if err.get("user_frame"):
        return "user-error", f"{etype}: {_short(msg, 600)}"
    return "tool-failure", f"it failed outside the script's own code ({etype}: {_short(msg)})"


def _short(msg: str, n: int = 240) -> str:
    lines = [l.strip() for l in msg.strip().splitlines() if l.strip()]
    if not lines:
        return ""
    # Paddle's C++ errors: the useful line is the one with the error kind
    pick = next((l for l in lines if re.search(r"InvalidArgument|PreconditionNotMet|OutOfRange|NotFound|Unimplemented|"
                                               r"mismatch|shape|must be|should be|expected", l, re.I)), lines[0])
    pick = re.sub(r"\s*\[Hint:.*$", "", pick)
    return pick[:n].rstrip(". ")


# -------------------------------------------------------------------------------------------- summarizing
def _key(inputs: list[dict] | None) -> tuple:
    return tuple((tuple(d["shape"][1:]), d["dtype"]) for d in (inputs or []) if d.get("shape"))


def _line(points: dict[int, int], b: int) -> tuple[int, float | None, bool]:
    """Value at ``b`` of the piecewise-linear curve through ``points`` (batch -> bytes), its slope there, and
    whether it was extrapolated. Beyond the last point the last segment continues."""
    xs = sorted(points)
    if b in points:
        if len(xs) >= 2:
            i = xs.index(b)
            j = i - 1 if i > 0 else i + 1
            slope = (points[xs[i]] - points[xs[j]]) / (xs[i] - xs[j])
        else:
            slope = None
        return points[b], slope, False
    if len(xs) < 2:
        return points[xs[0]], None, True
    if b > xs[-1]:
        x1, x2 = xs[-2], xs[-1]
    elif b < xs[0]:
        x1, x2 = xs[0], xs[1]
    else:
        x2 = next(x for x in xs if x > b)
        x1 = max(x for x in xs if x < b)
    slope = (points[x2] - points[x1]) / (x2 - x1)
    return int(points[x2] + (b - x2) * slope), slope, True


def _disk_reason(res: SandboxResult | None) -> str | None:
    """Why the sandbox stopped the run for what it wrote (its working-folder bound), or None."""
    if res is None or not res.disk_exceeded:
        return None
    what = next((n for n in res.notes if "working folder" in n), "")
    what = re.sub(r"^the run put ", "", what).split(":")[0] if what else "more than its bound"
    return (f"it wrote {what} (checkpoints, logs or data: the dry run keeps them in its working folder, bounded; "
            "the dry run's limit, not an error of the script)")


AXIS_TOLERANCE = 1.1
"""Largest spread (max/min) of the model's rows per loader sample over the measured steps for the model's batch to
count as following the loader's (graphs of a few more or fewer nodes still follow)."""


def axis_ratio(steps: list[dict]) -> float | None:
    """Rows of the model's input per sample the loader (or the script's own batch-sized tensors) gave a step, from
    the measured steps: 2 for two batches concatenated, ~50 for graphs of 50 nodes, 1.0 for the usual case.

    :param steps: step records with ``batch`` (the model input's leading dimension) and ``loader_batch`` (samples
        handed out for the step, None when not known).
    :returns: the mean ratio when at least two loader sizes show the model's batch following them (within
        :data:`AXIS_TOLERANCE`), 1.0 when every step's model batch is its loader batch, None when it cannot be told
        (no loader batch, or one loader size with another model batch), 0.0 when the model's batch does not follow.
    """
    pairs = [(s["loader_batch"], s["batch"]) for s in steps if s.get("loader_batch") and s.get("batch")]
    if not pairs or len(pairs) < len(steps):
        return None
    ratios = [b / w for w, b in pairs]
    if len({w for w, _ in pairs}) < 2:
        return 1.0 if all(r == 1 for r in ratios) else None
    return sum(ratios) / len(ratios) if max(ratios) <= AXIS_TOLERANCE * min(ratios) else 0.0


def repeat_fell_short(dr: DryRun, dr2: DryRun) -> Finding:
    """The warning for a dry run whose script ended on its reduced batches and whose repeat at the full batch did
    not get further: what was measured, at which sizes, and what the repeat did instead (not a circular "did not
    measure")."""
    if dr2.ok:
        repeat = (f"a repeat without the reductions measured batch sizes {dr2.batch_sizes or '(none)'}, no larger, "
                  "so the script's own loop does not reach that batch in the steps it runs")
    else:
        repeat = f"a repeat without the reductions got no measured step ({dr2.outcome}: {dr2.reason})"
    largest = max(dr.batch_sizes, default=0)
    return Finding(severity="warning", code="dry-run-extrapolated", message=(
        f"the dry run measured training steps at batch sizes {dr.batch_sizes or '(none)'} before the script ran out "
        f"of steps; batch {dr.batch} itself was not measured: {repeat}. Its peak is extrapolated from batch "
        f"{largest} to {dr.batch} and may be low. Pass more steps in task.args, or set task.batch_size_per_gpu to a "
        "batch the script runs."))


def script_native(raw: dict) -> int | None:
    """The batch the script itself trains with, as the dry run saw it: its training DataLoader's batch size, or
    the first dimension of the tensors it created before the dry run reduced them, when the model was called at
    their reduced size (a tensor of 64 rows the script slices micro-batches of 2 out of is a data set, not the
    batch)."""
    plan = raw.get("plan") or {}
    if plan.get("native"):
        return int(plan["native"])
    seen = {s.get("batch") for s in raw.get("steps") or [] if s.get("batch")}
    created = [c[0] for c in raw.get("created_batches") or [] if not seen or c[1] in seen]
    if created:
        return max(created)
    return None


def bytes_text(n: float | None) -> str:
    """Bytes (a sample's, or a difference) in a finding: KiB below a MiB (a slope of 2.2 KiB read "0.00 MiB", as if
    none), else MiB."""
    n = float(n or 0)
    return f"{n / 2**10:,.1f} KiB" if n < 2**20 else f"{n / 2**20:,.2f} MiB"


def trained_batch(raw: dict, static_batch: int | None) -> int | None:
    """The batch the script trains at as the dry run saw it, where that says more than the static reading: its
    own batch (:func:`script_native`), else, when no loader fed the steps, the one batch every measured step called
    the model at when that is a slice of the ``static_batch`` rows (a data tensor of 4096 rows stepped through 128
    at a time trains at 128, also when the dry run shrank that tensor and the steps' slices stayed 128). None when
    it cannot be told: a first dimension the static batch sits behind (a time-major ``[sequence, batch, ...]``
    input) is not the batch, nor is a size the dry run shrank a tensor to."""
    steps = [s for s in raw.get("steps") or [] if s.get("measured") and s.get("batch")]
    shapes = [list(i.get("shape") or []) for s in steps for i in (s.get("inputs") or []) if isinstance(i, dict)]
    if static_batch and any(static_batch in shape[1:] for shape in shapes):
        return None
    native = script_native(raw)
    if native:
        return native
    if not steps or not static_batch or raw.get("loaders"):
        return None
    batches = {int(s["batch"]) for s in steps}
    shrunk = {int(c[1]) for c in raw.get("created_batches") or []}
    if raw.get("reduced") and (not shrunk or batches & shrunk):
        return None
    calls = max(max(1, int(s.get("fwd_calls") or 1)) for s in steps)
    if len(batches) == 1 and (b := batches.pop()) * calls < static_batch:
        return b
    return None


def _target_for(raw: dict, batch: int | None, from_spec: bool) -> int | None:
    """The batch a dry run's figure is for: the spec's; else, when the dry run changed nothing (no loader driven,
    no tensor shrunk) and measured steps, the batch the script was seen to train at (None: summarize takes it),
    not the static reading's guess; else that guess."""
    if from_spec or batch is None:
        return batch
    plan = raw.get("plan") or {}
    if raw.get("steps") and not raw.get("reduced") and not plan.get("native") and not plan.get("target"):
        return None
    return batch


def step_flops_per_sample(steps: list[dict], unit: Any = lambda s: s["batch"], optimizers: int = 1,
                          windows: list[dict] | None = None) -> float | None:
    """Training FLOPs of one whole step per sample (per unit of ``unit(step)``), from what the dry run counted in
    it: every forward call of the step (the model called twice, a separate head, a loss's matmul outside
    ``forward``) x :data:`TRAINING_FLOPS_FACTOR`, plus the forward passes recomputed during ``backward``
    (``recompute``), counted once. With several ``optimizers`` (a GAN: the discriminator's update, then the
    generator's) that take turns, each update is a window of its own, first calling a model on inputs of its own
    (the generator's noise, then the images), and a training step is that many consecutive windows: their sum (the
    generator and two discriminator calls, then the third), over ``windows`` (all measured windows, whatever their
    inputs' shape; default ``steps``). Optimizers that all update after one backward (a wide and a deep part) share
    each window. The largest over the measured steps; None when nothing was counted."""
    def training(s: dict) -> float:
        recomputed = s.get("recompute_flops", 0.0)
        return TRAINING_FLOPS_FACTOR * ((s.get("fwd_flops") or 0.0) - recomputed) + recomputed

    per = [training(s) / unit(s) for s in steps if s.get("fwd_flops") and unit(s)]
    if optimizers > 1:
        ordered = sorted((s for s in (windows or steps) if unit(s) and s.get("index") is not None),
                         key=lambda s: s["index"])
        for i in range(len(ordered) - optimizers + 1):
            run = ordered[i:i + optimizers]
            if [s["index"] for s in run] == list(range(run[0]["index"], run[0]["index"] + optimizers)) \
                    and len({unit(s) for s in run}) == 1 and len({_key(s.get("inputs")) for s in run}) == optimizers:
                per.append(sum(training(s) for s in run) / unit(run[0]))
    return max(per) if any(per) else None


def _axis_findings(dr: DryRun, main: list[dict], target: int, src: str) -> list[Finding]:
    """What the profile says about a model batch that is not the loader's (see :func:`axis_ratio`)."""
    rows = sorted({(s["loader_batch"], s["batch"]) for s in main if s.get("loader_batch")})
    if dr.axis == "loader" and dr.axis_ratio and abs(dr.axis_ratio - 1) > 0.01:
        return [Finding(severity="info", code="dry-run-axis", message=(
            f"the model's input had {dr.axis_ratio:.3g} rows per sample the loader gave (loader batch -> rows: "
            + ", ".join(f"{w} -> {b}" for w, b in rows[:4]) + "; concatenated batches, nodes of graphs or tokens): "
            f"the peak follows the loader's batch, the unit of task.batch_size_per_gpu ({target})."))]
    if dr.axis == "unknown" and src == "axis-unknown" and target not in dr.batch_sizes:
        w, b = rows[-1]
        return [Finding(severity="warning", code="dry-run-extrapolated", message=(
            f"the model's input had {b} rows for a loader batch of {w}, and one loader size cannot tell which "
            f"dimension the batch grows; the peak at batch {target} is "
            + ("the measured one (a bound: the peak does not fall with the batch)" if target < w else
               f"scaled in proportion to the loader's batch ({target}/{w}) from the step's own allocations (an "
               "upper bound)") + ". Set task.batch_size_per_gpu to a batch the dry run can run to measure it."))]
    return []


def _elements_per_sample(step: dict) -> int:
    """Elements per sample of a step's inputs (all but their leading dimension)."""
    return sum(math.prod(int(x) for x in d["shape"][1:]) for d in step.get("inputs") or [] if d.get("shape"))


def group_batch(group: list[dict], target: int, own_batches: set[int] | frozenset[int], unit: Any) -> int:
    """The batch the figure of one input shape's steps is for: ``target``, or, when the script's loaders have
    batches of their own that differ (two tasks' loaders taking turns, 32 sentences then 12 tagged sequences) and
    these steps ran at one of them, that batch -- the script never feeds these inputs at the other loader's batch.

    :param own_batches: the training loaders' own batch sizes, when the figure is at the script's batches (no
        spec batch); empty otherwise.
    """
    largest = max(unit(s) for s in group)
    return largest if len(own_batches) >= 2 and largest in own_batches else target


def shape_bound(groups: dict[tuple, list[dict]], target: int, unit: Any,
                own_batches: set[int] | frozenset[int] = frozenset()) -> tuple[int, dict, dict] | None:
    """A bound on the training peak at ``target`` for the largest input the steps had, when that input was measured
    at other batch sizes only and a smaller one at ``target`` itself (a size the script draws per batch: the large
    one fell on the dry run's smaller batches): the smaller input's step at ``target``, its allocations above the
    step's start scaled in proportion to the elements per sample (activations of convolutions, FPN levels and
    anchors grow with the pixels; an upper bound for anything that grows no faster).

    :param groups: the measured steps by input shape (:func:`_key`).
    :param target: the batch the figure is for, in ``unit``'s count.
    :param unit: a step's batch in the figure's unit.
    :param own_batches: see :func:`group_batch` (an input measured at its own loader's batch needs no bound).
    :returns: ``(bound_bytes, largest_step, from_step)``, or None when the largest input was measured at ``target``
        or no smaller one was.
    """
    if len(groups) < 2:
        return None
    steps = [s for g in groups.values() for s in g]
    most = max(_elements_per_sample(s) for s in steps)
    big = [s for s in steps if _elements_per_sample(s) >= most]
    if any(unit(s) == target for s in big) or any(group_batch(g, target, own_batches, unit) != target
                                                  for g in groups.values() if big[0] in g):
        return None
    at_target = [s for s in steps if unit(s) == target and 0 < _elements_per_sample(s) < most]
    if not big or not at_target:
        return None

    def scaled(s: dict) -> int:
        peak = max(s["fwd_bwd_peak"], s["update_peak"]) + (0 if s.get("steady") else int(s.get("kept_adjust") or 0))
        return int(s["start_bytes"] + max(0, peak - s["start_bytes"]) * most / _elements_per_sample(s))

    src = max(at_target, key=scaled)
    return scaled(src), big[0], src


def called_amp(raw: dict) -> str | None:
    """The AMP level the script ran under, as the dry run saw it called (``paddle.amp.auto_cast``/``decorate``/
    ``GradScaler``): ``O2`` over ``O1``; None when the script called none."""
    levels = raw.get("amp") or []
    return "O2" if "O2" in levels else ("O1" if levels else None)


def called_distributed(raw: dict) -> str | None:
    """The distributed strategy the script's calls in the dry run mark: ``fleet`` (``fleet.init``/
    ``distributed_model``/``distributed_optimizer``), else ``data_parallel`` (``init_parallel_env``,
    ``DataParallel``, ``spawn``); None when it made none."""
    calls = [str(c) for c in raw.get("distributed_calls") or []]
    if any(c.startswith("fleet.") and c not in ("fleet.worker_num", "fleet.worker_index") for c in calls):
        return "fleet"
    if any(c in ("init_parallel_env", "DataParallel") or c.startswith("spawn(") for c in calls):
        return "data_parallel"
    return None


def _steps_in_their_unit(raw: dict) -> list[dict]:
    """The measured steps, counted in the model's rows instead of ``loader_batch`` when no DataLoader fed them and
    every step's forward calls saw fewer rows than that: the rows were a tensor the script created and slices
    micro-batches from, one per optimizer step (a data set of 64 rows, not a batch of 64); gradient accumulation
    (32 calls of 2 per step from 64 rows) keeps its count."""
    steps = [s for s in raw.get("steps") or [] if s.get("measured") and s.get("batch")]
    sliced = bool(steps) and not raw.get("loaders") and all(
        s.get("loader_batch") and s["batch"] * max(1, int(s.get("fwd_calls") or 1)) < s["loader_batch"] for s in steps)
    return [{**s, "loader_batch": None} for s in steps] if sliced else steps


def epoch_walk_findings(raw: dict) -> list[Finding]:
    """What the dry run read of the training loaders' first epoch (issue 18 item 3): an info finding when it read the
    whole epoch and measured at its largest batch; a warning when the walk was cut at its bounds (the figure is the
    largest batch of the part read) or the samples could not be read (the figure is for the batches seen)."""
    out = []
    for w in raw.get("epoch_walk") or []:
        if not w.get("read"):
            e = w.get("error")
            out.append(Finding(severity="warning", code="epoch-lengths-unread", message=(
                ("the training loader's data set is an IterableDataset, read in order and not by index: the dry run "
                 "could not read its first epoch ahead of the steps" if w.get("in_order") else
                 "the dry run could not read the training loader's samples over its first epoch"
                 + (f" ({e})" if e else "")) + "; "
                "the figure is for the batches it saw, and a longer or larger batch later in the epoch may need "
                "more: " + SIZE_ADVICE + ".")))
            continue
        if w.get("varies"):
            out.append(Finding(severity="warning", code="input-size-random", message=(
                "the training data set gave other sizes when the dry run read the same samples again (sizes drawn "
                "at random at every read, e.g. a random resize in __getitem__): the figure is for the batches the "
                "steps drew, and a larger draw may need more: set task.input_shape to the largest size the "
                "transform makes (the figure is then sized to it), or keep headroom.")))
            continue
        mib = 1 << 20
        what = (f"batch {w['largest_at'] + 1} of {w['batches']} ({w['largest_batch']} samples, "
                f"{w['largest_bytes'] / mib:,.2f} MiB of inputs; the first held {w['first_bytes'] / mib:,.2f} MiB)")
        if w.get("complete"):
            out.append(Finding(severity="info", code="epoch-largest-batch", message=(
                f"the dry run read the training loader's first epoch ({w['batches']} batches, {w['seconds']:.1f} s) "
                f"and measured at its largest batch, {what}.")))
        else:
            out.append(Finding(severity="warning", code="epoch-walk-cut", message=(
                f"the dry run read {w['samples']} samples ({w['batches']} batches) of the training loader's first "
                f"epoch within its bounds ({w['seconds']:.1f} s) and measured at the largest of those, {what}; it "
                "assumed the rest of the epoch holds no larger batch: " + SIZE_ADVICE + ".")))
    return out


def _bound_largest_input(dr: DryRun, groups: dict[tuple, list[dict]], phases: list[PhasePeak], target: int,
                         unit: Any, own_batches: set[int]) -> bool:
    """Raise the training phase of the largest input to :func:`shape_bound` when that is larger, and say so.

    :returns: whether the main phase (``phases[0]``, ``dr.train_peak_bytes``) was raised."""
    got = shape_bound(groups, target, unit, own_batches)
    if got is None:
        return False
    bound, big, src = got
    shapes = [d["shape"][1:] for d in big.get("inputs") or [] if d.get("shape")]
    phase = next((p for p in phases if p.name == "train" and p.input_shapes == shapes), None)
    if phase is None or phase.peak_bytes >= bound:
        return False
    i = phases.index(phase)
    phases[i] = phase.model_copy(update={"peak_bytes": bound, "extrapolated": True})
    if i == 0:
        dr.train_peak_bytes = bound
    src_shapes = [d["shape"][1:] for d in src.get("inputs") or [] if d.get("shape")]
    dr.findings.append(Finding(severity="warning", code="input-size-bounded", message=(
        f"the largest training input the steps had ({shapes}) was measured at batch {unit(big)} only, not at batch "
        f"{target}; its peak at batch {target} is bounded from the step at {src_shapes}, batch {target}, its "
        f"allocations above the step's start scaled by the elements per sample: {bound / 2**20:,.1f} MiB, an upper "
        "bound for activations that grow no faster than the input (to have it measured, let the script draw only "
        "its largest size in the dry run, e.g. through task.args if it takes its sizes from there).")))
    return i == 0


StepUnit: TypeAlias = Callable[[dict], int]
"""How a measured step's batch is counted: the loader's batch or the model's leading dimension."""


class _TrainFit(NamedTuple):
    """One input shape's training-step peak at its batch (bytes), the slope there (bytes per sample), whether the
    peak was extrapolated, where the slope came from, and the measured ``(batch, peak)`` points."""

    peak: int
    slope: float | None
    extrapolated: bool
    source: str
    measured: list[tuple[int, int]]


def _loader_batch(step: dict) -> int:
    return step["loader_batch"]


def _model_batch(step: dict) -> int:
    return step["batch"]


def _read_what_it_called(dr: DryRun, raw: dict) -> None:
    """The script's parameters, optimizer, AMP, distributed calls, inputs and loaders, whatever the outcome."""
    dr.params, dr.trainable = raw.get("params"), raw.get("trainable")
    dr.optimizer = (raw.get("optimizer") or [None])[0]
    dr.amp, dr.distributed, dr.has_conv = called_amp(raw), called_distributed(raw), raw.get("conv")
    dr.inputs = raw.get("inputs")
    dr.loaders = raw.get("loaders") or []
    nws = [n for n in raw.get("num_workers") or []]
    if nws:
        dr.num_workers = max(n for n in nws if isinstance(n, int)) if all(isinstance(n, int) for n in nws) else None


def _not_started(dr: DryRun, res: SandboxResult | None, disk: str | None, timeout: float) -> DryRun:
    """``dr`` when the child wrote no report: its disk bound, its timeout, or how the process ended."""
    if disk:
        dr.outcome, dr.reason = "cannot-run", disk
    elif res is not None and res.timed_out:
        dr.outcome, dr.reason = "timeout", f"it did not get past its start within {timeout:.0f} s"
    else:
        tail = "; ".join((res.stderr if res else "").strip().splitlines()[-2:])[:300]
        dr.outcome = "tool-failure"
        dr.reason = f"the dry-run process ended before starting the script (exit {res.returncode if res else '?'}" \
                    + (f": {tail}" if tail else "") + ")"
    return dr


def _last_line(text: str) -> str:
    """The last non-empty line of a process's output: what a script says as it exits (argparse's "error: the following
    arguments are required: --config")."""
    return next((line.strip() for line in reversed((text or "").splitlines()) if line.strip()), "")


def _no_steps(dr: DryRun, raw: dict, res: SandboxResult | None, disk: str | None, timeout: float) -> DryRun:
    """``dr`` when the script made no measured training step: why (disk, timeout, its error, its exit, no loop)."""
    err = raw.get("error")
    if disk:
        dr.outcome, dr.reason = "cannot-run", disk
    elif res is not None and res.timed_out:
        what = "the first training step" if raw.get("inputs") is None else "two training steps"
        dr.outcome, dr.reason = "timeout", f"it did not reach the end of {what} within {timeout:.0f} s"
    elif err:
        dr.outcome, dr.reason = classify(err)
        uf = err.get("user_frame") or {}
        if uf:
            dr.error_line = uf.get("line") if uf.get("file") == raw.get("script", uf.get("file")) else uf.get("line")
    elif raw.get("end") == "exit" and raw.get("exit_code"):
        dr.outcome = "cannot-run"
        said = SANDBOX_WORK.sub(SCRIPT_FOLDER, raw.get("exit_message") or _last_line(res.stderr if res is not None else ""))
        dr.reason = (f"it exited with status {raw['exit_code']} before training"
                     + (f" ({_short(said)})" if said else "")
                     + " (missing arguments? set task.args)")
    else:
        dr.outcome = "no-steps"
        dr.reason = ("it ran to its end without an optimizer step (no training loop runs under "
                     "__main__, or it does not call optimizer.step()/minimize())")
    return dr


def _batch_unit(dr: DryRun, main: list[dict]) -> StepUnit:
    """Set ``dr.axis_ratio`` and ``dr.axis`` from the main input shape's steps; the unit its batches count in."""
    ratio = axis_ratio(main)
    pairs = {(s.get("loader_batch"), s["batch"]) for s in main}
    dr.axis_ratio = ratio
    # the spec's batch counts what the loader hands out; the model's leading dimension may count other rows
    dr.axis = "loader" if ratio else ("unknown" if ratio is None and all(w for w, _ in pairs) else "model")
    return _loader_batch if dr.axis != "model" else _model_batch


def _replay_slope(raw: dict) -> float | None:
    """Bytes per sample between the first and last batch of the child's short model replay, or None."""
    replay = raw.get("replay") or []
    if len(replay) >= 2 and replay[-1][0] != replay[0][0]:
        return max(0.0, (replay[-1][1] - replay[0][1]) / (replay[-1][0] - replay[0][0]))
    return None


def _step_peaks(group: list[dict], unit: StepUnit) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """Forward-backward peak, update peak and start bytes per batch of one input shape's steps; a first step at a
    size, after another size, is left out where a steady step at that size stands."""
    fb: dict[int, int] = {}
    up: dict[int, int] = {}
    start: dict[int, int] = {}
    steady = {unit(s) for s in group if s.get("steady")}
    for s in group:
        b = unit(s)
        if b in steady and not s.get("steady"):
            continue  # a first step at this size, after another size: the steady one stands
        adj = 0 if s.get("steady") else int(s.get("kept_adjust") or 0)
        fb[b] = max(fb.get(b, 0), s["fwd_bwd_peak"] + adj)
        up[b] = max(up.get(b, 0), s["update_peak"] + adj)
        start[b] = min(start.get(b, 1 << 62), s["start_bytes"])
    return fb, up, start


def _one_size_fit(fb: dict[int, int], up: dict[int, int], start: dict[int, int], target: int, axis: str,
                  replay_slope: float | None, v_fb: int, v_up: int) -> tuple[int, int, float, str]:
    """Forward-backward and update peaks at ``target`` and the slope, from steps at one batch size only: a bound
    when the axis is unknown, else along the replay's slope or the step's own activations."""
    b = next(iter(fb))
    if axis == "unknown":  # one loader size, rows of another count: a bound
        sl_fb = max(0.0, (fb[b] - start[b]) / b)
        if target > b:
            v_fb = int(start[b] + (fb[b] - start[b]) * target / b)
            v_up = int(start[b] + (up[b] - start[b]) * target / b)
        return v_fb, v_up, sl_fb, "axis-unknown"
    if replay_slope is not None:
        sl_fb, src = replay_slope, "replay"
    else:
        sl_fb, src = max(0.0, (fb[b] - start[b]) / b), "proportional"
    if target != b:
        v_fb = int(fb[b] + (target - b) * sl_fb)
        share = max(0.0, (up[b] - start[b]) / b)
        v_up = int(up[b] + (target - b) * min(share, sl_fb))
    return v_fb, v_up, sl_fb, src


def _fit_train_phase(group: list[dict], batch: int, axis: str, own_batches: set[int], unit: StepUnit,
                     replay_slope: float | None) -> _TrainFit:
    """One input shape's training-step peak at its batch (see :func:`group_batch`), from its measured steps."""
    target = group_batch(group, batch, own_batches, unit)
    fb, up, start = _step_peaks(group, unit)
    v_fb, sl_fb, ex = _line(fb, target)
    v_up, sl_up, _ = _line(up, target)
    src = "measured"
    if sl_fb is None:  # one batch size only
        v_fb, v_up, sl_fb, src = _one_size_fit(fb, up, start, target, axis, replay_slope, v_fb, v_up)
    peak = max(v_fb, v_up)
    slope = sl_fb if v_fb >= v_up else (sl_up if sl_up is not None else sl_fb)
    return _TrainFit(int(peak), slope, ex or target not in fb, src, sorted({(b, max(fb[b], up[b])) for b in fb}))


def _other_train_phases(dr: DryRun, groups: dict[tuple, list[dict]], main_key: tuple, target: int,
                        own_batches: set[int], unit: StepUnit, replay_slope: float | None) -> list[PhasePeak]:
    """The training phases of the input shapes other than the main one, each at its batch."""
    phases = []
    for k, group in groups.items():
        if k is main_key:
            continue
        fit = _fit_train_phase(group, dr.batch or 1, dr.axis, own_batches, unit, replay_slope)
        phases.append(PhasePeak(
            name="train", batch_size=group_batch(group, target, own_batches, unit), peak_bytes=fit.peak,
            extrapolated=fit.extrapolated, measured=sorted({(unit(s), s["peak"]) for s in group}),
            input_shapes=[list(x[0]) for x in k], input_dtypes=[x[1] for x in k]))
    return phases


def _eval_phase(k: tuple, group: list[dict], rows: float) -> PhasePeak:
    """One input shape's evaluation peak at the script's own evaluation batch (in the loader's unit)."""
    pts: dict[int, int] = {}
    start: dict[int, int] = {}
    for e in group:
        eb_seen = max(1, round(e["batch"] / rows))  # in the loader's unit, as its native batch is
        pts[eb_seen] = max(pts.get(eb_seen, 0), e.get("steady_peak") or e["peak"])
        start[eb_seen] = min(start.get(eb_seen, 1 << 62), e["start_bytes"])
    natives: list[int] = [e["native_batch"] for e in group if e.get("native_batch")]
    eb = max(natives) if natives else max(pts)
    if eb in pts or len(pts) >= 2:
        v, _, ex = _line(pts, eb)
    else:
        b = max(pts)
        v, ex = int(start[b] + (pts[b] - start[b]) * eb / b), True
    flo = [e["fwd_flops"] / max(1.0, e["batch"] / rows) for e in group if e.get("fwd_flops")]
    return PhasePeak(
        name="eval", batch_size=eb, peak_bytes=int(v), extrapolated=ex, measured=sorted(pts.items()),
        input_shapes=[list(x[0]) for x in k], input_dtypes=[x[1] for x in k],
        forward_flops_per_sample=max(flo) if flo else None, grad=any(e.get("grad") for e in group))


def _eval_phases(dr: DryRun, raw: dict) -> list[PhasePeak]:
    """The evaluation phases, one per input shape (a partial evaluation cut by the timeout included)."""
    egroups: dict[tuple, list[dict]] = {}
    evals = list(raw.get("evals") or [])
    if raw.get("eval_partial"):  # killed on its timeout after an evaluation forward ended
        evals.append(raw["eval_partial"])
    for e in evals:
        if e.get("batch"):
            egroups.setdefault(_key(e.get("inputs")), []).append(e)
    rows = dr.axis_ratio if dr.axis == "loader" and dr.axis_ratio else 1.0
    return [_eval_phase(k, group, rows) for k, group in egroups.items()]


def _cut_short_findings(res: SandboxResult | None, disk: str | None, timeout: float) -> list[Finding]:
    """What stopped the dry run after its measured training steps: its time limit, its disk bound."""
    findings = []
    if res is not None and res.timed_out:
        findings.append(Finding(severity="info", code="dry-run-timeout", message=(
            f"the dry run reached its {timeout:.0f} s limit after measuring the training step; what it measured is "
            "used (the evaluation pass, if any, may be missing).")))
    if disk:
        findings.append(Finding(severity="warning", code="dry-run-incomplete", message=(
            f"after the measured training steps the dry run was stopped: {disk}; what ran before is used.")))
    return findings


def _extrapolation_findings(dr: DryRun, main: list[dict], target: int, b_seen: int, fit: _TrainFit,
                            bounded: bool) -> list[Finding]:
    """How the training peak at ``target`` was extrapolated from the batches the steps ran at, and on which axis."""
    findings = []
    if fit.extrapolated and fit.source == "measured" and target > max(dr.batch_sizes):
        findings.append(Finding(severity="info", code="dry-run-extrapolated", message=(
            f"the training step ran at batch sizes {dr.batch_sizes} (what the time budget or the script's own number "
            f"of steps allowed); the peak at batch {target} is extrapolated along the last two, "
            f"{bytes_text(dr.act_bytes_per_sample)} per sample (measured within 5% on the benchmark; pass more "
            "steps in task.args to let it reach the batch itself).")))
    findings.extend(_axis_findings(dr, main, target, fit.source))
    if b_seen != target and fit.source not in ("measured", "axis-unknown") and not bounded:
        findings.append(Finding(severity="warning", code="dry-run-extrapolated", message=(
            f"the training step ran at batch {b_seen} only ({FIXED_BATCH_TEXT}); the peak at batch {target} "
            f"is extrapolated with a slope of {bytes_text(dr.act_bytes_per_sample)} per sample from "
            + ("a short replay of the model at two batch sizes" if fit.source == "replay" else
               "the step's own activations (an upper bound)") + ".")))
    return findings


def _late_error_findings(err: dict | None) -> list[Finding]:
    """The script's error after its measured training steps: an error finding when it is the script's own."""
    if not err:
        return []
    outcome, why = classify(err)
    uf = err.get("user_frame") or {}
    where = f"line {uf['line']}: " if uf.get("line") else ""
    if outcome == "user-error":
        return [Finding(severity="error", code="script-error", line=uf.get("line"), message=(
            f"{where}after the measured training steps, the script raised {why} (in its {err.get('during')} phase, "
            "run as the launcher would, on CPU); it would stop the real run there too."))]
    return [Finding(severity="warning", code="dry-run-incomplete", message=(
        f"after the measured training steps the dry run stopped because {why}; what ran before is used."))]


def _note_findings(raw: dict) -> list[Finding]:
    """The child's notes, and what the allocator replay reserves (not in the estimate)."""
    findings = [Finding(severity="info", code="dry-run-note", message=f"dry run: {n}.") for n in raw.get("notes") or []]
    rep = raw.get("alloc_replay")
    if rep and rep.get("peak_allocated"):
        findings.append(Finding(severity="info", code="allocator-replay", message=(
            f"the first measured step's {rep['events']} allocation events, replayed through a model of Paddle's GPU "
            f"auto_growth allocator (256-byte alignment, best fit, chunks kept), reserve "
            f"{rep['peak_reserved'] / 2**20:,.1f} MiB for an allocated peak of {rep['peak_allocated'] / 2**20:,.1f} MiB "
            f"(x{rep['peak_reserved'] / rep['peak_allocated']:.3f}); not yet checked against a GPU, so not in the "
            "estimate.")))
    return findings


def _accumulation_findings(main: list[dict], target: int) -> list[Finding]:
    """An info finding when every measured step drew several loader batches before its optimizer update (gradient
    accumulation): what the peak and the step's FLOPs at batch ``target`` then count."""
    draws = {int(s.get("draws") or 0) for s in main}
    if not draws or min(draws) < 2:
        return []
    k, b = max(draws), target
    return [Finding(severity="info", code="gradient-accumulation", message=(
        f"the script draws {k} batches from its loader per optimizer update (gradient accumulation): the peak is "
        f"that of one micro-batch of {b}, while flops_per_step counts the {k} micro-batches of an update ({k} x {b} "
        "samples): a step here is an update, and its estimated time is that of the whole accumulation. "
        "task.batch_size_per_gpu counts a micro-batch (a loader batch), not the update's effective batch."))]


def _measured(dr: DryRun, raw: dict, res: SandboxResult | None, steps: list[dict], disk: str | None, *,
              target_batch: int | None, timeout: float) -> DryRun:
    """``dr`` from the measured training steps: the phases at their batches, the slope, and what to say."""
    dr.outcome = "measured"
    groups: dict[tuple, list[dict]] = {}
    for s in steps:
        groups.setdefault(_key(s.get("inputs")), []).append(s)
    main_key = max(groups, key=lambda k: (len({s["batch"] for s in groups[k]}), len(groups[k])))
    main = groups[main_key]
    unit = _batch_unit(dr, main)
    b_seen = max(unit(s) for s in main)
    target = target_batch or script_native(raw) or b_seen
    dr.batch = target
    replay_slope = _replay_slope(raw)
    own_batches = {int(ld["batch_size"]) for ld in dr.loaders if type(ld.get("batch_size")) is int
                   and ld["batch_size"] > 1} if target_batch is None and len(groups) >= 2 else set()
    fit = _fit_train_phase(main, dr.batch or 1, dr.axis, own_batches, unit, replay_slope)
    dr.train_peak_bytes = fit.peak
    dr.act_bytes_per_sample = int(max(0.0, fit.slope or 0.0))
    dr.slope_source = fit.source
    dr.batch_sizes = sorted({unit(s) for s in main})
    calls = [s for s in main if s.get("fwd_calls")]
    flops = [s["fwd_flops"] / s["fwd_calls"] / unit(s) for s in calls if s.get("fwd_flops")]
    dr.forward_flops_per_sample = max(flops) if flops else None
    dr.pair_flops_share = max([min(1.0, s.get("pair_flops", 0.0) / s["fwd_flops"]) for s in calls if s.get("fwd_flops")],
                              default=0.0)
    dr.step_flops_per_sample = step_flops_per_sample(main, unit, len(raw.get("optimizer") or []), steps)
    phases = [PhasePeak(
        name="train", batch_size=group_batch(main, target, own_batches, unit), peak_bytes=fit.peak,
        extrapolated=fit.extrapolated, measured=fit.measured,
        input_shapes=[d["shape"][1:] for d in main[0].get("inputs") or [] if d.get("shape")],
        input_dtypes=[d["dtype"] for d in main[0].get("inputs") or [] if d.get("shape")],
        forward_flops_per_sample=dr.forward_flops_per_sample, slope_bytes_per_sample=dr.act_bytes_per_sample,
        step_flops_per_sample=dr.step_flops_per_sample)]
    phases += _other_train_phases(dr, groups, main_key, target, own_batches, unit, replay_slope)
    phases += _eval_phases(dr, raw)
    bounded = _bound_largest_input(dr, groups, phases, target, unit, own_batches)
    dr.phases = phases
    dr.tensor_peak_bytes = max(p.peak_bytes for p in phases)
    seen = f"batch {dr.batch_sizes[0]}" if len(dr.batch_sizes) == 1 else f"batch sizes {dr.batch_sizes}"
    how = (f"at batch {target}" if dr.batch_sizes == [target] else
           f"at {seen}, " + ("extrapolated to" if fit.extrapolated else "the figure at") + f" {target}")
    if (native := script_native(raw)) and native != target:  # the loader driven to the estimate's batch
        how += f" (the batch the estimate is for; the script's own loader batch is {native})"
    dr.reason = f"the script ran {len(steps)} measured training step(s) {how}"
    dr.findings.extend(_cut_short_findings(res, disk, timeout))
    dr.findings.extend(_extrapolation_findings(dr, main, target, b_seen, fit, bounded))
    dr.findings.extend(_late_error_findings(raw.get("error")))
    dr.findings.extend(epoch_walk_findings(raw))
    dr.findings.extend(_accumulation_findings(main, target))
    dr.findings.extend(_note_findings(raw))
    return dr


def summarize(raw: dict, res: SandboxResult | None, *, target_batch: int | None, timeout: float) -> DryRun:
    """Turn the child's result file into a :class:`DryRun` at ``target_batch`` (None: the script's own batch)."""
    seconds = res.seconds if res is not None else 0.0
    dr = DryRun(outcome="tool-failure", reason="", seconds=seconds, raw=raw)
    steps = _steps_in_their_unit(raw)
    _read_what_it_called(dr, raw)
    if raw.get("report_error"):
        dr.outcome = "tool-failure"
        dr.reason = (f"its report could not be used ({raw['report_error']}): autodl's measurement, or the script "
                     "wrote over it; not an error of the script's training")
        return dr
    disk = _disk_reason(res)
    if not raw:
        return _not_started(dr, res, disk, timeout)
    if not steps:
        return _no_steps(dr, raw, res, disk, timeout)
    return _measured(dr, raw, res, steps, disk, target_batch=target_batch, timeout=timeout)


__all__ = ["DryRun", "run_dry_run", "summarize", "classify", "first_batch"]
