"""The ``autodl`` command: profile, plan, inventory, leases, queue, runs, simulate — JSON with ``--json``, tables without.

Exit codes: 0 ok, 2 spec, 3 profile, 4 no fit, 5 inventory, 6 lease, 7 launch, 8 catalog, 9 store, 10 config, 130 interrupted (see
:mod:`autodl.errors`); 1 an unexpected internal error (a bug: one line, no traceback unless ``AUTODL_DEBUG=1``).
Messages never show a secret (:mod:`autodl.redact`); ``--json`` is strict JSON (a number that is not finite is ``null``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, TypedDict

from autodl.errors import AutoDLError, SpecError
from autodl.fields import MAX_RUN_KEY_CHARS  # the store's run-key column width

GiB = 1 << 30
POOL_HELP = ("auto | nvml | prometheus+http://HOST:PORT[?max_age_s=60&window_s=300] | pool file "
             "(default $AUTODL_POOL, [autodl] pool, or auto)")
MAX_MESSAGE_CHARS = 4000
"""An error message is cut here: it names the input and the fix, it never echoes a whole input."""


def _console():
    from rich.console import Console

    # tables are wide: do not squeeze them to 80 columns when piped to a file or a log
    # markup off: messages quote shapes such as "float32[b, 1, 128]", which rich would take for a style tag and drop
    return Console(width=None if sys.stdout.isatty() else 220, markup=False)


def _gib(n: int | float | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def sharing_cell(sharing: str, reserved_bytes: int | None, co_tenants: list[str]) -> str:
    """A lease's (or a record's) sharing for a table: ``exclusive``, or ``shared 0.53 GiB with p2`` (its
    reservation in GiB, 2^30 bytes; ``reservation unknown`` when it has none; ``with no other run`` alone)."""
    if sharing != "shared":
        return "exclusive"
    size = f"{_gib(reserved_bytes)} GiB" if reserved_bytes else "reservation unknown"
    return f"shared {size} with {', '.join(co_tenants) or 'no other run'}"


def json_safe(data: Any, _depth: int = 0) -> Any:
    """``data`` with every float that is not finite (NaN, inf) as ``None``: JSON has no such numbers, and an
    unknown is null, never a made-up figure."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if _depth > 64:
        return data
    if isinstance(data, dict):
        return {k: json_safe(v, _depth + 1) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v, _depth + 1) for v in data]
    return data


def _print_json(data: Any) -> None:
    print(json.dumps(json_safe(data), indent=2, default=str, allow_nan=False))


# ------------------------------------------------------------------------------------ commands
SPEC_SUFFIXES = (".yaml", ".yml")
"""What a task spec's file name ends with (the README's and include/specs/'s)."""


def _profile_inputs(script: str | None, spec: str | None) -> tuple[str | None, str | None]:
    """(spec, script) of ``autodl profile``: a YAML file given where the script goes is the spec, as ``autodl plan
    SPEC`` takes it (read as Python, a spec was a syntax error at its line 1 that told the user to fix the script).

    :raises SpecError: a YAML file in the script's place beside ``--spec``.
    """
    if script is None or not str(script).lower().endswith(SPEC_SUFFIXES):
        return spec, script
    if spec is not None:
        raise SpecError(f"{script} is a task spec, not a training script, and --spec {spec} is given too: give the "
                        "script (`autodl profile SCRIPT --spec SPEC`) or the spec alone (`autodl profile SPEC`, "
                        "its task.script the script).")
    return script, None


def cmd_profile(args: argparse.Namespace) -> int:
    from autodl.catalog import load_catalog
    from autodl.profile import profile_script
    from autodl.spec import TaskSpec, check_spec_against_catalog, load_spec

    spec_path, script_arg = _profile_inputs(args.script, args.spec)
    spec = load_spec(spec_path) if spec_path else TaskSpec()
    check_spec_against_catalog(spec, load_catalog())  # a typo in a device name is refused here as in the DAG's step
    script = spec.script_path(script_arg)
    from autodl.profile.cache import cached  # the same script, spec, environment and versions: the last profile

    profile = cached(profile_script)(script, spec, catalog=load_catalog(), probe=args.probe,
                                     use_cache=getattr(args, "use_cache", True))
    from autodl.records import calibrate_profile  # as the DAG's profile step: past out-of-memory runs raise it

    profile = calibrate_profile(profile, threshold=spec.resource_policy.memory_threshold)
    if args.json:
        _print_json(profile.to_json())
        return 3 if profile.errors else 0
    con = _console()
    con.print(_profile_table(profile))
    _print_findings(con, profile.findings)
    return 3 if profile.errors else 0


def _workspace_label(profile) -> str:
    """The workspace row's label with what it holds (``workspace_terms_bytes``: the CUDA context, cuBLAS's and
    cuDNN's workspaces, the allocator's slack), which a fresh user could not tell."""
    terms = [t.replace("_", " ").replace("cuda", "CUDA").replace("cublas", "cuBLAS").replace("cudnn", "cuDNN")
             for t in profile.workspace_terms_bytes]
    return f"workspace GiB ({', '.join(terms)})" if terms else "workspace GiB"


def _profile_table(profile):
    """The profile's terms (parameters, memory by kind, FLOPs) and each phase's tensor peak, as a rich table."""
    from rich.table import Table

    b = profile.breakdown
    t = Table(title=f"profile of {profile.script} ({profile.method})")
    t.add_column("term")
    t.add_column("value", justify="right")
    unknown = profile.params is None  # model states not measured: placed as the largest allowed device
    states = (lambda n: "unknown (see the cold-start warning)") if unknown else _gib
    trainable = profile.trainable_params
    params = "unknown (see the cold-start warning)" if profile.params is None else f"{profile.params:,}" + (
        f" ({trainable:,} trainable)" if trainable is not None and trainable != profile.params else "")
    for name, value in [("parameters", params), ("batch size / device", str(profile.batch_size)),
                        ("devices", str(profile.num_gpus)), ("weights GiB", states(b.weights_bytes)),
                        ("gradients GiB", states(b.gradients_bytes)), ("optimizer state GiB", states(b.optimizer_state_bytes)),
                        ("activations GiB", _gib(b.activations_bytes)),
                        (_workspace_label(profile), _gib(b.workspace_bytes)),
                        ("peak memory GiB / device", _gib(profile.peak_memory_bytes) + (
                            " + unknown model states: placed as the largest allowed device" if unknown else "")),
                        ("training FLOPs / step", f"{profile.flops_per_step:.3g}" if profile.flops_per_step is not None
                         else "unknown (see the cold-start warning)")]:
        t.add_row(name, value)
    names = [ph.name for ph in profile.phases]
    for ph in profile.phases:
        # phases of one name (inputs of several shapes: variable lengths) are told apart by their inputs' shapes
        shapes = f", inputs {' '.join('x'.join(map(str, s)) or 'scalar' for s in ph.input_shapes)}" \
            if names.count(ph.name) > 1 and ph.input_shapes else ""
        t.add_row(f"{ph.name} phase tensor peak GiB (batch {ph.batch_size}{shapes})",
                  _gib(ph.peak_bytes) + (" (extrapolated)" if ph.extrapolated else ""))
    if profile.method_reason:
        t.caption = f"path: {profile.method} ({profile.method_reason})"
    return t


def _print_findings(con, findings, *, title: str = "findings") -> None:
    """The profile's findings as a table (severity, code, script line, message); nothing when there are none."""
    from rich.table import Table

    if not findings:
        return
    ft = Table(title=title)
    for col in ("severity", "code", "line", "message"):
        ft.add_column(col)
    for f in findings:
        ft.add_row(f.severity, f.code, str(f.line or ""), f.message)
    con.print(ft)


def cmd_plan(args: argparse.Namespace) -> int:
    from autodl.catalog import load_catalog
    from autodl.inventory import read_inventory
    from autodl.inventory.effective import effective_max_batch
    from autodl.launch import get_launcher
    from autodl.steps.context import RunContext
    from autodl.steps.inputs import resolve_pool_source
    from autodl.steps.launch import build_request
    from autodl.steps.profile import plan, profile_run
    from autodl.types import Device, Lease, ProfileResult, Selection

    catalog = load_catalog()
    spec, profile = profile_run(args.script, args.spec, probe=args.probe, catalog=catalog)
    inventory = read_inventory(resolve_pool_source(args.pool, field="--pool", cwd=Path.cwd(), strict=False), catalog=catalog)
    decision = plan(profile, spec, inventory=inventory, catalog=catalog)
    launch = launch_here = None
    by_id = {d.device_id: d for d in inventory.devices}
    chosen = decision.chosen
    sharing = plan_sharing(profile, spec, by_id.get(chosen.devices[0]) if chosen else None)
    if chosen is not None:
        devices: list[Device] = [by_id[i] for i in chosen.devices]
        ctx = RunContext(run_key="plan")
        profile_out = ProfileResult(profile=profile, script=profile.script, spec_path=spec.source_path,
                                    pool_source=inventory.source, declared_pool=inventory.declared,
                                    profiled_in=profile.dry_run_in or "not-run")

        def render(on_cpu: bool) -> dict:
            lease = Lease(lease_id="plan", run_key=ctx.run_key, device_ids=[d.device_id for d in devices])
            selection = Selection(lease=lease, placement=chosen.to_json(), devices=devices,
                                  declared_pool=on_cpu, pool_source=inventory.source, algorithm=decision.algorithm)
            _spec, request = build_request(ctx, profile_out, selection)
            try:
                return get_launcher(spec.launcher.type).render(request)
            except AutoDLError as exc:
                return {"error": str(exc)}

        # What runs on the placement's devices; on a declared pool, also what runs here (on CPU).
        launch = render(False)
        launch_here = render(True) if inventory.declared else None
    kept = [c for c in decision.candidates if c.kept]
    max_batch = effective_max_batch(profile, inventory.devices, spec.resource_policy.memory_threshold)
    out = _plan_json(profile, inventory, decision, kept, sharing, max_batch, launch, launch_here)
    if args.json:
        _print_json(out)
    else:
        _print_plan(profile, inventory, decision, kept, sharing, launch, launch_here)
    return 0 if decision.fits else 4


def _plan_json(profile, inventory, decision, kept: list, sharing: dict, max_batch: dict, launch: dict | None,
               launch_here: dict | None) -> dict:
    """``autodl plan``'s answer: the placement decision, the pool, the profile and what the launch would run."""
    return {
        "fits": decision.fits,
        "available": decision.available,
        "algorithm": decision.algorithm,
        "needed_bytes": decision.needed_bytes,
        "pool": inventory.source,
        "declared_pool": inventory.declared,
        "placements": [c.to_json() for c in kept],
        "dropped": [c.to_json() for c in decision.candidates if not c.kept],
        "suggestions": decision.suggestions,
        "sharing": sharing,
        "max_batch_size_by_device": max_batch,
        "profile": {"params": profile.params, "peak_memory_bytes": profile.peak_memory_bytes,
                    "flops_per_step": profile.flops_per_step, "num_gpus": profile.num_gpus,
                    "batch_size": profile.batch_size, "method": profile.method},
        "findings": [f.model_dump(mode="json") for f in profile.findings],
        "launch": launch,
        "launch_here": launch_here,
    }


def _print_plan(profile, inventory, decision, kept: list, sharing: dict, launch: dict | None,
                launch_here: dict | None) -> None:
    """Print ``autodl plan``'s answer as tables: the ranked placements, the dropped device sets, the advice."""
    from rich.table import Table

    chosen = decision.chosen
    con = _console()
    t = Table(title=f"placement for {profile.script} on {inventory.source}"
                    + (" (DECLARED devices)" if inventory.declared else ""))
    for col in ("rank", "model", "devices", "score", "step s", "reasons"):
        t.add_column(col)
    for i, c in enumerate(kept, 1):
        t.add_row(str(i), c.model, ",".join(c.devices), f"{c.score:.4g}" if c.score is not None else "-",
                  f"{c.est_step_time_s:.4g}" if c.est_step_time_s else "-", "; ".join(c.reasons))
    for c in decision.candidates:
        if not c.kept:
            t.add_row("-", c.model, ",".join(c.devices), "dropped", "", "; ".join(c.reasons))
    con.print(t)
    # what the profile warned about is what the placement rests on: shown here too, not only by autodl profile
    _print_findings(con, [f for f in profile.findings if f.severity != "info"], title="profile findings")
    con.print(f"needs {_gib(decision.needed_bytes)} GiB per device; fits: {decision.fits}; free now: {decision.available}")
    con.print(sharing_line(sharing), markup=False)
    for s in decision.suggestions:
        con.print(f"  suggestion: {s}")
    if chosen is not None and launch:  # launch is rendered only for a chosen placement
        if launch.get("shell"):
            con.print(f"on {chosen.model} it would run: {launch['shell']}")
        elif launch.get("pod"):
            import yaml

            con.print(f"on {chosen.model} it would create this pod in namespace {launch.get('namespace')}:")
            print(yaml.safe_dump(launch["pod"], sort_keys=False))
        elif launch.get("error"):
            con.print(f"what it would run cannot be shown here: {launch['error']}", markup=False)
    if launch_here and launch_here.get("shell"):
        con.print(f"the pool is declared, so here it runs on CPU: {launch_here['shell']}")


def plan_sharing(profile, spec, device) -> dict:
    """``autodl plan``'s sharing: for a ``packed`` spec, whether the chosen ``device`` is shareable
    (:func:`autodl.policy.packing.shareable`), what the run would reserve there (bytes: alone, and beside another
    run, one CUDA context more: :func:`autodl.policy.packing.reservation_bytes`) of what the device's leases may
    reserve together (:func:`autodl.policy.packing.capacity_bytes`), and why it would book exclusively
    (:func:`autodl.queue.why_exclusive`); for an ``exclusive`` spec only the mode.

    :param device: the chosen placement's first device; None when nothing was chosen.
    """
    from autodl.policy import packing
    from autodl.queue import known_estimate, why_exclusive

    mode = spec.resource_policy.sharing
    if mode != "packed":
        return {"mode": mode, "books": "exclusive"}
    if device is None:
        return {"mode": mode, "books": None, "device": None, "why_exclusive": "no device was chosen"}
    threshold = spec.resource_policy.memory_threshold
    estimate = known_estimate(profile)
    why = why_exclusive(profile, device, threshold)
    return {"mode": mode, "device": device.device_id, "shareable": packing.shareable(device),
            "books": "exclusive" if why else "shared", "why_exclusive": why,
            "reservation_bytes": packing.reservation_bytes(estimate, joining=False),
            "reservation_beside_bytes": packing.reservation_bytes(estimate, joining=True),
            "capacity_bytes": packing.capacity_bytes(device, threshold)}


def sharing_line(sharing: dict) -> str:
    """:func:`plan_sharing` as one line for people, sizes in GiB (2^30 bytes)."""
    if sharing["mode"] != "packed":
        return "sharing: exclusive (the spec's resource_policy.sharing): its devices would be its own"
    if sharing["books"] != "shared":
        why = sharing["why_exclusive"] or "it would book exclusively"
        return why if why.startswith("sharing:") else f"sharing: packed, but it would book exclusively: {why}"
    return (f"sharing: packed; {sharing['device']} is shareable: the run would reserve "
            f"{_gib(sharing['reservation_bytes'])} GiB alone there ({_gib(sharing['reservation_beside_bytes'])} GiB "
            f"beside another packed run) of {_gib(sharing['capacity_bytes'])} GiB its two runs may reserve together "
            "(memory threshold x device memory)")


def cmd_inventory(args: argparse.Namespace) -> int:
    from autodl.inventory import read_inventory
    from autodl.ledger import Ledger
    from autodl.steps.inputs import resolve_pool_source

    inv = read_inventory(resolve_pool_source(args.pool, field="--pool", cwd=Path.cwd(), strict=False))
    holders = Ledger().holders()
    if args.json:
        _print_json({**inv.to_json(), "leased": holders})
        return 0
    from rich.table import Table

    t = Table(title=f"inventory: {inv.source}" + (" (DECLARED, not real devices)" if inv.declared else ""))
    for col in ("device", "host", "idx", "model", "vendor", "total GiB", "used GiB", "util %", "health", "lease"):
        t.add_column(col, overflow="fold")
    for d in inv.devices:
        # unknown stays unknown: '?' where the source could not read a value (never 0 / idle)
        t.add_row(d.device_id, d.host, str(d.index), d.model, d.vendor, _gib(d.memory_total_bytes or None).replace("-", "?"),
                  "?" if d.memory_used_bytes is None else _gib(d.memory_used_bytes),
                  "?" if d.utilization_pct is None else f"{d.utilization_pct:.0f}",
                  "ok" if d.healthy else f"UNHEALTHY: {d.health_reason or 'marked unhealthy'}", holders.get(d.device_id, ""))
    unknown = [f"{d.device_id}: {', '.join(d.unknown)}" for d in inv.devices if d.unknown]
    if unknown:
        t.caption = "? = unknown (not read, treated as busy): " + "; ".join(unknown)
    con = _console()
    con.print(t)
    for note in inv.notes:
        con.print(f"note: {note}")
    return 0


def cmd_leases(args: argparse.Namespace) -> int:
    from autodl.ledger import Ledger
    from autodl.types import utcnow

    if args.release is not None:
        return _release_by_hand(args.release, force=args.force, as_json=args.json)
    if args.reap:
        from autodl.steps.reaper import reap_expired

        lines: list[str] = []
        freed = reap_expired(log=lines.append if args.json else print)
        if args.json:  # what was freed, and what the reaper said, as one JSON document
            _print_json({"reaped": freed, "log": lines})
            return 0
        print(f"reaped {len(freed)} expired lease(s)" + (f": {', '.join(freed)}" if freed else ""))
        return 0
    leases = Ledger().leases()
    if args.json:
        _print_json([le.to_json() for le in leases])
        return 0
    from rich.table import Table

    now = utcnow()
    t = Table(title="live leases")
    for col in ("lease", "run key", "owner", "model", "devices", "sharing", "since", "expires", "training"):
        t.add_column(col, overflow="fold")
    for le in leases:
        if le.expires_at is None:
            expires = "never (no TTL)"
        elif le.expired(now):
            expires = f"EXPIRED {int((now - le.expires_at).total_seconds())} s ago"
        else:
            expires = f"in {int((le.expires_at - now).total_seconds())} s"
        training = (f"launched on {le.launched_on or le.host}" if le.handle else
                    f"not launched: waiting for a worker on {le.host} to start it")
        t.add_row(le.lease_id, le.run_key, le.owner.user or "(unknown)", le.model or "", ",".join(le.device_ids),
                  sharing_cell(le.sharing, le.reserved_bytes, le.co_tenants), le.created_at.isoformat(timespec="seconds"), expires, training)
    t.caption = "autodl leases --reap frees expired ones now; --release RUN_KEY [--force] frees one by hand"
    _console().print(t)
    return 0


def _plot_run(run_key: str, out: str | None) -> int:
    """Draw (again) the timeline PNG of ``run_key`` beside its log and print where it is."""
    from autodl.config import autodl_home
    from autodl.errors import StoreError
    from autodl.launch.local import run_dir_name
    from autodl.records import RecordStore
    from autodl.timeline import OutputPathError, check_output_path, plot_run

    if out is not None:
        try:
            check_output_path(out)
        except OutputPathError as exc:
            raise AutoDLError(f"--out {out}: {exc}") from None
    record = RecordStore().get(run_key)
    # the folder the record says the run's log is in (runs recorded before a change of folder naming too),
    # else where this version would put it
    log_path = (record.launch or {}).get("log_path") if record else None
    candidates = [Path(log_path).parent] if log_path else []
    candidates.append(autodl_home() / "runs" / run_dir_name(run_key))
    folder = next((c for c in candidates if c.is_dir()), candidates[-1])
    if not folder.is_dir():
        raise StoreError(f"no run folder for run key {run_key!r} under {folder.parent}; `autodl runs --json` lists the "
                         "run keys (the folder lives on the host that ran the training, under AUTODL_HOME).")
    try:
        path = plot_run(folder, out=out, estimate_bytes=record.estimated_peak_bytes if record else None,
                        title=f"{run_key}" + (f" ({record.outcome}, {record.device_model})" if record else ""))
    except FileNotFoundError as exc:
        raise StoreError(f"run {run_key!r}: {exc}; the run never sampled metrics (it did not start?).") from None
    print(path)
    return 0


def cmd_exporter(args: argparse.Namespace) -> int:
    """Serve autodl's own metrics for Prometheus until interrupted."""
    import time

    from autodl.exposition import serve

    server, _thread = serve(args.port, addr=args.host)
    print(f"serving autodl metrics on http://{args.host}:{args.port}/metrics", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()


def _release_by_hand(run_key: str, *, force: bool = False, as_json: bool = False) -> int:
    """Free a run's lease by hand: its training is stopped first (and marked as stopped by hand, so the run's
    collect step and record say so), so the device is not handed to another run while the old one still
    computes on it; a record is written. Another user's lease needs ``--force``.

    Says what happened: ``released lease L of run R held on devices D`` (exit 0), or ``no lease is held by run
    R: nothing released`` (exit 6); ``--json`` prints the same as one JSON object (log lines go to stderr)."""
    from autodl.errors import LeaseError
    from autodl.inputs import clip, short
    from autodl.steps.reaper import release_by_hand

    log = (lambda line: print(line, file=sys.stderr)) if as_json else print
    try:
        result = release_by_hand(run_key, force=force, log=log)
    except LeaseError as exc:  # NotOwner too: nothing was released
        if as_json:
            _print_json({"released": False, "run_key": clip(run_key, ECHO_CHARS), "error": str(exc)})
        raise
    devices = ", ".join(result["device_ids"]) or "no devices"
    if not result["lease_released"]:
        message = (f"lease {result['lease_id']} of run {short(run_key)} was freed by someone else while this command "
                   f"ran: nothing released by it; recorded outcome={result['outcome']}")
        if as_json:
            _print_json({"released": False, **result, "error": message})
        raise LeaseError(message)
    training = {"stopped": "its training was stopped", "not running": "its training had already ended",
                "not launched": "no training was launched on it"}.get(result["training"],
                                                                        f"its training could not be checked ({result['training']})")
    if as_json:
        _print_json({"released": True, **result})
    else:
        print(f"released lease {result['lease_id']} of run {run_key} held on devices {devices}; {training}; "
              f"recorded outcome={result['outcome']}")
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    if args.hold or args.resume:
        return _hold_queue(args)
    from autodl.queue_hold import QueueHolds
    from autodl.types import utcnow
    from autodl.waiting import queue_report

    now = utcnow()
    rows = queue_report(pool=args.pool, now=now)
    holds = QueueHolds().holds()
    if args.json:
        _print_json([r.to_json() for r in rows])
        return 0
    from rich.table import Table

    caption = "; ".join(h.describe() for h in holds) or None
    t = Table(title="admission queue (next first)", caption=caption)
    for col in ("#", "run key", "team", "prio", "owner", "devices", "GiB each", "sharing", "waiting s", "expected s",
                "expected start (UTC)", "why waiting"):
        t.add_column(col, overflow="fold")
    for r in rows:
        e = r.entry
        start = r.expected_start.strftime("%Y-%m-%d %H:%M:%S") if r.expected_start else (r.expected_start_note or "unknown")
        t.add_row(str(r.position) if r.position else "stale", e.run_key, r.team, str(r.priority),
                  e.owner_user or "(unknown)", str(e.num_gpus), _gib(e.needed_bytes), e.sharing,
                  f"{(now - e.enqueued_at).total_seconds():.0f}",
                  f"{e.expected_runtime_s:.0f} ({e.runtime_source or '?'})" if e.expected_runtime_s else "unknown",
                  start, r.reason)
    _console().print(t)
    return 0


def _hold_queue(args: argparse.Namespace) -> int:
    """``autodl queue --hold [--team T] --reason WHY`` / ``--resume [--team T]``."""
    from autodl.config import current_user
    from autodl.queue_hold import QueueHolds

    holds = QueueHolds()
    what = f"team {args.team!r}'s queue" if args.team else "the whole queue"
    if args.resume:
        was = holds.resume(args.team)
        if args.json:
            _print_json({"resumed": was, "team": args.team})
        else:
            print(f"resumed {what}" if was else f"{what} was not held; nothing to resume")
        return 0
    if not args.reason:
        from autodl.errors import ConfigError

        raise ConfigError("autodl queue --hold needs --reason WHY (it is shown to every waiting run), e.g. "
                          "--reason 'driver upgrade until 14:00'")
    hold = holds.hold(args.team, args.reason, by=current_user())
    if args.json:
        _print_json(hold.model_dump(mode="json"))
    else:
        print(f"held {what}: it admits nothing until autodl queue --resume{' --team ' + args.team if args.team else ''}; "
              "running trainings go on")
        if args.team and not _team_known(args.team):
            print(f"note: no team {args.team!r} is configured ([autodl] team_queues) or waiting now; check the spelling")
    return 0


def _team_known(team: str) -> bool:
    """Whether ``team`` is configured in the team queues or has a run waiting."""
    from autodl.errors import ConfigError
    from autodl.queue import AdmissionQueue
    from autodl.quota import load_team_queues

    try:
        if team in load_team_queues().teams:
            return True
    except ConfigError:
        pass
    return any(e.team == team for e in AdmissionQueue().entries())


def cmd_runs(args: argparse.Namespace) -> int:
    from autodl.records import RecordStore

    if args.plot:
        return _plot_run(args.plot, args.out)
    records = RecordStore().list(dag_id=args.dag_id, limit=args.limit)
    if args.json:
        _print_json([r.to_json() for r in records])
        return 0
    from rich.table import Table

    t = Table(title="run records (newest first)")
    for col in ("recorded (UTC)", "script", "outcome", "device", "declared", "sharing", "est GiB", "own peak GiB",
                "alloc/resv GiB", "exit", "s", "why"):
        t.add_column(col, overflow="fold")
    for r in records:
        m = r.metrics or {}
        why = (r.error or "").splitlines()[0][:100] if r.error else ""
        # estimate: per-device GPU peak incl. CUDA workspaces; own peak: the run's (Paddle's reserved peak,
        # NVML per-process memory, or RSS on a CPU run; never device-wide 'used')
        actual = f"{_gib(r.actual_peak_bytes)} ({m.get('peak_source') or m.get('source', '-')})" if r.actual_peak_bytes else "-"
        paddle = (f"{_gib(r.allocated_peak_bytes)}/{_gib(r.reserved_peak_bytes)}"
                  if r.allocated_peak_bytes is not None or r.reserved_peak_bytes is not None else "-")
        t.add_row(r.recorded_at.strftime("%Y-%m-%d %H:%M:%S"), r.script.rsplit("/", 1)[-1], r.outcome,
                  r.device_model or "-", str(r.declared_pool),
                  sharing_cell(r.sharing, r.device_memory_cap_bytes, r.co_tenants), _gib(r.estimated_peak_bytes), actual, paddle,
                  str(m.get("exit_code", "-")), str(m.get("duration_s", "-")), ("OOM: " if r.oom else "") + why)
    t.caption = "run keys and full records: autodl runs --json; a run's timeline: autodl runs --plot RUN_KEY"
    _console().print(t)
    return 0


class _OomRunRow(TypedDict):
    """One out-of-memory run of ``autodl calibration``: its record's fields and its ``oom`` explanation's."""

    run_key: str
    script: str
    recorded_at: str
    batch_size: int | None
    wanted_bytes: int | None
    requested_bytes: int | None
    memory: str | None
    device_kind: str | None
    script_sha256: str | None
    cleared_at: str | None


def cmd_calibration(args: argparse.Namespace) -> int:
    """What out-of-memory runs teach the estimate (per run: script, batch, memory, device), or forget it."""
    from autodl.records import RecordStore, clear_calibration

    if args.clear:
        script = str(Path(args.script).resolve()) if args.script else None
        cleared = clear_calibration(script)
        if args.json:
            _print_json({"cleared": cleared})
        else:
            print(f"cleared {len(cleared)} out-of-memory run(s) from calibration" + (f": {', '.join(cleared)}" if cleared else ""))
        return 0
    rows: list[_OomRunRow] = []
    for r in RecordStore().list(limit=args.limit):
        if r.outcome != "failed" or not r.oom or (args.script and r.script != str(Path(args.script).resolve())):
            continue
        tag = r.oom.get("calibration") or {}
        rows.append({"run_key": r.run_key, "script": r.script, "recorded_at": r.recorded_at.isoformat(),
                     "batch_size": r.oom.get("batch_size"), "wanted_bytes": r.oom.get("wanted_bytes"),
                     "requested_bytes": r.oom.get("requested_bytes"), "memory": tag.get("memory"),
                     "device_kind": tag.get("device_kind"), "script_sha256": tag.get("script_sha256"),
                     "cleared_at": tag.get("cleared_at")})
    if args.json:
        _print_json(rows)
        return 0
    from rich.table import Table

    t = Table(title="out-of-memory runs that calibrate estimates (newest first)")
    for col in ("run", "script", "batch", "memory", "device", "wanted GiB", "cleared"):
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(row["run_key"], row["script"].rsplit("/", 1)[-1], str(row["batch_size"]), str(row["memory"] or "?"),
                  str(row["device_kind"] or "?"), _gib(row["wanted_bytes"]), row["cleared_at"] or "")
    t.caption = "autodl calibration --clear [--script PATH] forgets them (the records stay); a changed script is not matched"
    _console().print(t)
    return 0


# --------------------------------------------------------------------------------------- main
ECHO_CHARS = 120
"""A user's argument quoted in a message is cut to this many characters (it names the input; the user has it)."""


def cut_echoes(message: str, argv: list[str], limit: int = ECHO_CHARS) -> str:
    """``message`` with every long command-line argument it quotes (as typed, or as Python's ``repr`` writes
    it) cut to ``limit`` characters: whatever code built the message, the CLI never echoes a whole input."""
    from autodl.inputs import clip

    for arg in sorted({a for a in argv if len(a) > limit}, key=len, reverse=True):
        for form in (arg, repr(arg)[1:-1]):
            if len(form) > limit and form in message:
                message = message.replace(form, clip(form, limit) + f" ({len(arg):,} characters)")
    return message


def error_text(exc: BaseException) -> str:
    """The message of an autodl error as the CLI prints it: secrets redacted (:func:`autodl.redact.redact_text`),
    long arguments it quotes cut (:func:`cut_echoes`), at most :data:`MAX_MESSAGE_CHARS` characters."""
    from autodl.redact import redact_text

    message = cut_echoes(redact_text(exc), sys.argv[1:] + _ARGV)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + f"... ({len(message) - MAX_MESSAGE_CHARS:,} more characters)"
    return message


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (``invalid choice: '<100k characters>'``) cut what they quote."""

    def error(self, message: str):  # noqa: D401 - argparse's signature
        from autodl.inputs import clip

        message = cut_echoes(message, sys.argv[1:] + _ARGV)
        super().error(clip(message, MAX_MESSAGE_CHARS))


_ARGV: list[str] = []
"""The arguments :func:`main` was called with (tests call it in-process)."""



def _text_arg(what: str, max_chars: int):
    """argparse type: a non-empty, non-blank value of at most ``max_chars`` characters with no control
    characters (none can name anything autodl stores); argparse turns the refusal into a usage error (exit 2)
    naming the argument."""
    from autodl.inputs import short

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"the {what} is empty; pass a {what}")
        if len(text) > max_chars:
            raise argparse.ArgumentTypeError(f"the {what} {short(text, 60)} is {len(text):,} characters long; no "
                                             f"{what} is longer than {max_chars}")
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise argparse.ArgumentTypeError(f"the {what} {short(text, 60)} holds a control character; no {what} does")
        return text

    parse.__name__ = what  # argparse names the type in "invalid <name> value"
    return parse


_run_key = _text_arg("run key", MAX_RUN_KEY_CHARS)
_pool_arg = _text_arg("pool source", 8192)


def path_arg(what: str, *, check_length: bool = True):
    """argparse type: a path that is not empty (an empty path is the current folder: never what was meant), nor
    longer than Linux allows (``check_length``; off where the reader, :func:`autodl.inputs.resolve_file`, says so
    itself naming the file and the field); what it names is checked where it is read."""

    from autodl.inputs import MAX_NAME_BYTES, MAX_PATH_BYTES, clip

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"the {what} path is empty; pass the path of a {what}")
        size = len(os.fsencode(text))
        longest = max((len(os.fsencode(part)) for part in text.split("/")), default=0)
        if check_length and (size > MAX_PATH_BYTES or longest > MAX_NAME_BYTES):
            raise argparse.ArgumentTypeError(
                f"the {what} path {clip(text, 60)!r} is too long ({size:,} bytes; a path is at most {MAX_PATH_BYTES} "
                f"bytes and each name in it at most {MAX_NAME_BYTES}); pass the path of a {what}")
        if check_length and "\x00" in text:
            raise argparse.ArgumentTypeError(f"the {what} path {clip(text, 60)!r} holds a NUL character; no path does")
        return text

    parse.__name__ = what
    return parse


def _port(text: str) -> int:
    """argparse type: a TCP port, 0-65535 (0: any free port)."""
    from autodl.inputs import short

    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{short(text, 60)} is not a TCP port (a whole number from 0 to 65535)")
    return value


_host_arg = _text_arg("host address", 253)  # a DNS name is at most 253 characters (RFC 1035 section 2.3.4)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``autodl`` parser; the other distributions' commands (``autodl.commands`` entry points) are loaded only
    when ``argv`` does not name one of the product's own (loading ``autodl simulate`` imports the simulator:
    0.6 s of a cached ``autodl profile``'s 2 s)."""
    p = _Parser(prog="autodl", description="Profile, place, launch and record PaddlePaddle training runs.")
    from autodl import DISTRIBUTION, __version__

    p.add_argument("--version", action="version", version=f"autodl {__version__} ({DISTRIBUTION})")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    _add_profile_commands(sub)
    _add_pool_commands(sub)
    _add_record_commands(sub)

    command = next((a for a in argv or () if not a.startswith("-")), None)
    if command not in sub.choices:
        _register_extra_commands(sub)
    return p


def _add_probe_flags(sp) -> None:
    """``--probe`` / ``--no-probe``: whether the profile measures the model in a sandboxed CPU subprocess."""
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--probe", dest="probe", action="store_true", default=None,
                   help="measure the model in a sandboxed CPU subprocess (default: when Paddle is importable)")
    g.add_argument("--no-probe", dest="probe", action="store_false", help="static analysis only")


def _add_profile_commands(sub) -> None:
    """The commands that profile a training script and plan its placement: ``profile``, ``plan``."""
    sp = sub.add_parser("profile", help="estimate peak memory and FLOPs of a training script")
    sp.add_argument("script", nargs="?", type=path_arg("training script", check_length=False),
                    help="training script (default: the spec's task.script), or the task spec YAML itself")
    sp.add_argument("--spec", type=path_arg("spec file", check_length=False), help="task spec YAML whose values override the script's")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--no-cache", dest="use_cache", action="store_false",
                    help="profile again even when the same script, spec and versions were profiled before")
    _add_probe_flags(sp)
    sp.set_defaults(func=cmd_profile)

    sp = sub.add_parser("plan", help="where would this spec's run go now, and what would be launched")
    sp.add_argument("spec", type=path_arg("spec file", check_length=False), help="task spec YAML")
    sp.add_argument("--script", type=path_arg("training script", check_length=False), help="override the spec's task.script")
    sp.add_argument("--pool", type=_pool_arg, help=POOL_HELP)
    sp.add_argument("--json", action="store_true")
    _add_probe_flags(sp)
    sp.set_defaults(func=cmd_plan)


def _add_pool_commands(sub) -> None:
    """The commands on the pool, its leases and its admission queue: ``inventory``, ``leases``, ``queue``."""
    sp = sub.add_parser("inventory", help="the devices in the pool and their leases")
    sp.add_argument("--pool", type=_pool_arg, help=POOL_HELP)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_inventory)

    sp = sub.add_parser("leases", help="live leases (and releasing one by run key)")
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--release", metavar="RUN_KEY", type=_run_key,
                   help="stop the run's training, free its lease, record it (outcome stopped)")
    g.add_argument("--reap", action="store_true", help="free every lease whose TTL ran out now")
    sp.add_argument("--force", action="store_true", help="with --release: release another user's lease")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_leases)

    sp = sub.add_parser("queue", help="runs waiting for devices, in the order the queue takes them, why and until when "
                                      "(and holding the queue for maintenance)")
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--hold", action="store_true", help="hold the queue (or --team's): it admits nothing until --resume")
    g.add_argument("--resume", action="store_true", help="resume a held queue (or --team's)")
    sp.add_argument("--team", type=_text_arg("team", 250), help="with --hold/--resume: only this team's queue")
    sp.add_argument("--reason", type=_text_arg("reason", 1000), help="with --hold: why, shown to every waiting run")
    sp.add_argument("--pool", type=_pool_arg, help=POOL_HELP)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_queue)


def _add_record_commands(sub) -> None:
    """The commands on run records and autodl's own metrics: ``runs``, ``calibration``, ``exporter``."""
    sp = sub.add_parser("runs", help="run records")
    sp.add_argument("--dag-id", type=_text_arg("DAG id", 250), help="only this DAG's runs")
    sp.add_argument("--limit", type=_count, default=20, help="newest N records (1..100000)")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--plot", metavar="RUN_KEY", type=_run_key, help="draw the run's memory/utilization timeline (PNG beside its log)")
    sp.add_argument("--out", type=path_arg("output file"), help="with --plot: write the PNG here instead")
    sp.set_defaults(func=cmd_runs)

    sp = sub.add_parser("calibration", help="out-of-memory runs that raise later estimates (and forgetting them)")
    sp.add_argument("--clear", action="store_true", help="forget them: later estimates are no longer raised from them")
    sp.add_argument("--script", type=path_arg("training script"), help="only this script's runs")
    sp.add_argument("--limit", type=_count, default=200, help="newest N records searched (1..100000)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_calibration)

    sp = sub.add_parser("exporter", help="serve autodl's own metrics (leases, waiting runs, estimate error, outcomes) for Prometheus")
    sp.add_argument("--port", type=_port, default=9108, help="TCP port (0-65535; default 9108)")
    sp.add_argument("--host", type=_host_arg, default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sp.set_defaults(func=cmd_exporter)


def _register_extra_commands(sub) -> None:
    """Add the subcommands other installed distributions declare in the ``autodl.commands`` entry point group
    (``autodl simulate`` comes from ``autodl-sim``, ``sim/``); one that cannot be loaded is left out with a
    note on stderr, so it never breaks the product's own commands."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="autodl.commands"):
        try:
            register = ep.load()
        except Exception as exc:  # an extra's import error must not take the product's CLI down with it
            print(f"autodl: the {ep.name!r} command ({ep.value}) is left out: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            continue
        register(sub)


def _count(text: str) -> int:
    """argparse type: a record count in 1..100000 (argparse turns the refusal into a usage error, exit 2)."""
    from autodl.inputs import short

    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"{short(text, 60)} is not a whole number from 1 to 100000")
    return value


def _terminate(_signum, _frame):
    # SIGTERM (timeout, kill) unwinds like Ctrl-C, so the probe sandbox and temporary files are cleaned up
    raise SystemExit(143)


def _one_value_each(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit 2) an option that should hold one value but holds a list: argparse turns ``--load=--``
    into ``[]`` without calling the option's type, which then failed deep inside as an internal error."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    command = getattr(args, "command", None)
    sp = sub.choices.get(command) if sub is not None and command is not None else None
    if sp is None:
        return
    for a in sp._actions:
        if type(a) is argparse._StoreAction and a.nargs is None and isinstance(getattr(args, a.dest, None), list):
            name = a.option_strings[0] if a.option_strings else a.dest
            sp.error(f"argument {name}: expected one value, got '--'; write the value itself, e.g. {name}=1")


def main(argv: list[str] | None = None) -> int:
    import signal

    parser = build_parser(sys.argv[1:] if argv is None else argv)
    _ARGV[:] = list(argv or [])
    args = parser.parse_args(argv)
    _one_value_each(parser, args)
    if getattr(args, "force", False) and getattr(args, "release", None) is None:
        parser.error("argument --force: only goes with --release RUN_KEY (it releases another user's lease)")
    if getattr(args, "command", None) == "queue" and not (args.hold or args.resume) and (args.team or args.reason):
        parser.error("arguments --team/--reason: only go with --hold or --resume (autodl queue --hold --team T --reason WHY)")
    if getattr(args, "command", None) == "queue" and args.resume and args.reason:
        parser.error("argument --reason: only goes with --hold")
    signal.signal(signal.SIGTERM, _terminate)
    from autodl.redact import redact_text

    try:
        return int(args.func(args) or 0)
    except AutoDLError as exc:
        print(f"autodl: error: {error_text(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("autodl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `autodl runs --json | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug is one line, never a traceback
        if os.environ.get("AUTODL_DEBUG"):
            raise
        reason = cut_echoes(redact_text(f"{type(exc).__name__}: {exc}"), sys.argv[1:] + _ARGV)
        print(f"autodl: internal error ({args.command}): {reason[:300]}; this is a bug in autodl, not your input: "
              "report it with the command line (AUTODL_DEBUG=1 shows the traceback).", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
