"""``place`` and ``observe``: turn a profile and an inventory into a ranked, explained placement; feed outcomes back to the bandit."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from autodl.catalog import Catalog, GPUModel
from autodl.errors import CatalogError
from autodl.policy.base import Need, Option, PolicyContext, get_policy
from autodl.spec import ResourcePolicySection
from autodl.types import Candidate, Device, Inventory, PlacementDecision, ResourceProfile, RunRecord

DEFAULT_ALLOWED_VENDORS = ("nvidia",)
"""Vendors used when ``resource_policy.allowed_vendors`` is unset. The stock PaddlePaddle wheel
(``paddlepaddle-gpu``) is a CUDA build; Ascend NPUs and Kunlun XPUs need a Paddle build for them
(PaddleCustomDevice / ``paddlepaddle-xpu``), which a spec declares by listing the vendor, e.g.
``allowed_vendors: [nvidia, ascend]``."""

MAX_LOAD_PCT = 90.0
"""A device whose utilization is above this is busy with another process: it stays a candidate
for ``fits`` but not for ``available`` (sharing a saturated GPU slows both runs)."""

MAX_KEPT_CANDIDATES = 20
"""Kept candidates listed in a decision (best first); the rest are counted in the last kept one's reasons."""

_GIB = 2**30


def _gib(n: int | float) -> str:
    return f"{n / _GIB:.1f} GiB"


@dataclass
class _Group:
    host: str
    model: str
    vendor: str
    gpu: GPUModel | None
    order: int
    fitting: list[Device] = field(default_factory=list)    # could ever hold the run
    available: list[Device] = field(default_factory=list)  # free now


def place(
    profile: ResourceProfile,
    inventory: Inventory,
    *,
    catalog: Catalog,
    policy: ResourcePolicySection,
    algorithm: str = "rule_based",
    leased: frozenset[str] = frozenset(),
    num_gpus: int | None = None,
    store_url: str | None = None,
    seed: int = 0,
) -> PlacementDecision:
    """Rank the pool's device sets for a run and choose the best.

    A device set is ``num_gpus`` devices of one model on one host (a gang; never partial),
    NVLink-connected when the inventory knows topology and a group holds enough free devices.
    A device could ever hold the run when its vendor is allowed and
    ``peak_memory_bytes <= threshold x memory_total_bytes`` (threshold = ``policy.memory_threshold``
    for policies with headroom, 1.0 for the baselines); it is free now when also healthy, not in
    ``leased``, at most :data:`MAX_LOAD_PCT` busy, and ``peak_memory_bytes <= memory_free_bytes``.
    Declared (non-real) devices are treated the same.

    :param profile: the run's profile (per-device peak memory, FLOPs per step, gang size).
    :param inventory: the pool snapshot.
    :param catalog: device models (TFLOPS, bandwidth, price, tags).
    :param policy: the spec's ``resource_policy`` section (threshold, preferred order, tag
        priorities, allowed vendors; ``None`` vendors = :data:`DEFAULT_ALLOWED_VENDORS`).
    :param algorithm: registry name: ``rule_based``, ``rl_based``, ``fifo_first_fit``, ``random``,
        ``best_fit_memory``, ``gavel_max_throughput``.
    :param leased: device ids booked by live leases.
    :param num_gpus: gang size; default ``profile.num_gpus``.
    :param store_url: store holding the rl_based bandit (default :func:`autodl.config.store_url`).
    :param seed: seed of the random baseline's draws.
    :returns: the decision: ``fits``, ``available``, ranked candidates with reasons and terms,
        ``chosen``, and ``suggestions`` when nothing in the pool could ever hold the run.
    :raises AutoDLError: when ``algorithm`` is not registered.
    """
    pol = get_policy(algorithm)
    n = int(num_gpus or profile.num_gpus or 1)
    threshold = policy.memory_threshold if pol.headroom else 1.0
    allowed = set(policy.allowed_vendors) if policy.allowed_vendors is not None else set(DEFAULT_ALLOWED_VENDORS)
    need = profile.peak_memory_bytes

    gpu_cache: dict[str, tuple[GPUModel | None, str]] = {}   # inventory model name -> (catalog entry, name)
    step_cache: dict[str, float | None] = {}
    groups: dict[tuple[str, str], _Group] = {}
    dropped: dict[tuple[str, str], list[Device]] = {}   # (model, reason) -> devices
    never_reason: dict[tuple[str, int], str] = {}
    vendor_reason = {}
    free_reason = f"not enough free memory now: needs {_gib(need)}"
    busy_reason = f"busy: utilization above {MAX_LOAD_PCT:.0f}%"
    max_util = MAX_LOAD_PCT

    # One tight pass over the devices (10,000 devices must take milliseconds): look-ups are cached
    # per model name, reasons per (model, memory) and devices are grouped per (host, model).
    for dev in inventory.devices:
        hit = gpu_cache.get(dev.model)
        if hit is None:
            gpu = catalog.find(dev.model)
            hit = gpu_cache[dev.model] = (gpu, gpu.name if gpu else dev.model)
        gpu, model = hit
        vendor = gpu.vendor if gpu is not None else dev.vendor   # Device.vendor defaults to nvidia
        total = dev.memory_total_bytes
        if vendor not in allowed:
            reason = vendor_reason.get(vendor)
            if reason is None:
                reason = vendor_reason[vendor] = (
                    f"vendor {vendor!r} needs a Paddle build for it; add '{vendor}' to "
                    f"resource_policy.allowed_vendors to use it (allowed: {', '.join(sorted(allowed))})"
                )
        elif need > threshold * total:
            reason = never_reason.get((model, total))
            if reason is None:
                reason = never_reason[(model, total)] = (
                    f"never fits: needs {_gib(need)} > {threshold:g} x {_gib(total)} = {_gib(threshold * total)}"
                )
        else:
            key = (dev.host, model)
            grp = groups.get(key)
            if grp is None:
                grp = groups[key] = _Group(dev.host, model, vendor, gpu, len(groups))
            grp.fitting.append(dev)
            if not dev.healthy:
                reason = "unhealthy"
            elif dev.device_id in leased:
                reason = "leased by another run"
            elif dev.utilization_pct > max_util:
                reason = busy_reason
            elif need > total - dev.memory_used_bytes:
                reason = free_reason
            else:
                grp.available.append(dev)
                continue
        lst = dropped.get((model, reason))
        if lst is None:
            lst = dropped[(model, reason)] = []
        lst.append(dev)

    fits = any(len(g.fitting) >= n for g in groups.values())
    ready = [g for g in groups.values() if len(g.available) >= n]
    if n > 1:
        for grp in groups.values():
            if n > len(grp.fitting) > 0:
                why = f"gang of {n} needs {n} fitting devices on one host; {grp.host} has {len(grp.fitting)}"
                dropped.setdefault((grp.model, why), []).extend(grp.available)
            elif n > len(grp.available) > 0:
                why = f"gang of {n}: only {len(grp.available)} device(s) free now on {grp.host}"
                dropped.setdefault((grp.model, why), []).extend(grp.available)
    # Within one device model every term but load is equal, so only the least-loaded
    # MAX_KEPT_CANDIDATES device sets of each model can rank among the best ones.
    by_model: dict[str, list[_Group]] = {}
    for g in ready:
        by_model.setdefault(g.model, []).append(g)
    total_ready = len(ready)
    if any(len(v) > MAX_KEPT_CANDIDATES for v in by_model.values()):
        ready = []
        for v in by_model.values():
            if len(v) > MAX_KEPT_CANDIDATES:
                v = heapq.nsmallest(
                    MAX_KEPT_CANDIDATES, v,
                    key=lambda g: (min(d.utilization_pct for d in g.available) if n == 1 else 0.0, g.order),
                )
            ready.extend(v)
        ready.sort(key=lambda g: g.order)

    options: list[Option] = []
    kept_reasons: list[list[str]] = []
    for grp in ready:
        devs, nvlink, why = _choose_set(grp.available, n)
        if grp.model not in step_cache:
            step = None
            if grp.gpu is not None:
                try:
                    from autodl.profile.runtime import estimate_step_time_s

                    step = estimate_step_time_s(profile, grp.gpu)
                except CatalogError:
                    step = None
            step_cache[grp.model] = step
        options.append(
            Option(
                devices=tuple(d.device_id for d in devs),
                model=grp.model,
                vendor=grp.vendor,
                host=grp.host,
                num_devices=n,
                memory_total_bytes=min(d.memory_total_bytes for d in devs),
                step_time_s=step_cache[grp.model],
                cost_per_hour_usd=grp.gpu.cost_per_hour_usd if grp.gpu else None,
                load=sum(d.utilization_pct for d in devs) / (100.0 * n),
                tags=tuple(grp.gpu.tags) if grp.gpu else (),
                order=grp.order,
                nvlink=nvlink,
            )
        )
        kept_reasons.append([why] if why else [])

    ctx = PolicyContext(
        preferred_devices=list(policy.preferred_devices),
        tag_priorities=dict(policy.tag_priorities),
        memory_threshold=policy.memory_threshold,
        rng=random.Random(seed),
        bandit=_load_bandit(store_url) if algorithm == "rl_based" else None,
    )
    scored = pol.score(Need(need, n, profile.script), options, ctx) if options else []
    order = sorted(range(len(options)), key=lambda i: (-scored[i].score, options[i].order, options[i].devices))
    candidates: list[Candidate] = []
    for rank, i in enumerate(order[:MAX_KEPT_CANDIDATES]):
        o, s = options[i], scored[i]
        free_min = min(d.memory_total_bytes - d.memory_used_bytes for d in groups[(o.host, o.model)].available
                       if d.device_id in o.devices)
        reasons = [
            f"fits: needs {_gib(need)} <= {threshold:g} x {_gib(o.memory_total_bytes)}; {_gib(free_min)} free now",
            *kept_reasons[i], *s.reasons,
        ]
        if o.model in ctx.preferred_devices:
            reasons.append(f"preferred #{ctx.preferred_devices.index(o.model) + 1} in resource_policy.preferred_devices")
        if o.step_time_s is None:
            reasons.append("step time unknown: the catalog lacks a TFLOPS figure for this model")
        if o.cost_per_hour_usd is None:
            reasons.append("no list price in the catalog: cost not scored")
        if rank == MAX_KEPT_CANDIDATES - 1 and total_ready > MAX_KEPT_CANDIDATES:
            reasons.append(f"{total_ready - MAX_KEPT_CANDIDATES} more free device sets not listed")
        candidates.append(
            Candidate(
                devices=list(o.devices), model=o.model, host=o.host, kept=True, score=round(s.score, 6),
                terms={k: round(v, 6) for k, v in s.terms.items()}, est_step_time_s=o.step_time_s, reasons=reasons,
            )
        )
    for (model, reason), devs in dropped.items():
        if not devs:
            continue
        hosts = {d.host for d in devs}
        candidates.append(
            Candidate(
                devices=[d.device_id for d in devs], model=model,
                host=next(iter(hosts)) if len(hosts) == 1 else "*", kept=False, reasons=[reason],
            )
        )

    chosen = candidates[0] if options else None
    suggestions: list[str] = []
    if not fits:
        suggestions = _suggestions(profile, inventory, catalog, policy, threshold, allowed, n, gpu_cache)
    return PlacementDecision(
        algorithm=algorithm,
        fits=fits,
        available=bool(options),
        needed_bytes=need,
        candidates=candidates,
        chosen=chosen,
        suggestions=suggestions,
    )


def _choose_set(available: list[Device], n: int) -> tuple[list[Device], bool, str | None]:
    """Pick ``n`` devices: inside the smallest NVLink group holding ``n`` free when topology is known,
    else the ``n`` least loaded (then lowest index)."""
    key = lambda d: (d.utilization_pct, -d.memory_free_bytes, d.index)  # noqa: E731
    if n == 1:
        return [min(available, key=key)], False, None
    by_group: dict[str, list[Device]] = {}
    for d in available:
        if d.nvlink_group:
            by_group.setdefault(d.nvlink_group, []).append(d)
    fitting = sorted((len(v), g) for g, v in by_group.items() if len(v) >= n)
    if fitting:
        g = fitting[0][1]
        return sorted(by_group[g], key=key)[:n], True, f"gang of {n} inside NVLink group {g}"
    why = f"gang of {n} over PCIe: no NVLink group holds {n} free devices" if by_group else None
    return sorted(available, key=key)[:n], False, why


def _suggestions(profile, inventory, catalog, policy, threshold, allowed, n, gpu_cache) -> list[str]:
    models: dict[str, int] = {}
    for d in inventory.devices:
        gpu = catalog.find(d.model)
        name = gpu.name if gpu else d.model
        if (d.vendor or (gpu.vendor if gpu else "nvidia")) not in allowed:
            continue
        models[name] = max(models.get(name, 0), d.memory_total_bytes)
    try:
        from autodl.profile import advice  # provided by the profiler

        gpu_models = [catalog.find(m) for m in models if catalog.find(m) is not None]
        return list(advice(profile, gpu_models, threshold))
    except (ImportError, AttributeError):
        pass
    out = []
    for name, mem in sorted(models.items(), key=lambda kv: -kv[1]):
        b = profile.max_batch_size(mem, threshold)
        if b <= 0:
            out.append(f"{name} ({_gib(mem)}): even batch 1 exceeds {threshold:g} x memory; model states alone are too big.")
        else:
            out.append(
                f"{name} ({_gib(mem)}): lower the per-device batch from {profile.batch_size} to {b} "
                f"(task.batch_size_per_gpu) to fit within {threshold:g} x memory."
            )
    if not profile.amp and policy.allow_mixed_precision:
        out.append("Enable AMP (paddle.amp.auto_cast, level O1 or O2): fp16 activations take about half the bytes.")
    if not profile.recompute:
        out.append("Enable recompute (paddle.distributed.fleet.utils.recompute) to trade compute for activation memory.")
    if n > 1:
        out.append(f"A gang of {n} must fit on one host; lower task.num_gpus_estimate if no host has {n} such devices.")
    bigger = sorted(
        (m for m in catalog.models.values() if m.vendor in allowed and profile.peak_memory_bytes <= threshold * m.memory_bytes),
        key=lambda m: m.memory_bytes,
    )
    if bigger:
        out.append(f"The catalog's {bigger[0].name} ({_gib(bigger[0].memory_bytes)}) would hold this run as it is.")
    return out


# --------------------------------------------------------------------------------- bandit I/O
def _load_bandit(store_url: str | None):
    from autodl.policy.rl_based import load_bandit

    return load_bandit(store_url)


def observe(record: RunRecord, *, catalog: Catalog, store_url: str | None = None) -> None:
    """Feed one finished run to the rl_based bandit (the arm of ``record.device_model``).

    Context: the chosen candidate's rule terms in ``record.placement``. Reward: failed ->
    :data:`autodl.policy.rl_based.FAILURE_REWARD`; succeeded -> ln(throughput relative to
    :data:`~autodl.policy.rl_based.REFERENCE_MODEL`) - cost_weight x ln(price ratio). Throughput is
    the measured ``metrics['step_time_s']`` (reported by the training through AUTODL_METRICS_FILE) when
    the record has it and the pool was real, else the catalog estimate. Records without a device model, a placement or that
    never started are ignored.

    :param record: the run record.
    :param catalog: device models (prices, the reference device).
    :param store_url: the store (default :func:`autodl.config.store_url`).
    """
    from sqlalchemy import select

    from autodl.policy.rl_based import REFERENCE_MODEL, LinUCB, features_from_terms
    from autodl.policy.rl_state import BanditArmRow
    from autodl.store import session_factory

    if record.outcome == "not_started" or not record.device_model or not record.placement:
        return
    placement = record.placement or {}
    chosen = placement.get("chosen") or placement  # the select step records the chosen Candidate itself
    terms = chosen.get("terms") or {}
    if not terms:
        return
    gpu = catalog.find(record.device_model)
    arm = gpu.name if gpu else record.device_model
    ref = catalog.find(REFERENCE_MODEL)
    rel = None
    if record.outcome == "succeeded" and record.profile and ref is not None:
        from autodl.profile.runtime import estimate_step_time_s

        try:
            prof = ResourceProfile.model_validate(record.profile)
            ref_step = estimate_step_time_s(prof, ref)
            # a run on a declared pool trained on CPU: its measured step time says nothing of the device
            actual = None if record.declared_pool else (record.metrics or {}).get("step_time_s")
            if actual is None and gpu is not None:
                actual = estimate_step_time_s(prof, gpu)
            rel = ref_step / actual if actual else None
        except (CatalogError, ValueError):
            rel = None
    bandit = LinUCB()
    reward = bandit.reward(
        rel if record.outcome == "succeeded" else None,
        gpu.cost_per_hour_usd if gpu else None,
        ref.cost_per_hour_usd if ref else None,
        failed=record.outcome == "failed",
    )
    x = features_from_terms(terms)
    import json

    with session_factory(store_url)() as s, s.begin():
        q = select(BanditArmRow).where(BanditArmRow.policy == "rl_based", BanditArmRow.arm == arm)
        if s.bind.dialect.name != "sqlite":
            q = q.with_for_update()
        row = s.execute(q).scalar_one_or_none()
        if row is not None:
            bandit.load_rows({arm: {"a_inv": json.loads(row.a_inv_json), "b": json.loads(row.b_json), "count": row.count}})
        else:
            row = BanditArmRow(policy="rl_based", arm=arm, dim=len(x), a_inv_json="", b_json="", count=0)
            s.add(row)
        bandit.update(arm, x, reward)
        a = bandit.arm(arm)
        row.a_inv_json, row.b_json, row.count, row.dim = json.dumps(a.a_inv), json.dumps(a.b), a.count, len(x)
