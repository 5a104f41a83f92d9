"""``place`` and ``observe``: turn a profile and an inventory into a ranked, explained placement; feed outcomes back to the bandit."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Protocol

from autodl.catalog import Catalog, GPUModel
from autodl.errors import CatalogError
from autodl.inventory.effective import effective_model
from autodl.policy.base import Need, Option, PolicyContext, Scored
from autodl.policy.need import needed_bytes, size_unknown, unknown_size_reason
from autodl.policy.registry import get_policy
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

UNKNOWN_FREE_REASON = "free memory unknown (the inventory could not read used memory): not placed until it can"
"""Why a device whose used memory is unknown is not free now: unknown is not idle."""

MAX_KEPT_CANDIDATES = 20
"""Kept candidates listed in a decision (best first); the rest are counted in the last kept one's reasons."""

_GIB = 2**30


def _gib(n: int | float) -> str:
    return f"{n / _GIB:.1f} GiB"


@dataclass
class Group:
    """Devices of one model on one host that could ever hold the run."""

    host: str
    model: str
    vendor: str
    gpu: GPUModel | None
    order: int                                              # first-appearance order in the pool
    nfit: int = 0                                           # devices that could ever hold the run
    available: list[Device] = field(default_factory=list)  # of those, free now (pool order)
    chosen: tuple[list[Device], bool, str | None] | None = None  # _choose_set's answer, when known


class Partitioner(Protocol):
    """The per-device pass of ``place``: :func:`partition`'s signature and answer."""

    def __call__(self, inventory: Inventory, catalog: Catalog, allowed: set[str], threshold: float, need: int, n: int,
                 leased: frozenset[str]) -> "Partition": ...


@dataclass
class Partition:
    """What ``place`` scores and lists, before scoring.

    :ivar fits: some group holds ``n`` devices that could ever hold the run.
    :ivar total_ready: groups with ``n`` devices free now.
    :ivar ready: the groups worth scoring (at most :data:`MAX_KEPT_CANDIDATES` per model), pool order.
    :ivar dropped: (model, reason, device ids, host or ``"*"``) per non-empty dropped set, in the
        order the reference loop first meets each (model, reason).
    """

    fits: bool
    total_ready: int
    ready: list[Group]
    dropped: list[tuple[str, str, list[str], str]]


def place(profile: ResourceProfile, inventory: Inventory, *, catalog: Catalog, policy: ResourcePolicySection,
          algorithm: str = "rule_based", leased: frozenset[str] = frozenset(), num_gpus: int | None = None,
          store_url: str | None = None, seed: int = 0, partitioner: Partitioner | None = None) -> PlacementDecision:
    """Rank the pool's device sets for a run and choose the best.

    A device set is ``num_gpus`` devices of one model on one host (a gang; never partial),
    NVLink-connected when the inventory knows topology and a group holds enough free devices.
    A device could ever hold the run when its vendor is allowed and
    ``peak_memory_bytes <= threshold x memory_total_bytes`` (threshold = ``policy.memory_threshold``
    for policies with headroom, 1.0 for the baselines); it is free now when also healthy, not in
    ``leased``, at most :data:`MAX_LOAD_PCT` busy, and ``peak_memory_bytes <= memory_free_bytes``.
    Declared (non-real) devices are treated the same.

    The per-device pass is :func:`partition` (about 20 ms for a pool of 10,000 devices), unless ``partitioner``
    gives another that decides the same (the simulator's columnar index, ``autodl_sim.inventory_index``).

    :param profile: the run's profile (per-device peak memory, FLOPs per step, gang size).
    :param inventory: the pool snapshot.
    :param catalog: device models (TFLOPS, bandwidth, price, tags).
    :param policy: the spec's ``resource_policy`` section (threshold, preferred order, tag
        priorities, allowed vendors; ``None`` vendors = :data:`DEFAULT_ALLOWED_VENDORS`).
    :param algorithm: registry name (:mod:`autodl.policy.registry`): ``rule_based``, ``rl_based``, or one another
        distribution registered (the simulator's baselines).
    :param leased: device ids booked by live leases.
    :param num_gpus: gang size; default ``profile.num_gpus``.
    :param store_url: store holding the rl_based bandit (default :func:`autodl.config.store_url`).
    :param seed: seed of the policy's random draws (the simulator's random baseline).
    :param partitioner: the per-device pass, a drop-in for :func:`partition` (same arguments, same answer); None: it.
    :returns: the decision: ``fits``, ``available``, ranked candidates with reasons and terms,
        ``chosen``, and ``suggestions`` when nothing in the pool could ever hold the run.
    :raises AutoDLError: when ``algorithm`` is not registered.
    """
    pol = get_policy(algorithm)
    n = int(num_gpus or profile.num_gpus or 1)
    threshold = policy.memory_threshold if pol.headroom else 1.0
    allowed = set(policy.allowed_vendors) if policy.allowed_vendors is not None else set(DEFAULT_ALLOWED_VENDORS)
    need = needed_bytes(profile, inventory.devices, allowed, threshold)
    part = (partitioner or partition)(inventory, catalog, allowed, threshold, need, n, leased)
    options, kept_reasons = _placement_options(profile, part, n)
    ctx = _policy_context(policy, algorithm, store_url, seed)
    scored = pol.score(Need(need, n, profile.script), options, ctx) if options else []
    candidates = _kept_candidates(profile, part, options, scored, kept_reasons, ctx, need, threshold)
    candidates.extend(_dropped_candidates(part.dropped))
    suggestions = _suggestions(profile, inventory, catalog, policy, threshold, allowed, n) if not part.fits else []
    return PlacementDecision(algorithm=algorithm, fits=part.fits, available=bool(options), needed_bytes=need,
                             candidates=candidates, chosen=candidates[0] if options else None, suggestions=suggestions)


def _device_set_notes(devs: list[Device], why: str | None) -> str | None:
    """``why`` (the device set's NVLink note) with notes on unknown utilization and MIG instances added."""
    unknown_load = [d.device_id for d in devs if d.utilization_pct is None]
    if unknown_load:
        why = "; ".join(filter(None, [why, f"utilization unknown on {', '.join(unknown_load)}: scored as fully loaded"]))
    if devs[0].compute_fraction is not None:
        why = "; ".join(filter(None, [why, f"{devs[0].compute_fraction:.0%} of the GPU's compute (MIG instance): "
                                           "speed and cost scaled to it"]))
    return why


def _estimated_step_time_s(profile: ResourceProfile, gpu: GPUModel | None) -> float | None:
    """The run's estimated step time on a device model, or None when the catalog cannot say."""
    step = None
    if gpu is not None:
        try:
            from autodl.profile.runtime import estimate_step_time_s

            step = estimate_step_time_s(profile, gpu)
        except CatalogError:
            step = None
    return step


def _placement_options(profile: ResourceProfile, part: Partition, n: int) -> tuple[list[Option], list[list[str]]]:
    """One option to score per ready device group, and the notes on its device set (its reasons when kept)."""
    step_cache: dict[str, float | None] = {}
    options: list[Option] = []
    kept_reasons: list[list[str]] = []
    for grp in part.ready:
        devs, nvlink, why = grp.chosen or _choose_set(grp.available, n)
        why = _device_set_notes(devs, why)
        if grp.model not in step_cache:
            step_cache[grp.model] = _estimated_step_time_s(profile, grp.gpu)
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
                load=sum(load_pct(d) for d in devs) / (100.0 * n),
                tags=tuple(grp.gpu.tags) if grp.gpu else (),
                order=grp.order,
                nvlink=nvlink,
            )
        )
        kept_reasons.append([why] if why else [])
    return options, kept_reasons


def _policy_context(policy: ResourcePolicySection, algorithm: str, store_url: str | None, seed: int) -> PolicyContext:
    """What the placement policy scores with: the spec's preferences, a seeded rng, the bandit for rl_based."""
    return PolicyContext(
        preferred_devices=list(policy.preferred_devices),
        tag_priorities=dict(policy.tag_priorities),
        memory_threshold=policy.memory_threshold,
        rng=random.Random(seed),
        bandit=_load_bandit(store_url) if algorithm == "rl_based" else None,
    )


def _kept_candidates(profile: ResourceProfile, part: Partition, options: list[Option], scored: list[Scored],
                     kept_reasons: list[list[str]], ctx: PolicyContext, need: int, threshold: float) -> list[Candidate]:
    """The best :data:`MAX_KEPT_CANDIDATES` scored device sets as kept candidates, best first, with their reasons."""
    order = sorted(range(len(options)), key=lambda i: (-scored[i].score, options[i].order, options[i].devices))
    groups = {(g.host, g.model): g for g in part.ready}
    total_ready = part.total_ready
    candidates: list[Candidate] = []
    for rank, i in enumerate(order[:MAX_KEPT_CANDIDATES]):
        o, s = options[i], scored[i]
        free_min = min(d.memory_total_bytes - d.memory_used_bytes for d in groups[(o.host, o.model)].available
                       if d.device_id in o.devices and d.memory_used_bytes is not None)  # known for every free one
        reasons = [
            f"fits: needs {_gib(need)} <= {threshold:g} x {_gib(o.memory_total_bytes)}; {_gib(free_min)} free now",
            *kept_reasons[i], *s.reasons,
        ]
        _add_candidate_reasons(reasons, profile, o, ctx, need)
        if rank == MAX_KEPT_CANDIDATES - 1 and total_ready > MAX_KEPT_CANDIDATES:
            reasons.append(f"{total_ready - MAX_KEPT_CANDIDATES} more free device sets not listed")
        candidates.append(
            Candidate(
                devices=list(o.devices), model=o.model, host=o.host, kept=True, score=round(s.score, 6),
                terms={k: round(v, 6) for k, v in s.terms.items()}, est_step_time_s=o.step_time_s, reasons=reasons,
            )
        )
    return candidates


def _add_candidate_reasons(reasons: list[str], profile: ResourceProfile, option: Option, ctx: PolicyContext,
                           need: int) -> None:
    """Add to a kept candidate's ``reasons`` what its placement rests on: unknown size, preference, unknown figures."""
    if size_unknown(profile):
        reasons.insert(1, unknown_size_reason(need))
    if option.model in ctx.preferred_devices:
        reasons.append(f"preferred #{ctx.preferred_devices.index(option.model) + 1} in "
                       "resource_policy.preferred_devices")
    if option.step_time_s is None:
        reasons.append("step time unknown: the run's FLOPs are unknown (see the cold-start warning); speed and "
                       "cost not scored" if profile.flops_per_step is None else
                       "step time unknown: the catalog lacks a TFLOPS figure for this model")
    if option.cost_per_hour_usd is None:
        reasons.append("no list price in the catalog: cost not scored")


def _dropped_candidates(dropped: list[tuple[str, str, list[str], str]]) -> list[Candidate]:
    """One not-kept candidate per dropped device set, with the reason it was dropped."""
    candidates: list[Candidate] = []
    for model, reason, ids, host in dropped:
        # built from checked values (ids and models of the inventory, reasons made here): no need to
        # re-validate tens of thousands of device ids
        candidates.append(Candidate.model_construct(devices=ids, model=model, host=host, kept=False, reasons=[reason]))
    return candidates


def load_pct(device: Device) -> float:
    """A device's utilization for scoring; unknown counts as fully busy (100%), so a device whose load
    is known to be low ranks first."""
    return 100.0 if device.utilization_pct is None else device.utilization_pct


def resolve_model(model: str, device: Device, catalog: Catalog) -> GPUModel | None:
    """The catalog entry for a device model spelling, or the device's effective model (a MIG instance,
    ``'A100-SXM4-40GB MIG 1g.5gb'``, is its parent scaled to its share: :func:`autodl.inventory.effective.effective_model`)."""
    return catalog.find(model) or effective_model(device, catalog)


def vendor_reason(vendor: str, allowed: set[str]) -> str:
    return (
        f"vendor {vendor!r} needs a Paddle build for it; add '{vendor}' to "
        f"resource_policy.allowed_vendors to use it (allowed: {', '.join(sorted(allowed))})"
    )


def never_reason(need: int, threshold: float, total: int) -> str:
    return f"never fits: needs {_gib(need)} > {threshold:g} x {_gib(total)} = {_gib(threshold * total)}"


def gang_reason(n: int, never: bool, hosts: int, lo: int, hi: int, first_host: str) -> str:
    """One reason for all the hosts of a model where a gang of ``n`` does not fit (grouped, not one entry per host).

    :param never: the hosts hold fewer than ``n`` devices that could ever hold the run (else: fewer free now).
    :param hosts: how many hosts; ``lo``/``hi``: fewest/most fitting (``never``) or free devices among them;
        ``first_host``: the first of them in pool order (named when it is the only one).
    """
    span = f"{lo}" if lo == hi else f"{lo}-{hi}"
    if never:
        where = f"{first_host} has {lo}" if hosts == 1 else f"{hosts} hosts have {span}"
        return f"gang of {n} needs {n} fitting devices of this model on one host; {where}"
    if hosts == 1:
        return f"gang of {n}: only {lo} device(s) free now on {first_host}"
    return f"gang of {n}: only {span} device(s) free now on each of {hosts} hosts"


def free_reasons(need: int) -> tuple[str, str, str, str]:
    """Why a device that could ever hold the run is not free now, in the order they are checked."""
    return ("unhealthy", "leased by another run", f"busy: utilization above {MAX_LOAD_PCT:.0f}%",
            f"not enough free memory now: needs {_gib(need)}")


def partition(inventory: Inventory, catalog: Catalog, allowed: set[str], threshold: float, need: int,
              n: int, leased: frozenset[str]) -> Partition:
    """Sort the pool's devices into the groups ``place`` scores and the dropped sets it lists, in one loop over
    ``inventory.devices``.

    :param allowed: the allowed vendors; ``threshold``: the fraction of device memory the run may plan to use;
        ``need``: its per-device bytes; ``n``: its gang size; ``leased``: device ids booked by live leases.
    :returns: the :class:`Partition`.
    """
    gpu_cache: dict[str, tuple[GPUModel | None, str]] = {}   # inventory model name -> (catalog entry, name)
    groups: dict[tuple[str, str], Group] = {}
    dropped: dict[tuple[str, str], list[Device]] = {}   # (model, reason) -> devices
    never_cache: dict[tuple[str, int], str] = {}
    vendor_cache: dict[str, str] = {}
    free_reasons_now = free_reasons(need)
    unhealthy = free_reasons_now[0]
    for dev in inventory.devices:
        hit = gpu_cache.get(dev.model)
        if hit is None:
            gpu = resolve_model(dev.model, dev, catalog)
            hit = gpu_cache[dev.model] = (gpu, gpu.name if gpu else dev.model)
        gpu, model = hit
        vendor = gpu.vendor if gpu is not None else dev.vendor   # Device.vendor defaults to nvidia
        total = dev.memory_total_bytes
        if vendor not in allowed:
            reason = vendor_cache.get(vendor)
            if reason is None:
                reason = vendor_cache[vendor] = vendor_reason(vendor, allowed)
        elif need > threshold * total:
            reason = never_cache.get((model, total))
            if reason is None:
                reason = never_cache[(model, total)] = never_reason(need, threshold, total)
        else:
            key = (dev.host, model)
            grp = groups.get(key)
            if grp is None:
                grp = groups[key] = Group(dev.host, model, vendor, gpu, len(groups))
            grp.nfit += 1
            not_free = _not_free_reason(dev, need, total, leased, free_reasons_now)
            if not_free is None:
                grp.available.append(dev)
                continue
            reason = not_free
        if dev.health_reason and not dev.healthy and not reason.startswith(unhealthy):
            reason = f"{unhealthy}: {dev.health_reason}"   # say why the device cannot be read before its figures
        dropped.setdefault((model, reason), []).append(dev)

    fits = any(g.nfit >= n for g in groups.values())
    ready = [g for g in groups.values() if len(g.available) >= n]
    if n > 1:
        _drop_short_gangs(groups, n, dropped)
    total_ready = len(ready)
    return Partition(fits, total_ready, _least_loaded_per_model(ready, n), _dropped_sets(dropped))


def _not_free_reason(dev: Device, need: int, total: int, leased: frozenset[str],
                     reasons: tuple[str, str, str, str]) -> str | None:
    """Why ``dev`` (which could ever hold the run) is not free now (:func:`free_reasons`, checked in that order), or
    None when it is."""
    unhealthy, leased_reason, busy_reason, free_reason = reasons
    if not dev.healthy:
        return f"{unhealthy}: {dev.health_reason}" if dev.health_reason else unhealthy
    if dev.device_id in leased:
        return leased_reason
    if dev.utilization_pct is not None and dev.utilization_pct > MAX_LOAD_PCT:
        return busy_reason
    if dev.memory_used_bytes is None:
        return UNKNOWN_FREE_REASON
    if need > total - dev.memory_used_bytes:
        return free_reason
    return None


def _drop_short_gangs(groups: dict[tuple[str, str], Group], n: int, dropped: dict[tuple[str, str], list[Device]]) -> None:
    """Add to ``dropped`` the devices of groups that hold fewer than ``n`` (a gang) that could ever hold the run
    (never), or fewer than ``n`` free now, one reason per (model, never) over its hosts."""
    per_kind: dict[tuple[str, bool], list[tuple[str, int, list[Device]]]] = {}
    for grp in groups.values():
        if n > grp.nfit > 0 and grp.available:
            per_kind.setdefault((grp.model, True), []).append((grp.host, grp.nfit, grp.available))
        elif n > len(grp.available) > 0:
            per_kind.setdefault((grp.model, False), []).append((grp.host, len(grp.available), grp.available))
    for (model, never), hosts in per_kind.items():
        counts = [v for _, v, _ in hosts]
        why = gang_reason(n, never, len(hosts), min(counts), max(counts), hosts[0][0])
        dropped.setdefault((model, why), []).extend(d for _, _, devs in hosts for d in devs)


def _least_loaded_per_model(ready: list[Group], n: int) -> list[Group]:
    """``ready`` with at most :data:`MAX_KEPT_CANDIDATES` groups per device model, the least loaded, in pool order:
    within one device model every term but load is equal, so only those can rank among the best ones."""
    by_model: dict[str, list[Group]] = {}
    for g in ready:
        by_model.setdefault(g.model, []).append(g)
    if not any(len(v) > MAX_KEPT_CANDIDATES for v in by_model.values()):
        return ready
    kept: list[Group] = []
    for v in by_model.values():
        if len(v) > MAX_KEPT_CANDIDATES:
            v = heapq.nsmallest(
                MAX_KEPT_CANDIDATES, v,
                key=lambda g: (min(load_pct(d) for d in g.available) if n == 1 else 0.0, g.order),
            )
        kept.extend(v)
    kept.sort(key=lambda g: g.order)
    return kept


def _dropped_sets(dropped: dict[tuple[str, str], list[Device]]) -> list[tuple[str, str, list[str], str]]:
    """(model, reason, device ids, host or ``"*"``) per non-empty dropped set, in ``dropped``'s order."""
    out = []
    for (model, reason), devs in dropped.items():
        if not devs:
            continue
        hosts = {d.host for d in devs}
        out.append((model, reason, [d.device_id for d in devs], next(iter(hosts)) if len(hosts) == 1 else "*"))
    return out


def _choose_set(available: list[Device], n: int) -> tuple[list[Device], bool, str | None]:
    """Pick ``n`` devices: inside the smallest NVLink group holding ``n`` free when topology is known,
    else the ``n`` least loaded (then lowest index)."""
    key = lambda d: (load_pct(d), -(d.memory_free_bytes or 0), d.index)  # noqa: E731
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


def _gang_advice(n: int) -> str:
    """What to do when a gang of ``n`` devices fits no host."""
    return (f"A gang of {n} must fit on one host, on devices of one model; lower task.num_gpus_estimate (this run "
            f"plans {n}) if no host has {n} such devices.")


def _suggestions(profile, inventory, catalog, policy, threshold, allowed, n) -> list[str]:
    """Advice for a run nothing in the pool can hold, on each distinct device kind's own figures
    (its own memory: a MIG slice, a declared card; :func:`autodl.inventory.effective.effective_model`)."""
    models: dict[tuple[str, int], GPUModel | None] = {}
    for d in inventory.devices:
        gpu = resolve_model(d.model, d, catalog)
        name = gpu.name if gpu else d.model
        if (gpu.vendor if gpu else d.vendor or "nvidia") not in allowed or not d.memory_total_bytes:
            continue
        effective = effective_model(d, catalog)
        models.setdefault((name, d.memory_total_bytes), effective)
    try:
        from autodl.profile import advice  # provided by the profiler

        gpu_models = [m for m in models.values() if m is not None]
        gang = [_gang_advice(n)] if n > 1 else []  # the profiler's advice is about memory: a gang that fits no host
        return list(advice(profile, gpu_models, threshold)) + gang  # still needs saying
    except (ImportError, AttributeError):
        pass
    out = []
    for (name, mem), _gpu in sorted(models.items(), key=lambda kv: -kv[0][1]):
        b = profile.max_batch_size(mem, threshold)
        if b is None:
            out.append(f"{name} ({_gib(mem)}): the largest batch is unknown (the model's size is unknown: see the "
                       "cold-start warning, which says what measures it).")
        elif b <= 0:
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
        out.append(_gang_advice(n))
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


def observe(record: RunRecord, *, catalog: Catalog, store_url: str | None = None) -> bool:
    """Feed one finished run to the rl_based bandit (the arm of ``record.device_model``).

    Context: the chosen candidate's rule terms in ``record.placement`` (what the policy saw). Reward:
    failed -> :data:`autodl.policy.rl_based.FAILURE_REWARD`; succeeded -> ln(the catalog's estimated
    step time on :data:`~autodl.policy.rl_based.REFERENCE_MODEL` / the *measured* step time), the
    measured one being ``metrics['step_time_s']`` (reported by the training through
    AUTODL_METRICS_FILE). So the bandit learns how fast a device model really is for this kind of run
    where the catalog's figures are wrong; no price term (see :attr:`LinUCB.cost_weight`). A succeeded
    run with nothing measured on the device (a declared pool trains on CPU; no metrics file) teaches
    nothing and is not fed: its reward would only repeat the catalog's assumption. Records without a
    device model, a placement or that never started are ignored. The step time is the training's own word:
    one its record did not believe (``step_time_s`` None, :func:`autodl.metrics.checked_steps`) or one faster
    than the device's peak compute allows (:func:`autodl.profile.runtime.fastest_step_s`) teaches nothing.

    :param record: the run record.
    :param catalog: device models (the reference device).
    :param store_url: the store (default :func:`autodl.config.store_url`).
    :returns: whether the bandit was updated.
    """
    from sqlalchemy import select

    from autodl.policy.rl_based import REFERENCE_MODEL, LinUCB, features_from_terms
    from autodl.policy.rl_state import BanditArmRow
    from autodl.store import session_factory

    if record.outcome in ("not_started", "stopped") or not record.device_model or not record.placement:
        # a run stopped by hand (autodl leases --release) says nothing of how the device did
        return False
    terms = _chosen_terms(record.placement)
    if not terms:
        return False
    gpu = catalog.find(record.device_model)
    arm = gpu.name if gpu else record.device_model
    ref = catalog.find(REFERENCE_MODEL)
    rel = None
    if record.outcome == "succeeded":
        rel = _measured_speedup(record, gpu, ref)
        if rel is None:
            return False
    bandit = LinUCB()
    reward = bandit.reward(rel, gpu.cost_per_hour_usd if gpu else None, ref.cost_per_hour_usd if ref else None,
                           failed=record.outcome == "failed")
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
    return True


def _chosen_terms(placement: dict) -> dict:
    """The rule terms of the chosen candidate in a run's recorded placement (empty when it has none)."""
    chosen = placement.get("chosen") or placement  # the select step records the chosen Candidate itself
    return chosen.get("terms") or {}


def _measured_speedup(record: RunRecord, gpu: GPUModel | None, ref: GPUModel | None) -> float | None:
    """The reference device's estimated step time / the run's measured one; None when none believable was measured."""
    # a run on a declared pool trained on CPU: its measured step time says nothing of the device
    actual = None if record.declared_pool else (record.metrics or {}).get("step_time_s")
    if not isinstance(actual, (int, float)) or not actual > 0 or not record.profile or ref is None:
        return None
    from autodl.profile.runtime import estimate_step_time_s, fastest_step_s

    try:
        profile = ResourceProfile.model_validate(record.profile)
        ref_step = estimate_step_time_s(profile, ref)
    except (CatalogError, ValueError):
        return None
    if not ref_step or not ref_step > 0:
        return None
    floor = fastest_step_s(profile, gpu) if gpu else None
    if floor is not None and actual < floor:  # faster than the device's peak compute: not a measurement
        return None
    return ref_step / actual
