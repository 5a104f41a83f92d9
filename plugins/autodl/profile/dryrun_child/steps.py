"""Training steps and evaluation calls: the measured window of each step, what it records, and when to stop."""

import gc
import json
import os
import time

import paddle

from .batch import CTL, position, prefetch_correction, queue_bytes
from .flops import FL
from .readings import current, peak, reset_peak
from .report import note, save
from .state import CFG, RESULT, T0, DryRunDone, R, St


def counting(what):
    St.counting = what
    FL.state["on"] = bool(what)


def grad_enabled():
    try:
        return paddle.is_grad_enabled()
    except Exception:
        return True


_PROF = {"p": None}


def _record_start():
    """Record the allocation events of the first measured step (``paddle.profiler``, CPU, profile_memory)."""
    if not CFG["record_allocations"] or _PROF["p"] is not None or St.ends != 1:
        return
    try:
        import paddle.profiler as profiler
        p = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU], profile_memory=True)
        R["alloc_preexisting"] = current()
        p.start()
        _PROF["p"] = p
    except Exception as exc:  # noqa: BLE001 - the replay is an extra
        R["alloc_error"] = f"{type(exc).__name__}: {exc}"[:300]
        _PROF["p"] = False


def _record_stop():
    p = _PROF["p"]
    if not p:
        return
    _PROF["p"] = False
    try:
        p.stop()
        events = []

        def walk(node):
            for ev in getattr(node, "mem_node", None) or []:
                if "cpu" in str(ev.place).lower():
                    events.append((int(ev.timestamp_ns), int(ev.addr), int(ev.increase_bytes)))
            for c in list(getattr(node, "children_node", None) or []) + list(getattr(node, "runtime_node", None) or []):
                walk(c)
        for root in p.profiler_result.get_data().values():
            walk(root)
        events.sort()
        with open(os.path.join(os.path.dirname(RESULT), "alloc_events.json"), "w") as f:
            json.dump([[a, d] for _, a, d in events], f)
        R["alloc_events"] = len(events)
    except Exception as exc:  # noqa: BLE001
        R["alloc_error"] = f"{type(exc).__name__}: {exc}"[:300]


def start_window():
    gc.collect()
    _record_start()
    reset_peak()
    St.window = {"t0": time.monotonic(), "start_bytes": current(), "fwd_bwd": None, "batch": None,
                 "inputs": None, "flops": 0.0, "fwd_calls": 0, "tainted": False, "warmup": St.ends == 0,
                 "model": None, "recompute_flops": 0.0,
                 "cpos": position()}
    FL.state["flops"] = FL.state["pair"] = 0.0
    counting("train")


def end_step():
    """A step ended: record the measured window, start the next one."""
    St.ends += 1
    St.stepped = False
    w = St.window
    if w is not None and w["fwd_bwd"] is not None:
        opt_peak = peak()
        now = time.monotonic()
        corr = prefetch_correction(w)
        # the correction moves the prefetched batches to this step's size; a reading never goes below what was
        # allocated when the step began (a short run's schedule can make the correction larger than the step)
        floor = w["start_bytes"]
        rec = {"batch": w["batch"], "peak": max(floor, max(w["fwd_bwd"], opt_peak) + corr),
               "fwd_bwd_peak": max(floor, w["fwd_bwd"] + corr),
               "update_peak": max(floor, opt_peak + corr), "prefetch_correction": corr, "start_bytes": w["start_bytes"],
               "seconds": round(now - w["t0"], 4),
               "fwd_bwd_seconds": round(w["t_step"] - w["t0"], 4), "update_seconds": round(now - w["t_step"], 4),
               "inputs": w["inputs"], "fwd_flops": w["flops"], "fwd_calls": w["fwd_calls"], "draws": w.get("draws", 0),
               "pair_flops": w.get("pair_flops", 0.0),
               "recompute_flops": w["recompute_flops"],
               "measured": not (w["tainted"] or w["warmup"]) and w["batch"] is not None, "index": St.ends}
        # steady: the step before had the same batch, so what the script keeps of it (its logits, loss, batch)
        # during this step is of this batch, as in a real run
        prev = R["steps"][-1]["batch"] if R["steps"] else None
        rec["steady"] = prev == rec["batch"]
        rec["pos"] = w["pos"] if w.get("pos") is not None else w.get("cpos")
        # samples the loader (or the script's own batch-sized tensors) gave this step: the spec's unit
        rec["loader_batch"] = CTL.intended.get(rec["pos"]) or (
            None if CTL.reduce else getattr(w.get("loader"), "_autodl_batch", None))
        rec["queue_at_start"] = queue_bytes(w, 0)
        R["steps"].append(rec)
        if St.ends == 2:
            _record_stop()
        if rec["measured"]:
            CTL.after_step(rec)
    St.window = None
    counting(None)
    start_window()
    if w is not None and R["steps"] and R["steps"][-1]["index"] == St.ends:
        # what the script keeps of this step into the next (after gc), against what it kept of the previous one:
        # for a step that followed another batch size, its steady-state peak adds the difference
        last = R["steps"][-1]
        kept_delta = St.window["start_bytes"] - last["start_bytes"] - (queue_bytes(w, 1) - last["queue_at_start"])
        last["kept_adjust"] = 0 if last["steady"] else max(0, int(kept_delta))
    save()


def save_eval_partial(c):
    """Write the evaluation call measured so far (replaced by the complete record when it closes)."""
    R["eval_partial"] = {"batch": c["batch"], "peak": c["peak_at_exit"], "start_bytes": c["start_bytes"],
                         "inputs": c["inputs"], "fwd_flops": c.get("flops", 0.0), "grad": c["grad"],
                         "native_batch": c["native_batch"], "training_mode": c["training_mode"]}
    save()


def close_eval():
    c = St.eval_call
    if c is None:
        return
    St.eval_call = None
    rec = {"batch": c["batch"], "peak": peak(), "start_bytes": c["start_bytes"], "inputs": c["inputs"],
           "seconds": round(time.monotonic() - c["t0"], 4), "fwd_flops": c.get("flops", FL.state["flops"]), "grad": c["grad"],
           "training_mode": c["training_mode"], "train_done": R["train_done"], "native_batch": c["native_batch"]}
    R["evals"].append(rec)
    R.pop("eval_partial", None)
    St.eval_layers.append(c["layer"])
    counting(None)
    save()


def count_params():
    seen, total, trainable = set(), 0, 0
    layers = list(St.models)
    params = []
    for m in layers:
        params.extend(m.parameters())
    for opt in St.optimizers:
        for p in opt_params(opt):
            params.append(p)
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = int(p.numel())
        total += n
        if not p.stop_gradient:
            trainable += n
    R["params"], R["trainable"] = total, trainable
    R["model"] = [type(m).__name__ for m in layers]
    R["conv"] = any(type(s).__name__.startswith("Conv") for m in layers for s in m.sublayers(include_self=True))


def opt_params(opt):
    out = []
    for p in getattr(opt, "_parameter_list", None) or []:
        if isinstance(p, dict):
            out.extend(p.get("params") or [])
        else:
            out.append(p)
    return out


def maybe_finish():
    """At a hook where stopping is safe: end the run once training (and evaluation) are measured."""
    if not R["train_done"]:
        if time.monotonic() - T0 > CTL.budget_s * 1.5 and R["steps"]:
            note("time budget exceeded before both batch sizes were measured")
            CTL.mark_done()
        else:
            return
    if CTL.eval_expected and not R["eval_seen"]:
        CTL.extra_after_done += 1
        if CTL.extra_after_done <= CTL.max_extra_steps and time.monotonic() - T0 < CTL.budget_s * 1.5:
            return
        note("the evaluation pass was not reached within the dry run's step budget")
    raise DryRunDone()


def trained(layer):
    """Whether ``layer`` is (part of) what the optimizers update; True while no optimizer is known yet."""
    if not St.opt_param_ids:
        return True
    for p in layer.parameters():
        return id(p) in St.opt_param_ids
    return False
