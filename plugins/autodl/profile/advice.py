"""What to change when a profiled run does not fit: a smaller batch, AMP, recompute, or a bigger card."""

from __future__ import annotations

from autodl.catalog import GPUModel
from autodl.profile import memory as E
from autodl.types import ResourceProfile


def _variant(p: ResourceProfile, amp: str | None = None, recompute: bool = False) -> ResourceProfile:
    """The same run under another AMP level / recompute setting (model states and activations rescaled)."""
    b = p.breakdown
    cur = E.AMP_ACTIVATION_FACTOR.get(p.amp, 1.0) * (E.RECOMPUTE_FACTOR if p.recompute else 1.0)
    new = E.AMP_ACTIVATION_FACTOR.get(amp, 1.0) * (E.RECOMPUTE_FACTOR if recompute else 1.0)
    act_fp32 = b.activations_bytes / cur
    per_fp32 = p.activation_bytes_per_sample / cur
    if p.params is None or p.amp == amp:  # unknown parameters: the model states stay as estimated
        w, g, o = b.weights_bytes, b.gradients_bytes, b.optimizer_state_bytes
    else:
        w, g, o = E.model_states(p.params, p.trainable_params or p.params, p.optimizer, amp)
    bd = b.model_copy(update={"weights_bytes": w, "gradients_bytes": g, "optimizer_state_bytes": o,
                              "activations_bytes": int(act_fp32 * new)})
    return p.model_copy(update={"breakdown": bd, "peak_memory_bytes": bd.total_bytes, "amp": amp,
                                "recompute": recompute, "activation_bytes_per_sample": int(per_fp32 * new)})


def advice(profile: ResourceProfile, gpu_models: list[GPUModel], threshold: float) -> list[str]:
    """Suggestions for a run whose peak does not fit under ``threshold`` of some device models.

    For each model in ``gpu_models`` (the pool) that cannot hold the run at its batch size: the largest
    batch that fits; whether AMP O1, AMP O2 or recompute would make the planned batch fit; and the
    smallest catalog card that would hold it as is.

    :param profile: the run's profile.
    :param gpu_models: device models to advise for (the pool's, or the whole catalog).
    :param threshold: fraction of device memory a run may plan to use (e.g. 0.85).
    :returns: human-readable lines; empty when the run fits on every given model.
    """
    gib = 1 << 30
    lines: list[str] = []
    need = profile.peak_memory_bytes
    misfits = [m for m in gpu_models if need > threshold * m.memory_bytes]
    if not misfits:
        return lines
    variants = []
    if profile.amp != "O1" and profile.amp != "O2":
        variants.append(("AMP O1 (paddle.amp.auto_cast())", _variant(profile, "O1", profile.recompute)))
    if profile.amp != "O2":
        variants.append(("AMP O2 (paddle.amp.decorate(level='O2'))", _variant(profile, "O2", profile.recompute)))
    if not profile.recompute:
        variants.append(("recompute (paddle.distributed.fleet.utils.recompute)", _variant(profile, profile.amp, True)))
    for m in sorted(misfits, key=lambda m: m.memory_bytes):
        budget = threshold * m.memory_bytes
        largest = profile.max_batch_size(m.memory_bytes, threshold)
        head = (f"{m.name}: needs {need / gib:.1f} GiB at batch {profile.batch_size}, "
                f"{threshold:.0%} of {m.memory_bytes / gib:.1f} GiB is {budget / gib:.1f} GiB; ")
        head += ("largest batch that fits: unknown (the model's size is unknown)" if largest is None else
                 f"largest batch that fits: {largest}" if largest > 0 else
                 "what does not depend on the batch (model states and fixed workspace) does not fit at any batch")
        lines.append(head + ".")
        for label, v in variants:
            if v.peak_memory_bytes <= budget:
                lines.append(f"{m.name}: {label} would fit batch {profile.batch_size} "
                             f"({v.peak_memory_bytes / gib:.1f} GiB).")
    fitting = [m for m in gpu_models if need <= threshold * m.memory_bytes]
    try:
        from autodl.catalog import load_catalog
        catalog_models = list(load_catalog().models.values())
    except Exception:
        catalog_models = list(gpu_models)
    bigger = sorted((m for m in catalog_models if need <= threshold * m.memory_bytes), key=lambda m: m.memory_bytes)
    if bigger and not fitting:
        lines.append(f"smallest catalog card that holds batch {profile.batch_size}: {bigger[0].name} "
                     f"({bigger[0].memory_bytes / gib:.0f} GiB).")
    elif not bigger:
        lines.append("no catalog card holds this run at its batch size; reduce the batch, use AMP/recompute, "
                     "or shard the model (fleet sharding).")
    return lines
