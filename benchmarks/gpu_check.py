"""First contact with a real GPU: inventory, booking, a pinned PyTorch run, its memory, an OOM and the release, checked.

Runs autodl's own steps (``autodl inventory --pool nvml --json``, then :mod:`autodl.pipeline`'s wait/book, launch,
collect and release-and-record with the local launcher) against whatever NVML this host has, and writes
``gpu_check.json`` and ``gpu_check.txt`` into ``--out``. Each step is ``ok``, ``failed`` (with why) or
``not run`` (with why: no torch, no CUDA, no nvidia-smi); a step that cannot run never stops the others.
It only reads the card: no MIG change, no reset, no clock or power setting (item 8 of issue 22).

The same file is the training it launches (``--child train|oom``): a small PyTorch MLP that reports, through
``$AUTODL_REPORT_FILE``, what it sees (CUDA_VISIBLE_DEVICES, the visible devices and their UUIDs), its CUDA
context and first-allocation overhead, and PyTorch's own peak counters. ``scripts/gpu_check.sh`` is the one
command to run it; ``docs/gpu-check.md`` says how.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
SMI_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "mig.mode.current", "utilization.gpu",
              "temperature.gpu", "power.draw", "driver_version")
"""``nvidia-smi --query-gpu`` fields read beside NVML (``nvidia-smi --help-query-gpu``); memory in MiB, power in W."""

TOLERANCE = {"memory_total_bytes": 1 * MiB, "memory_used_bytes": 256 * MiB, "utilization_pct": 10.0,
             "temperature_c": 3.0, "power_w": 10.0}
"""How far NVML (through autodl) and nvidia-smi may differ: both read the same driver counters, at moments a second
or two apart; nvidia-smi rounds memory to MiB. Used memory of an idle card moves by a few MiB, utilization by its
sampling window, temperature by a degree or two, power by a few W (power also within 10 %)."""

PEAK_TOLERANCE_BYTES = 256 * MiB
"""How far the run's NVML per-process peak may be from PyTorch's ``max_memory_reserved`` + the measured CUDA
context: NVML samples once a second and also counts cuBLAS/cuDNN workspaces outside PyTorch's caching allocator."""

TRAIN_STEPS, TRAIN_BATCH, TRAIN_WIDTH = 30, 512, 4096
"""The child's training: a 3-layer MLP of width 4096 (about 200 MB of float32 weights), batch 512, 30 Adam steps."""

PLANNED_PEAK_BYTES = 4 * GiB
"""The peak the check books the run for: above what the child needs (weights + Adam state + activations < 2 GiB)."""


@dataclass
class Check:
    name: str
    ok: bool | None  # None: could not be told (unknown), never counted as passed
    detail: str = ""


@dataclass
class Step:
    name: str
    status: str = "ok"  # ok | failed | not run
    why: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    def check(self, name: str, ok: bool | None, detail: str = "") -> bool | None:
        self.checks.append(Check(name, ok, detail))
        if ok is False and self.status == "ok":
            self.status, self.why = "failed", f"{name}: {detail}"
        return ok

    def skip(self, why: str) -> Step:
        self.status, self.why = "not run", why
        return self


# ------------------------------------------------------------------------------------------------ the child
def _own_gpu_bytes(uuid: str | None, pid: int) -> tuple[int | None, str]:
    """(this process's memory on ``uuid`` per NVML, how): by pid; else device-wide used (v2), when NVML lists no
    such pid (a container's pids are not the host's)."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == pid and p.usedGpuMemory is not None:
                    return int(p.usedGpuMemory), "nvml process"
            mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
            return int(mem.used), "nvml device used (pid not listed)"
        finally:
            nv.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - the figure is unknown, said in the report
        return None, f"unknown ({type(exc).__name__}: {exc})"


def _child_visible(torch: Any, report: dict[str, Any]) -> None:
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    report["visible_count"] = len(props)
    report["visible_names"] = [p.name for p in props]
    report["visible_uuids"] = ["GPU-" + str(p.uuid) if not str(p.uuid).startswith("GPU-") else str(p.uuid)
                               for p in props if hasattr(p, "uuid")]
    report["total_memory_bytes"] = props[0].total_memory if props else None


def _child_memory_terms(torch: Any, report: dict[str, Any], uuid: str | None) -> None:
    """CUDA context (NVML, after a context exists and before any allocation) and first-allocation overhead."""
    pid = os.getpid()
    before, how = _own_gpu_bytes(uuid, pid)
    torch.cuda.init()
    torch.empty(0, device="cuda")  # creates the context, allocates nothing
    torch.cuda.synchronize()
    context, how = _own_gpu_bytes(uuid, pid)
    if context is not None and how.startswith("nvml device") and before is not None:
        context -= before
    first = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    after, _ = _own_gpu_bytes(uuid, pid)
    if after is not None and how.startswith("nvml device") and before is not None:
        after -= before
    report.update(context_bytes=context, context_how=how, first_allocation_total_bytes=after,
                  first_allocation_reserved_bytes=torch.cuda.memory_reserved())
    del first


def _child_train(torch: Any, report: dict[str, Any]) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(TRAIN_WIDTH, TRAIN_WIDTH) for _ in range(3)]).cuda()
    opt = torch.optim.Adam(model.parameters())
    for _ in range(TRAIN_STEPS):
        loss = model(torch.randn(TRAIN_BATCH, TRAIN_WIDTH, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    time.sleep(2.5)  # the collector samples once a second: let it see the run at its peak
    report.update(max_memory_reserved_bytes=torch.cuda.max_memory_reserved(),
                  max_memory_allocated_bytes=torch.cuda.max_memory_allocated(), steps=TRAIN_STEPS,
                  loss=float(loss))


def child(mode: str) -> int:
    """The launched training (``--child``): reports what it sees to ``$AUTODL_REPORT_FILE``; exit 0, or the OOM's."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    report: dict[str, Any] = {"mode": mode, "pid": os.getpid(), "cuda_visible_devices": visible}
    out = os.environ.get("AUTODL_REPORT_FILE")

    def write() -> None:
        if out:
            Path(out).write_text(json.dumps(report))

    try:
        import torch
    except ImportError as exc:
        report["torch"] = f"not run: torch is not installed ({exc})"
        write()
        return 0
    report["torch"] = torch.__version__
    if not torch.cuda.is_available():
        report["cuda"] = "not run: torch.cuda.is_available() is False"
        write()
        return 0
    _child_visible(torch, report)
    uuid = visible.split(",")[0] if visible else None
    _child_memory_terms(torch, report, uuid)
    if mode == "oom":
        report["oom_requested_bytes"] = int(report["total_memory_bytes"] * 1.25)
        write()
        torch.empty(report["oom_requested_bytes"], dtype=torch.uint8, device="cuda")  # raises OutOfMemoryError
        return 0
    _child_train(torch, report)
    write()
    return 0


CAP_CHECK_BYTES = 1 * GiB
"""The cap step 9 puts on its Paddle child (``autodl.policy.packing.memory_cap_env`` of 1 GiB); the child then asks
for a quarter of it (must succeed) and for twice it in one allocation (must raise, if the cap holds)."""


def paddle_cap_child() -> int:
    """Step 9's child (``--child paddle-cap``): under the cap flags in its environment and Paddle's default allocator,
    allocate within the cap, then past it; print one JSON line saying what Paddle did. Exit 0 either way."""
    report: dict[str, Any] = {"pid": os.getpid()}
    try:
        import paddle

        report["paddle"] = paddle.__version__
        report["flags"] = paddle.get_flags(["FLAGS_allocator_strategy", "FLAGS_gpu_memory_limit_mb",
                                            "FLAGS_fraction_of_gpu_memory_to_use"])
        paddle.set_device("gpu")
        cap = int(os.environ["FLAGS_gpu_memory_limit_mb"]) * MiB
        within = paddle.zeros([cap // 4], dtype="uint8")
        report["within_cap_ok"] = int(within.shape[0]) == cap // 4
        try:
            past = paddle.zeros([2 * cap], dtype="uint8")
            report["past_cap_raised"] = False
            report["past_cap_bytes"] = int(past.shape[0])
        except Exception as exc:  # noqa: BLE001 - what Paddle raised is the measurement
            report["past_cap_raised"] = True
            report["past_cap_error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
        report["max_memory_reserved_bytes"] = int(paddle.device.cuda.max_memory_reserved())
    except Exception as exc:  # noqa: BLE001 - said in the report
        report["error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
    print(json.dumps(report), flush=True)
    return 0


def probe_paddle(python: str) -> dict[str, Any]:
    """Paddle's version and whether it is built with CUDA and sees a GPU, asked in a subprocess."""
    code = ("import json\ntry:\n    import paddle\n"
            "except ImportError as e:\n    print(json.dumps({'why': f'paddle is not installed ({e})'}))\n"
            "else:\n    ok = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0\n"
            "    print(json.dumps({'paddle': paddle.__version__, 'cuda': bool(ok), 'why': None if ok else\n"
            "                      'Paddle is not built with CUDA or sees no GPU (a CPU build)'}))\n")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001
        return {"why": f"could not ask paddle: {type(exc).__name__}: {exc}"}


def check_paddle_cap(python: str, device: dict[str, Any]) -> Step:
    """9: a packed run's cap (``autodl.launch.base.memory_cap``) under Paddle's default ``auto_growth`` allocator: an
    allocation past ``FLAGS_gpu_memory_limit_mb`` raises in the process that made it (the design's rule 4)."""
    from autodl.policy.packing import memory_cap_env

    step = Step("9 Paddle memory cap under auto_growth")
    info = probe_paddle(python)
    step.figures["paddle"] = info.get("paddle") or "-"
    if not info.get("cuda"):
        return step.skip(f"not run: {info.get('why')}; the launchers keep saying 'memory cap not verified under "
                         "auto_growth'")
    env = {**os.environ, **memory_cap_env(CAP_CHECK_BYTES, int(device["memory_total_bytes"])),
           "FLAGS_allocator_strategy": "auto_growth", "CUDA_VISIBLE_DEVICES": device["uuid"]}
    done = subprocess.run([python, __file__, "--child", "paddle-cap"], env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    report = json.loads(lines[-1]) if lines else {"error": f"exit {done.returncode}: {done.stderr[-600:]}"}
    step.figures.update(cap_bytes=CAP_CHECK_BYTES, child=report,
                        max_memory_reserved_bytes=report.get("max_memory_reserved_bytes", "-"))
    if report.get("error"):
        step.check("the Paddle child ran", False, report["error"])
        return step
    step.check("an allocation of a quarter of the cap succeeds", report.get("within_cap_ok") is True,
               str(report.get("within_cap_ok")))
    step.check("an allocation of twice the cap raises in the process", report.get("past_cap_raised") is True,
               report.get("past_cap_error") or f"allocated {report.get('past_cap_bytes')} bytes past a "
                                               f"{CAP_CHECK_BYTES}-byte cap: auto_growth ignores the cap")
    return step


# ------------------------------------------------------------------------------------------------ helpers
def probe_torch(python: str) -> dict[str, Any]:
    """torch's version and whether CUDA works, asked in a subprocess (this process never creates a CUDA context)."""
    code = (
        "import json\n"
        "try:\n    import torch\n"
        "except ImportError as e:\n    print(json.dumps({'why': f'torch is not installed ({e})'}))\n"
        "else:\n    ok = torch.cuda.is_available()\n"
        "    print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cuda_available': ok,\n"
        "                      'why': None if ok else 'torch.cuda.is_available() is False'}))\n")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001
        return {"why": f"could not ask torch: {type(exc).__name__}: {exc}"}


def read_smi() -> tuple[list[dict[str, str]] | None, str]:
    """nvidia-smi's rows (field -> text), or None and why (absent, failed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi is not on PATH"
    done = subprocess.run([smi, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return None, f"nvidia-smi exited {done.returncode}: {(done.stderr or done.stdout).strip()[:300]}"
    rows = [dict(zip(SMI_FIELDS, (v.strip() for v in line.split(","))))
            for line in done.stdout.splitlines() if line.strip()]
    return rows, f"{smi} ({len(rows)} GPU(s))"


def smi_number(text: str | None) -> float | None:
    """nvidia-smi's value as a number; None for ``[N/A]``, ``N/A``, ``[Not Supported]`` and the like."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def compare_smi(device: dict[str, Any], row: dict[str, str], catalog: Any,
                inventory: list[dict[str, Any]]) -> list[Check]:
    """Each inventory figure of ``device`` beside nvidia-smi's (:data:`TOLERANCE`); unknown on either side stays unknown.

    :param row: one line of :func:`read_smi`.
    :param inventory: every device autodl listed (to see whether ``device`` is split into MIG instances).
    :returns: one :class:`Check` per figure; ``ok`` None where either side does not report it.
    """
    entry = catalog.find(row.get("name", ""))
    checks = [Check("model", entry is not None and entry.name == device["model"],
                    f"autodl {device['model']!r}, nvidia-smi {row.get('name')!r} -> catalog "
                    f"{entry.name if entry else None!r}")]
    smi_mig = (row.get("mig.mode.current") or "").strip("[]")
    ours_mig = any((d.get("labels") or {}).get("mig_parent") == device.get("uuid") for d in inventory)
    agrees = (smi_mig == "Enabled") == ours_mig if smi_mig in ("Enabled", "Disabled") else not ours_mig  # N/A: no MIG
    checks.append(Check("mig_mode", agrees, f"autodl {'MIG instances' if ours_mig else 'whole GPU'}, nvidia-smi {smi_mig!r}"))
    pairs = {"memory_total_bytes": ("memory.total", MiB), "memory_used_bytes": ("memory.used", MiB),
             "utilization_pct": ("utilization.gpu", 1), "temperature_c": ("temperature.gpu", 1),
             "power_w": ("power.draw", 1)}
    for key, (smi_key, unit) in pairs.items():
        ours, theirs = device.get(key), smi_number(row.get(smi_key))
        if ours is None or theirs is None:
            checks.append(Check(key, None, f"autodl {ours}, nvidia-smi {row.get(smi_key)!r}: unknown on one side"))
            continue
        theirs *= unit
        allowed = max(TOLERANCE[key], 0.1 * theirs) if key == "power_w" else TOLERANCE[key]
        checks.append(Check(key, abs(ours - theirs) <= allowed,
                            f"autodl {ours:g}, nvidia-smi {theirs:g} (within {allowed:g})"))
    return checks


def settings_snapshot(uuids: list[str]) -> dict[str, dict[str, str]]:
    """What a check must never change, per device, as text (an unreadable setting is its NVML error's text)."""
    import pynvml as nv

    reads = {"mig_mode": lambda h: nv.nvmlDeviceGetMigMode(h),
             "power_limit_mw": lambda h: nv.nvmlDeviceGetPowerManagementLimit(h),
             "compute_mode": lambda h: nv.nvmlDeviceGetComputeMode(h),
             "persistence_mode": lambda h: nv.nvmlDeviceGetPersistenceMode(h),
             "applications_clock_mhz": lambda h: nv.nvmlDeviceGetApplicationsClock(h, 0)}  # 0 = NVML_CLOCK_GRAPHICS
    out: dict[str, dict[str, str]] = {}
    nv.nvmlInit()
    try:
        for uuid in uuids:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            out[uuid] = {}
            for name, read in reads.items():
                try:
                    out[uuid][name] = str(read(handle))
                except Exception as exc:  # noqa: BLE001 - NotSupported, a binding without the call
                    out[uuid][name] = f"unreadable: {type(exc).__name__}"
    finally:
        nv.nvmlShutdown()
    return out


# ------------------------------------------------------------------------------------------------ the steps
def step_inventory(catalog: Any) -> tuple[Step, list[dict[str, Any]], dict[str, Any] | None]:
    """1: ``autodl inventory --pool nvml --json``, each figure of each GPU beside nvidia-smi's from the same run."""
    step = Step("1 inventory (NVML vs nvidia-smi)")
    done = subprocess.run([sys.executable, "-m", "autodl.cli", "inventory", "--pool", "nvml", "--json"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        step.check("autodl inventory", False, f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}")
        return step, [], None
    devices = json.loads(done.stdout)["devices"]
    step.figures["devices"] = devices
    usable = [d for d in devices if d.get("healthy") and d.get("uuid")]
    device = usable[0] if usable else None
    step.check("a healthy GPU with a UUID", device is not None, f"{len(devices)} device(s), {len(usable)} usable")
    for d in devices:
        model = (d.get("labels") or {}).get("catalog_model") or d["model"]  # a MIG instance: its GPU's model
        step.check(f"{d['device_id']}: model in the catalog", catalog.find(model) is not None, d["model"])
        api = (d.get("labels") or {}).get("nvml_memory_api")
        step.check(f"{d['device_id']}: memory info v2", None if api == "v1" else api == "v2",
                   f"NVML memory API {api!r} (v1: the driver has no v2; 'used' then counts reserved memory)")
        if d.get("unknown"):
            step.figures.setdefault("unknown", {})[d["device_id"]] = d["unknown"]
    rows, said = read_smi()
    step.figures["nvidia_smi"] = said
    if rows is None:
        step.checks.append(Check("nvidia-smi comparison", None, f"not run: {said}"))
        return step, devices, device
    step.figures["nvidia_smi_rows"] = rows
    by_uuid = {r.get("uuid"): r for r in rows}
    for d in devices:
        if (d.get("labels") or {}).get("mig_parent") or d.get("uuid") not in by_uuid:
            continue
        for c in compare_smi(d, by_uuid[d["uuid"]], catalog, devices):
            step.check(f"{d['device_id']}: {c.name}", c.ok, c.detail)
    return step, devices, device


def write_inputs(work: Path, mode: str, run_key: str) -> dict[str, Any]:
    """The spec and the declared profile of the child training (no Paddle here to profile a PyTorch script with)."""
    from autodl import pipeline
    from autodl.types import MemoryBreakdown, ResourceProfile

    spec = work / f"spec-{mode}.yaml"
    spec.write_text(f"# written by benchmarks/gpu_check.py: the {mode} child (PyTorch; the spec's framework field\n"
                    "# only names Paddle, launch/collect/release do not read it)\n"
                    f"task:\n  script: {json.dumps(str(Path(__file__).resolve()))}\n  args: [\"--child\", \"{mode}\"]\n"
                    f"  batch_size_per_gpu: {TRAIN_BATCH}\nscheduler:\n  timeout: 120\n  poke_interval: 1\nlauncher: local\n")
    params = 3 * (TRAIN_WIDTH * TRAIN_WIDTH + TRAIN_WIDTH)
    weights = 4 * params
    profile = ResourceProfile(
        script=str(Path(__file__).resolve()), params=params, peak_memory_bytes=PLANNED_PEAK_BYTES, batch_size=TRAIN_BATCH,
        breakdown=MemoryBreakdown(weights_bytes=weights, gradients_bytes=weights, optimizer_state_bytes=2 * weights,
                                  activations_bytes=PLANNED_PEAK_BYTES - 4 * weights),
        activation_bytes_per_sample=(PLANNED_PEAK_BYTES - 4 * weights) // TRAIN_BATCH,
        flops_per_step=6.0 * params * TRAIN_BATCH, method="static",
        method_reason="declared by benchmarks/gpu_check.py (PLANNED_PEAK_BYTES): a PyTorch child is not profiled")
    out = {"profile": profile.to_json(), "script": profile.script, "spec_path": str(spec)}
    (pipeline.state_dir(run_key) / "profile.json").write_text(json.dumps(out))
    return out


def step_book(work: Path, mode: str, log: Any) -> tuple[Step, Any, dict[str, Any], dict[str, Any] | None]:
    """2: plan the spec on the NVML pool and book the device (autodl's own wait step: queue, policy, ledger)."""
    from autodl import pipeline
    from autodl.ledger import Ledger

    step = Step(f"2 plan + book ({mode})")
    ctx = pipeline.RunContext(run_key=f"gpu_check.{mode}.{int(time.time())}", dag_id="gpu_check", run_id=mode)
    profile_out = write_inputs(work, mode, ctx.run_key)
    selection = None
    for _ in range(5):
        selection = pipeline.step_wait(ctx, profile_out, pool="nvml", log=log, poke_interval_s=1)
        if selection is not None:
            selection = selection.model_dump(mode="json")  # the typed Selection, as the XCom edge hands it on
            break
        time.sleep(1)
    if step.check("booked", selection is not None,
                  "granted" if selection else "the queue granted no device in 5 polls (busy?)") is False:
        return step, ctx, profile_out, None
    lease = Ledger().get(ctx.run_key)
    booked = [d["device_id"] for d in selection["devices"]]
    step.figures.update(run_key=ctx.run_key, booked=booked, model=selection["placement"].get("model"))
    step.check("lease in the ledger", lease is not None and list(lease.device_ids) == booked,
               f"lease {lease.device_ids if lease else None} vs selection {booked}")
    return step, ctx, profile_out, selection


def run_training(ctx: Any, profile_out: dict[str, Any], selection: dict[str, Any], log: Any) -> dict[str, Any]:
    """autodl's launch and collect steps on the booked device; what the child reported."""
    from autodl import pipeline
    from autodl.errors import AutoDLError

    out: dict[str, Any] = {"error": None}
    try:
        out["handle"] = pipeline.step_launch(ctx, profile_out, selection, log=log)
        out["metrics"] = pipeline.step_collect(ctx, out["handle"], interval_s=0.5, log=log)
    except AutoDLError as exc:  # a failed training (the OOM child) keeps its metrics
        out["error"] = f"{type(exc).__name__}: {exc}"
    folder = pipeline.state_dir(ctx.run_key)
    if "metrics" not in out and (folder / "metrics.json").exists():
        out["metrics"] = json.loads((folder / "metrics.json").read_text())
    report = folder / "report.json"
    out["report"] = json.loads(report.read_text()) if report.exists() else {}
    out["folder"] = str(folder)
    return out


def gpu_why(torch_info: dict[str, Any], report: dict[str, Any]) -> str | None:
    """Why the GPU-only parts cannot run here (no torch, no CUDA), or None."""
    if not torch_info.get("cuda_available"):
        return torch_info.get("why") or "CUDA is not available"
    if report.get("visible_count") is None:
        return report.get("cuda") or report.get("torch") or "the child reported nothing about CUDA"
    return None


def check_launch(run: dict[str, Any], uuid: str, torch_info: dict[str, Any]) -> Step:
    """3: launched pinned by UUID, and inside the child exactly the booked device is visible."""
    step = Step("3 launch pinned by UUID")
    handle, report = run.get("handle") or {}, run["report"]
    step.figures.update(pid=handle.get("pid"), log=handle.get("log_path"), child=report)
    said = f"pid {handle.get('pid')}" if handle else run["error"] or "no handle"
    if step.check("launched", bool(handle), said) is False:
        return step
    step.check("handle's devices", handle.get("device_ids") == [uuid], f"{handle.get('device_ids')} vs booked {uuid}")
    step.check("CUDA_VISIBLE_DEVICES in the child", report.get("cuda_visible_devices") == uuid,
               f"{report.get('cuda_visible_devices')!r} vs booked {uuid!r}")
    why = gpu_why(torch_info, report)
    if why:
        step.checks.append(Check("visible devices (torch)", None, f"not run: {why}"))
        return step
    step.check("exactly one device visible", report["visible_count"] == 1, f"{report['visible_count']} visible")
    step.check("the visible device is the booked one", report.get("visible_uuids") == [uuid],
               f"{report.get('visible_uuids')} vs {uuid}")
    return step


def check_collect(run: dict[str, Any], torch_info: dict[str, Any]) -> Step:
    """4: NVML per-process memory of the run's own processes, utilization samples, the timeline PNG, peak vs torch."""
    step = Step("4 collect")
    metrics, report = run.get("metrics") or {}, run["report"]
    said = f"exit code {metrics.get('exit_code')}" if metrics else run["error"] or "no metrics"
    if step.check("metrics", bool(metrics), said) is False:
        return step
    samples_path = Path(run["folder"]) / "samples.jsonl"
    samples = [json.loads(line) for line in samples_path.read_text().splitlines()] if samples_path.exists() else []
    keys = ("source", "samples", "exit_code", "process_peak_bytes", "device_used_peak_bytes", "others_memory_bytes",
            "peak_memory_bytes", "peak_source", "mean_utilization_pct", "max_utilization_pct", "notes")
    step.figures.update({k: metrics.get(k) for k in keys}, utilization_samples=[s.get("utilization_pct") for s in samples])
    step.check("sampled through NVML", metrics.get("source") == "nvml", f"source {metrics.get('source')!r}")
    step.check("samples taken", bool(samples), f"{len(samples)} samples in {samples_path.name}")
    own, on_gpu = metrics.get("process_peak_bytes"), gpu_why(torch_info, report) is None
    # a child with a CUDA context must show in NVML's per-process list; one without (no torch) must show nothing
    step.check("the run's own memory (not device-wide used)", None if own is None else (own > 0) == on_gpu,
               f"process peak {own}, device used peak {metrics.get('device_used_peak_bytes')}, "
               f"child {'had' if on_gpu else 'had no'} CUDA context")
    png = Path(run["folder"]) / "timeline.png"
    step.figures["timeline_png"] = str(png) if png.exists() else None
    step.check("timeline PNG", png.exists() and png.stat().st_size > 0, str(png))
    why = gpu_why(torch_info, report)
    if why:
        step.checks.append(Check("peak vs max_memory_reserved + context", None, f"not run: {why}"))
        return step
    expected = report["max_memory_reserved_bytes"] + (report.get("context_bytes") or 0)
    peak = metrics.get("process_peak_bytes")
    step.figures.update(torch_max_memory_reserved_bytes=report["max_memory_reserved_bytes"],
                        torch_max_memory_allocated_bytes=report.get("max_memory_allocated_bytes"), expected_bytes=expected)
    close = None if peak is None else abs(peak - expected) <= PEAK_TOLERANCE_BYTES
    step.check("peak vs max_memory_reserved + context", close,
               f"NVML process peak {peak}, torch reserved + context {expected} (within {PEAK_TOLERANCE_BYTES})")
    return step


def check_context(run: dict[str, Any], torch_info: dict[str, Any]) -> Step:
    """5: the CUDA context and first-allocation overhead on this card beside the planning assumption."""
    from autodl.profile.memory import CUDA_CONTEXT_BYTES

    step = Step("5 CUDA context + first allocation")
    report = run["report"]
    step.figures["assumed_cuda_context_bytes"] = CUDA_CONTEXT_BYTES
    why = gpu_why(torch_info, report)
    if why:
        return step.skip(why)
    context, total = report.get("context_bytes"), report.get("first_allocation_total_bytes")
    overhead = None if context is None or total is None else total - context - report["first_allocation_reserved_bytes"]
    step.figures.update(measured_cuda_context_bytes=context, how=report.get("context_how"),
                        first_allocation_reserved_bytes=report["first_allocation_reserved_bytes"],
                        first_allocation_overhead_bytes=overhead,
                        assumed_minus_measured_bytes=None if context is None else CUDA_CONTEXT_BYTES - context)
    step.check("context measured", None if context is None else context > 0, f"{context} bytes ({report.get('context_how')})")
    return step


def check_oom(run: dict[str, Any] | None, torch_info: dict[str, Any]) -> Step:
    """6: a real CUDA out-of-memory (the child asks for 1.25x the card) and autodl's explanation of it."""
    step = Step("6 CUDA out-of-memory")
    if run is None:
        return step.skip(torch_info.get("why") or "CUDA is not available")
    metrics, report = run.get("metrics") or {}, run["report"]
    oom = metrics.get("oom")
    step.figures.update(exit_code=metrics.get("exit_code"), requested_bytes=report.get("oom_requested_bytes"),
                        error=run["error"], oom=oom)
    step.check("the child failed", metrics.get("exit_code") not in (0, None), f"exit code {metrics.get('exit_code')}")
    if step.check("explained as an OOM", oom is not None, "autodl.oom found no out-of-memory error in the log") is False:
        return step
    step.check("verdict too big", oom.get("verdict") == "too_big", f"verdict {oom.get('verdict')!r}: {oom.get('explanation')}")
    asked = report.get("oom_requested_bytes")
    step.check("requested bytes read", asked is not None and oom.get("requested_bytes") is not None
               and abs(oom["requested_bytes"] - asked) <= 0.01 * asked, f"{oom.get('requested_bytes')} vs asked {asked}")
    return step


def release(ctx: Any, profile_out: dict[str, Any], selection: dict[str, Any], run: dict[str, Any], log: Any) -> Step:
    """7: autodl's release-and-record step, then NVML asked again: no process of the run on the device, no lease."""
    from autodl import pipeline
    from autodl.ledger import Ledger
    from autodl.metrics import read_baseline, run_processes_on_devices

    step = Step(f"7 release ({ctx.run_id})")
    done = pipeline.step_release_and_record(ctx, script=None, spec_path=None, profile_out=profile_out,
                                            selection=selection, handle_json=run.get("handle"),
                                            metrics_json=run.get("metrics"), log=log)
    step.figures.update(outcome=done.get("outcome"), lease_released=done.get("lease_released"))
    step.check("lease freed", Ledger().get(ctx.run_key) is None, f"step said {done}")
    uuids = [d["device_id"] for d in selection["devices"]]
    baseline = read_baseline(pipeline.state_dir(ctx.run_key))
    unreadable: dict[str, str] = {}
    left = run_processes_on_devices(uuids, baseline, unreadable=unreadable)
    step.figures.update(baseline=baseline, left=left, unreadable=unreadable)
    step.check("no process of the run on the device", None if left is None or unreadable else not left,
               "NVML cannot tell (no baseline / device unreadable)" if left is None or unreadable else f"left: {left}")
    return step


def check_settings(before: dict[str, Any], after: dict[str, Any]) -> Step:
    """8: the card's settings read before and after are the same (the check sets nothing)."""
    step = Step("8 card settings unchanged")
    step.figures.update(before=before, after=after)
    step.check("unchanged", before == after, f"{before}" if before == after else f"before {before}, after {after}")
    return step


def safe(name: str, call: Any, *args: Any) -> Any:
    """``call(*args)``, or a failed :class:`Step` naming the exception: one step's crash never ends the check."""
    try:
        return call(*args)
    except Exception as exc:  # noqa: BLE001 - reported as the step's failure
        return Step(name, "failed", f"{type(exc).__name__}: {exc}")


def training(work: Path, mode: str, log: Any) -> tuple[list[Step], dict[str, Any] | None, Any]:
    """Book, launch, collect and release one child run; (its steps, the run, the booking step)."""
    book = safe(f"2 plan + book ({mode})", step_book, work, mode, log)
    if not isinstance(book, tuple):
        return [book], None, book
    step, ctx, profile_out, selection = book
    if selection is None:
        return [step], None, step
    run = safe(f"run ({mode})", run_training, ctx, profile_out, selection, log)
    if isinstance(run, Step):
        run = {"error": run.why, "report": {}, "folder": str(work)}
    done = safe(f"7 release ({mode})", release, ctx, profile_out, selection, run, log)
    run["booked"] = selection["devices"][0]["device_id"]
    return [step, done], run, step


def run_check(out: Path) -> dict[str, Any]:
    """Every step in order; the result as one JSON-ready dict (``ok``: no step failed)."""
    from autodl.catalog import load_catalog

    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    log_file = open(work / "autodl.log", "a")

    def log(line: str) -> None:
        log_file.write(f"{line}\n")
        log_file.flush()

    torch_info = probe_torch(sys.executable)
    inv = safe("1 inventory (NVML vs nvidia-smi)", step_inventory, load_catalog())
    inv_step, _devices, device = inv if isinstance(inv, tuple) else (inv, [], None)
    steps: list[Step] = [inv_step]
    if device is None:
        log_file.close()
        return result(torch_info, steps)
    before = safe("8 card settings unchanged", settings_snapshot, [device["uuid"]])
    done, run, book = training(work, "train", log)
    steps += done[:1]
    if run is not None:
        steps += [safe("3 launch pinned by UUID", check_launch, run, run["booked"], torch_info),
                  safe("4 collect", check_collect, run, torch_info),
                  safe("5 CUDA context + first allocation", check_context, run, torch_info)]
    steps += done[1:]
    if torch_info.get("cuda_available") and run is not None:
        oom_done, oom_run, _ = training(work, "oom", log)
        steps += [*oom_done, safe("6 CUDA out-of-memory", check_oom, oom_run, torch_info)]
    else:
        steps.append(check_oom(None, torch_info))
    steps.append(safe("9 Paddle memory cap under auto_growth", check_paddle_cap, sys.executable, device))
    after = safe("8 card settings unchanged", settings_snapshot, [device["uuid"]])
    unread = next((s for s in (before, after) if isinstance(s, Step)), None)  # NVML could not be read for it
    steps.append(unread or check_settings(before, after))
    log_file.close()
    return result(torch_info, steps, book)


def result(torch_info: dict[str, Any], steps: list[Step], book: Any = None) -> dict[str, Any]:
    import platform

    return {"host": platform.node(), "python": platform.python_version(), "torch": torch_info,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "driver": driver_version(),
            "ok": not any(s.status == "failed" for s in steps), "steps": [asdict(s) for s in steps]}


def driver_version() -> str | None:
    try:
        import pynvml as nv

        nv.nvmlInit()
        try:
            value = nv.nvmlSystemGetDriverVersion()
            return value.decode() if isinstance(value, bytes) else str(value)
        finally:
            nv.nvmlShutdown()
    except Exception:  # noqa: BLE001 - unknown: the binding or the fake has no such call
        return None


def text_report(res: dict[str, Any]) -> str:
    """The JSON as a table a person reads: one line per step, one per check, the measured figures of 4-6."""
    mark = {True: "ok  ", False: "FAIL", None: "?   "}
    lines = [f"autodl GPU check on {res['host']} ({res['date']}): {'OK' if res['ok'] else 'FAILED'}",
             f"python {res['python']}, driver {res['driver']}, torch {res['torch'].get('torch')} "
             f"(CUDA {res['torch'].get('cuda')}, available {res['torch'].get('cuda_available')})"
             + (f": {res['torch']['why']}" if res["torch"].get("why") else ""), ""]
    for s in res["steps"]:
        lines.append(f"{s['status'].upper():8} {s['name']}" + (f" -- {s['why']}" if s["why"] else ""))
        lines += [f"    {mark[c['ok']]} {c['name']}: {c['detail']}" for c in s["checks"]]
        shown = {k: v for k, v in s["figures"].items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        lines += [f"    {k} = {v}" for k, v in shown.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out",
                        help="report folder (default $OUT or ./gpu_check_out)")
    parser.add_argument("--child", choices=("train", "oom", "paddle-cap"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "paddle-cap":
        return paddle_cap_child()
    if args.child:
        return child(args.child)
    out = Path(args.out).resolve()
    home = out / "autodl_home"
    home.mkdir(parents=True, exist_ok=True)
    # a store of its own: the check never books in, or records into, a real autodl installation's store
    os.environ.update(AUTODL_HOME=str(home), AUTODL_STORE_URL=f"sqlite:///{home / 'autodl.db'}")
    os.environ.pop("AUTODL_POOL", None)
    res = run_check(out)
    (out / "gpu_check.json").write_text(json.dumps(res, indent=2, default=str))
    text = text_report(res)
    (out / "gpu_check.txt").write_text(text)
    print(text, end="")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
