"""Dry-run child: run the user's training script itself (``python script.py ARGS``) with hooks, measure each phase.

Details: docs/reference/estimator.md#autodlprofile_dryrun_child.
"""

import gc
import json
import os
import random
import runpy
import signal
import sys
import threading
import time
import traceback

CFG = json.load(open(sys.argv[1]))  # autodl.profile.dryrun.DryRunConfig: every key is there
SCRIPT = os.path.abspath(CFG["script"])
SCRIPT_DIR = os.path.dirname(SCRIPT)
USER_DIRS = tuple(os.path.abspath(d) + os.sep for d in CFG["user_dirs"] or [SCRIPT_DIR])
RESULT = CFG["result"]
T0 = time.monotonic()


class _DryRunDone(BaseException):
    """Raised from a hook to end the script once everything was measured."""


R = {
    "status": "starting", "steps": [], "evals": [], "replay": [], "params": None, "trainable": None,
    "model": None, "optimizer": None, "inputs": None, "num_workers": [], "datasets": [], "devices_asked": [],
    "distributed_calls": [], "amp": [], "conv": None, "loaders": [], "error": None, "end": None, "notes": [], "seconds": {},
    "train_done": False, "eval_seen": False, "created_batches": [],
    "max_reading": None, "max_reading_batch": None, "epoch_walk": [],
}
_SAVE_LOCK = threading.Lock()



def _kill_children():
    """DataLoader worker processes would outlive ``os._exit`` and keep the output pipes open."""
    try:
        import multiprocessing
        for c in multiprocessing.active_children():
            os.kill(c.pid, signal.SIGKILL)
    except Exception:  # noqa: BLE001
        pass

def save():
    with _SAVE_LOCK:
        R["seconds"]["elapsed"] = round(time.monotonic() - T0, 3)
        tmp = RESULT + ".tmp"
        with open(tmp, "w") as f:
            json.dump(R, f)
        os.replace(tmp, RESULT)


def note(msg):
    if msg not in R["notes"]:
        R["notes"].append(msg)


def _user_frame(depth=2):
    """True when the caller ``depth`` frames up is the user's code (the script's folder), not a library."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return False
    return _in_user_dirs(f.f_code.co_filename)


def _in_user_dirs(filename: str) -> bool:
    """Whether ``filename`` is the user's code: under one of :data:`USER_DIRS`. A pseudo-file (``<frozen os>``,
    ``<string>``) is nobody's file: made absolute it would land in the working folder, the user's."""
    return not filename.startswith("<") and os.path.abspath(filename).startswith(USER_DIRS)


os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
t_import = time.monotonic()
import paddle  # noqa: E402
from paddle.base import core  # noqa: E402

R["seconds"]["import_paddle"] = round(time.monotonic() - t_import, 3)
R["paddle_version"] = paddle.__version__
paddle.set_device("cpu")
_orig_set_device = paddle.set_device


def _peak():
    return int(core.host_memory_stat_peak_value("Allocated", 0))


def _current():
    return int(core.host_memory_stat_current_value("Allocated", 0))


READINGS_PAUSED = [False]
"""True while autodl's own replay trains the model (:func:`_replay`): what it allocates is not the script's."""


def _note_reading():
    """Keep the largest allocator peak the script reached while it ran (bytes) and the batch it ran at: the
    profile's figure is never below it, whatever stops the dry run later (a timeout, an error)."""
    if R["status"] != "running" or READINGS_PAUSED[0]:
        return
    w = St.window if "St" in globals() else None
    # the batches the dry run's own head had the loader hold past what the script's epoch has are autodl's
    v = _peak() - _beyond_epoch_bytes(w)
    if v > (R["max_reading"] or 0):
        R["max_reading"] = v
        R["max_reading_batch"] = (w or {}).get("batch")


def _reset():
    _note_reading()
    core.host_memory_stat_reset_peak_value("Allocated", 0)


READING_PERIOD_S = 0.5
"""How often the watcher keeps the allocator's peak (s): a dry run killed on its timeout keeps what it reached."""


def _watch():
    last = None
    while True:
        time.sleep(READING_PERIOD_S)
        try:
            _note_reading()
            if R["max_reading"] != last:
                last = R["max_reading"]
                save()
        except Exception:  # noqa: BLE001 - a reading missed is taken at the next tick or the next reset
            pass


# ------------------------------------------------------------------------------------------------ controller
class Ctl:
    """Chooses the batch of each training and evaluation batch, and decides when training is measured.

    Training batches follow a schedule by position (the loader's prefetch thread asks for sizes a few batches
    ahead, so a size must not depend on a measurement not yet made): ``m = lo // 2`` twice (warm-up, measured),
    ``lo`` twice, then -- decided when the first ``lo`` step was measured -- ``hi`` twice, the largest batch up to
    the target that the time and memory budgets allow (none when ``lo`` is the target already), then ``m`` until
    the run ends (cheap filler for batches prefetched before the end).
    """

    def __init__(self):
        self.native = None                       # the training loader's own batch size
        self.target = CFG["target_batch"]        # the batch the estimate is for (spec, else the script's)
        self.lo = CFG["lo"]
        self.plan = None                         # [hi] or [], decided after the first measured lo step
        self.plan_at = None                      # schedule position where the plan starts
        self.k = 0                               # training batches handed out so far
        self.intended = {}                       # position -> the size handed out
        self.mismatch = 0                        # measured steps whose batch was not the one handed out
        self.budget_s = float(CFG["budget_s"])
        self.mem_budget = int(CFG["mem_budget_bytes"])
        self.train_loader = None
        self.max_eval_batches = int(CFG["max_eval_batches"])
        self.eval_expected = bool(CFG["eval_expected"])
        self.extra_after_done = 0
        self.max_extra_steps = int(CFG["max_extra_steps"])
        self.reduce = bool(CFG["reduce"])
        self.own = False                         # the training loader's batch sampler builds its batches itself
        self.varies = False                      # the measured steps' inputs changed shape (per-sample)
        self.shape_steps = 0                     # steps measured on, waiting for the largest input at hi

    def top(self, orig):
        return self.target or self.native or orig

    def sizes(self, orig):
        top = self.top(orig)
        lo = max(1, min(top, self.lo or top))
        return max(1, lo // 2), lo

    def counts(self, steady=False):
        c = {}
        for s in R["steps"]:
            if s.get("measured") and (s.get("steady") or not steady):
                u = self.unit(s)
                c[u] = c.get(u, 0) + 1
        return c

    def axis(self):
        """Model batch per sample the schedule handed out (concatenated batches: 2, graph mini-batches: nodes per
        graph), from the measured steps: the ratio when at least two schedule sizes show the model's leading
        dimension following them (within 10%), 1.0 while it equals the size handed out, None while one size cannot
        tell, 0.0 when it does not follow (the script fixes its batch)."""
        pairs = [(s["loader_batch"], s["batch"]) for s in R["steps"] if s.get("measured") and s.get("loader_batch")
                 and s.get("batch")]
        if not pairs:
            return None
        ratios = [b / w for w, b in pairs]
        if len({w for w, _ in pairs}) < 2:
            return 1.0 if all(r == 1 for r in ratios) else None
        return sum(ratios) / len(ratios) if max(ratios) <= 1.1 * min(ratios) else 0.0

    def unit(self, s):
        """A step's batch in the schedule's unit (samples the loader handed out) once the model's batch follows it."""
        return s["loader_batch"] if s.get("loader_batch") and (self.axis() or 0) > 0 else s["batch"]

    def at(self, k, orig):
        """The batch of the ``k``-th training batch (0-based)."""
        if not self.reduce:
            return orig
        m, lo = self.sizes(orig)
        if m < lo:
            if k < 2:
                return m
            k -= 2
        if self.plan is None or k < 2:
            return lo
        if self.plan_at is None:
            self.plan_at = k
        j = k - self.plan_at
        if self.plan and j < 2:
            return self.plan[0]
        return (self.hi() or m) if self.varies else m

    def hi(self):
        """The largest size of the schedule (the plan's, else ``lo``), once the plan is decided; else None."""
        plan = R.get("plan") or {}
        return max([plan["lo"], *(self.plan or [])]) if "lo" in plan else None

    def larger_input_pending(self):
        """Whether the measured steps' inputs changed shape (a size the script draws per batch, e.g. multi-scale
        training) and the largest input per sample seen was not yet measured at the schedule's largest size: the
        steps then go on at that size (at most :data:`MAX_SHAPE_STEPS` more) so the figure is measured at it."""
        steps = [s for s in R["steps"] if s.get("measured") and s.get("inputs")]
        if len({_key(s["inputs"]) for s in steps}) < 2:
            return False
        self.varies = True
        most = max(_per_sample_elements(s) for s in steps)
        hi = self.hi()
        return hi is not None and not any(self.unit(s) == hi and _per_sample_elements(s) >= most for s in steps)

    def next_size(self, orig):
        size = self.at(self.k, orig)
        self.intended[self.k] = size
        self.k += 1
        return size

    def eval_batch(self, orig):
        top = self.target or self.native
        if not self.reduce or not top or self.plan is None:
            return orig
        hi = max([self.sizes(top)[1], *self.plan])
        return max(1, min(orig, int(round(orig * min(1.0, hi / top)))))

    def measured_sizes(self):
        return sorted(self.counts())

    def after_step(self, rec):
        """Called after each measured step: decide the plan, or that training is measured."""
        elapsed = time.monotonic() - T0
        want = rec.get("loader_batch")
        if self.reduce and want is not None and want != rec["batch"] and self.axis() == 0.0:
            self.mismatch += 1
        b = self.unit(rec) or 1
        top = self.target or self.native or (max(NATIVE_BATCHES) if NATIVE_BATCHES and R["created_batches"] else b)
        m, lo = self.sizes(top)
        c = self.counts()
        if self.own and rec.get("steady"):
            # its sizes are its own (a bucketing sampler): measured at the epoch's largest batch, as it makes it
            self.mark_done()
            return
        if self.mismatch >= 2:
            note(f"the training batch stayed at {b} whatever size the dry run asked the loader for (the script fixes it "
             "or builds its batches itself, e.g. with a BatchSampler)")
            self.mark_done()
            return
        if self.plan is None:
            plan = []
            if self.reduce and lo < top:
                # step time = update + batch x per-sample time; the lo steps still to come (two, and one or two
                # handed out by the prefetch thread before this decision), then two steps at hi
                per_t = max(1e-4, rec["fwd_bwd_seconds"]) / b
                t_upd = rec["update_seconds"]
                left = self.budget_s - elapsed - (4 if b < lo else 2) * (t_upd + lo * per_t)
                per_m = max(1, rec["peak"] - rec["start_bytes"]) / b
                by_time = int((left / 2 - t_upd) / per_t)
                if by_time < top:
                    by_time = int((left - t_upd) / per_t)
                by_mem = int((self.mem_budget - rec["start_bytes"]) / per_m)
                hi = min(top, by_time, by_mem)
                if hi > lo:
                    plan = [hi]
            self.plan = plan
            R["plan"] = {"m": m, "lo": lo, "then": plan, "native": self.native, "target": self.target,
                         "decided_at": rec["index"], "budget_s": self.budget_s}
            save()
        if self.plan is None:
            return
        need = sorted({m, lo, *self.plan})
        steady = self.counts(steady=True)
        # each size measured in a steady step (after a step of the same size: what the script keeps of the
        # previous step is then of this size); a first step at a size is enough when time is short
        n_opt = max(1, len(St.optimizers))  # a GAN's step is one window per optimizer: each needs a steady one
        if all(steady.get(s, 0) >= n_opt for s in need) or (all(c.get(s) for s in need)
                                                  and elapsed + rec["seconds"] > 1.5 * self.budget_s):
            if self.reduce and self.shape_steps < MAX_SHAPE_STEPS and elapsed + rec["seconds"] <= 1.5 * self.budget_s \
                    and self.larger_input_pending():
                self.shape_steps += 1
                return
            if self.shape_steps and self.larger_input_pending():
                note(f"the largest training input seen was not measured at batch {self.hi()} within "
                     f"{self.shape_steps} more steps")
            self.mark_done()
            return
        if len(c) < 2 and elapsed + rec["seconds"] > 1.5 * self.budget_s and not R["replay"]:
            # the next step would end past the budget (a slow step, a big model): the slope from a short replay of
            # the model at two small batches now, not a bound from one size (the script may be killed before)
            _replay()
            save()
        if elapsed > 1.5 * self.budget_s and c:
            note(f"time budget of {self.budget_s:.0f} s (+50%) reached after measuring batch sizes {sorted(c)}")
            self.mark_done()

    def mark_done(self):
        if not R["train_done"]:
            R["train_done"] = True
            R["seconds"]["train_done"] = round(time.monotonic() - T0, 3)
            save()


MAX_SHAPE_STEPS = 8
"""Training steps measured on, at the schedule's largest size, when the inputs change shape between steps and the
largest seen was measured at a smaller size only (a size drawn per batch from a few: 8 draws of 4 sizes miss the
largest with probability 0.1)."""


def _per_sample_elements(step):
    """Elements per sample of a step's inputs (all but their leading dimension)."""
    return sum(np_prod(d["shape"][1:]) for d in step.get("inputs") or [] if d.get("shape"))


CTL = Ctl()


# --------------------------------------------------------------------------------------------- step tracking
class St:
    model_ids = set()          # top-level layers with parameters the script called
    models = []
    depth = 0
    step_depth = 0
    window = None              # the step being measured
    steps_seen = 0             # optimizer updates
    ends = 0                   # step ends
    stepped = False            # an update since the last step end
    eval_call = None           # the evaluation call being measured
    flops = 0.0
    counting = None            # 'train' | 'eval' | None
    layer_depth = 0
    optimizers = []
    opt_param_ids = set()
    last_loader = None
    call_args = None
    eval_layers = []
    eval_keys = set()
    last_pos = None
    static_programs = {}       # paddle.static: id -> program an optimizer minimized
    static_optimizers = []
    static_info = None
    in_backward = False        # inside Tensor.backward: layers called now are recomputed blocks


def _sig(obj, out, depth=0, first=False):
    """Shapes and dtypes of the tensors in a forward's arguments (nested two levels); value range of integer
    tensors (token ids) for the first one only."""
    if isinstance(obj, paddle.Tensor):
        d = {"shape": [int(s) for s in obj.shape], "dtype": str(obj.dtype).split(".")[-1]}
        if first and "int" in d["dtype"] and obj.size and obj.size <= (1 << 24):
            try:
                d["min"], d["max"] = int(obj.min()), int(obj.max())
            except Exception:
                pass
        out.append(d)
    elif isinstance(obj, (list, tuple)) and depth < 3:
        for x in obj:
            _sig(x, out, depth + 1, first)
    elif isinstance(obj, dict) and depth < 3:
        for x in obj.values():
            _sig(x, out, depth + 1, first)
    return out


class _TSpec:
    """A tensor argument remembered by shape, dtype and value range (not by reference: holding the tensor would
    add it to every later step's peak)."""

    def __init__(self, t):
        self.shape = [int(x) for x in t.shape]
        self.dtype = str(t.dtype).split(".")[-1]
        self.lo = self.hi = None
        if "int" in self.dtype and t.size and t.size <= (1 << 24):
            try:
                self.lo, self.hi = int(t.min()), int(t.max())
            except Exception:  # noqa: BLE001
                pass


def _structure(v, d=0):
    if isinstance(v, paddle.Tensor):
        return _TSpec(v)
    if isinstance(v, (list, tuple)) and d < 3:
        return type(v)(_structure(x, d + 1) for x in v)
    if isinstance(v, dict) and d < 3:
        return {k: _structure(x, d + 1) for k, x in v.items()}
    return v


def _batch_of(sig):
    """The batch of a call's inputs: the first dimension of its first tensor with a shape; None when unknown or
    empty (a slice past the end of a tensor the dry run shrank has 0 rows: no batch, not a batch of 0)."""
    for d in sig:
        if d["shape"]:
            return d["shape"][0] or None
    return None


def _counting(what):
    St.counting = what
    FL.state["on"] = bool(what)


def _grad_enabled():
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
        R["alloc_preexisting"] = _current()
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


def _position():
    """The schedule position of the current training step for tensors the script creates: one per optimizer
    update, or per round of updates when several optimizers take turns (a GAN)."""
    return St.ends // max(1, len(St.optimizers))


def _start_window():
    gc.collect()
    _record_start()
    _reset()
    St.window = {"t0": time.monotonic(), "start_bytes": _current(), "fwd_bwd": None, "batch": None,
                 "inputs": None, "flops": 0.0, "fwd_calls": 0, "tainted": False, "warmup": St.ends == 0,
                 "model": None, "recompute_flops": 0.0,
                 "cpos": _position()}
    FL.state["flops"] = 0.0
    _counting("train")


def _end_step():
    """A step ended: record the measured window, start the next one."""
    St.ends += 1
    St.stepped = False
    w = St.window
    if w is not None and w["fwd_bwd"] is not None:
        opt_peak = _peak()
        now = time.monotonic()
        corr = _prefetch_correction(w)
        # the correction moves the prefetched batches to this step's size; a reading never goes below what was
        # allocated when the step began (a short run's schedule can make the correction larger than the step)
        floor = w["start_bytes"]
        rec = {"batch": w["batch"], "peak": max(floor, max(w["fwd_bwd"], opt_peak) + corr),
               "fwd_bwd_peak": max(floor, w["fwd_bwd"] + corr),
               "update_peak": max(floor, opt_peak + corr), "prefetch_correction": corr, "start_bytes": w["start_bytes"],
               "seconds": round(now - w["t0"], 4),
               "fwd_bwd_seconds": round(w["t_step"] - w["t0"], 4), "update_seconds": round(now - w["t_step"], 4),
               "inputs": w["inputs"], "fwd_flops": w["flops"], "fwd_calls": w["fwd_calls"],
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
        rec["queue_at_start"] = _queue_bytes(w, 0)
        R["steps"].append(rec)
        if St.ends == 2:
            _record_stop()
        if rec["measured"]:
            CTL.after_step(rec)
    St.window = None
    _counting(None)
    _start_window()
    if w is not None and R["steps"] and R["steps"][-1]["index"] == St.ends:
        # what the script keeps of this step into the next (after gc), against what it kept of the previous one:
        # for a step that followed another batch size, its steady-state peak adds the difference
        last = R["steps"][-1]
        kept_delta = St.window["start_bytes"] - last["start_bytes"] - (_queue_bytes(w, 1) - last["queue_at_start"])
        last["kept_adjust"] = 0 if last["steady"] else max(0, int(kept_delta))
    save()


def _key(sig):
    return tuple((tuple(d["shape"][1:]), d["dtype"]) for d in sig or [] if d.get("shape"))


def save_eval_partial(c):
    """Write the evaluation call measured so far (replaced by the complete record when it closes)."""
    R["eval_partial"] = {"batch": c["batch"], "peak": c["peak_at_exit"], "start_bytes": c["start_bytes"],
                         "inputs": c["inputs"], "fwd_flops": c.get("flops", 0.0), "grad": c["grad"],
                         "native_batch": c["native_batch"], "training_mode": c["training_mode"]}
    save()


def _queue_bytes(w, shift):
    """Bytes of the batches a single-process loader holds at the start of the window at ``pos + shift``."""
    L, pos = w.get("loader"), w.get("pos")
    if L is None or pos is None or not getattr(L, "_autodl_depth", 0) or not getattr(L, "_autodl_sample_bytes", 0):
        return 0
    return sum((CTL.intended.get(pos + shift + j) or 0) * L._autodl_sample_bytes for j in range(L._autodl_depth))


def _prefetch_correction(w):
    """Bytes to add to a step's measured peak so that it is the steady state at its batch: the loader's prefetched
    batches were of the sizes the schedule gave the next positions, in a real run they are of this batch."""
    L, pos = w.get("loader"), w.get("pos")
    if L is None or pos is None or not getattr(L, "_autodl_depth", 0) or not getattr(L, "_autodl_sample_bytes", 0):
        return 0
    b = CTL.intended.get(pos) or w["batch"] or 0  # in the loader's unit, as its prefetched batches are
    ahead = _epoch_ahead(L)
    corr = 0
    for j in range(1, L._autodl_depth + 1):
        nxt = CTL.intended.get(pos + j)
        if nxt is None:
            break
        # past the batches the script's epoch has ahead of its first, a prefetched batch is the dry run's own
        # (its head of the epoch's largest batch outlasts a short epoch): none is held in a real run
        corr += ((b if j <= ahead else 0) - nxt) * L._autodl_sample_bytes
    return int(corr)


def _beyond_epoch_bytes(w):
    """Bytes of the batches the loader held in the window ``w`` past the script's epoch (:func:`_epoch_ahead`): the
    dry run's head of the epoch's largest batch outlasts a short epoch, a real run holds none of them."""
    L, pos = (w or {}).get("loader"), (w or {}).get("pos")
    if L is None or pos is None or not getattr(L, "_autodl_depth", 0) or not getattr(L, "_autodl_sample_bytes", 0):
        return 0
    return sum((CTL.intended.get(pos + j) or 0) * L._autodl_sample_bytes
               for j in range(_epoch_ahead(L) + 1, L._autodl_depth + 1))


def _epoch_ahead(L):
    """Batches the script's loader can hold ahead of the one in use: its prefetch depth, at most the batches of one
    epoch after the first (an epoch of two batches holds one; a new epoch starts a new iterator). The depth where
    the epoch's length is not known (an iterable data set)."""
    try:
        n = len(L.batch_sampler.inner)
    except Exception:  # noqa: BLE001 - a sampler without a length: the loader's whole depth
        return L._autodl_depth
    return max(0, min(L._autodl_depth, int(n) - 1))


def _close_eval():
    c = St.eval_call
    if c is None:
        return
    St.eval_call = None
    rec = {"batch": c["batch"], "peak": _peak(), "start_bytes": c["start_bytes"], "inputs": c["inputs"],
           "seconds": round(time.monotonic() - c["t0"], 4), "fwd_flops": c.get("flops", FL.state["flops"]), "grad": c["grad"],
           "training_mode": c["training_mode"], "train_done": R["train_done"], "native_batch": c["native_batch"]}
    R["evals"].append(rec)
    R.pop("eval_partial", None)
    St.eval_layers.append(c["layer"])
    _counting(None)
    save()


def _count_params():
    seen, total, trainable = set(), 0, 0
    layers = list(St.models)
    params = []
    for m in layers:
        params.extend(m.parameters())
    for opt in St.optimizers:
        for p in _opt_params(opt):
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


def _opt_params(opt):
    out = []
    for p in getattr(opt, "_parameter_list", None) or []:
        if isinstance(p, dict):
            out.extend(p.get("params") or [])
        else:
            out.append(p)
    return out


def _maybe_finish():
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
    raise _DryRunDone()


# ------------------------------------------------------------------------------------------------- hooks
_orig_call = paddle.nn.Layer.__call__


def _trained(layer):
    """Whether ``layer`` is (part of) what the optimizers update; True while no optimizer is known yet."""
    if not St.opt_param_ids:
        return True
    for p in layer.parameters():
        return id(p) in St.opt_param_ids
    return False


def _layer_call(self, *a, **k):
    if St.depth == 0 and St.step_depth == 0 and (bool(self._parameters) or any(True for _ in self.parameters())):
        if id(self) not in St.model_ids:
            St.model_ids.add(id(self))
            St.models.append(self)
            _attach_flops(self)
        training = self.training and _grad_enabled()
        if not training and St.opt_param_ids and not _trained(self):
            training = True  # a frozen model (teacher, feature extractor) the optimizers do not train: in the step
        sig = _sig((a, k), [], first=R["inputs"] is None and training)
        if training:
            if St.eval_call is not None:
                _close_eval()
                if R["train_done"]:
                    raise _DryRunDone()
            if St.stepped and St.window is not None:  # an update without clear_grad: the step ended
                _end_step()
            if R["train_done"]:
                _maybe_finish()
            if St.window is None:
                _start_window()
            w = St.window
            if w["batch"] is None:
                w["batch"], w["inputs"] = _batch_of(sig), sig
                L = St.last_loader
                w["pos"], w["loader"] = (St.last_pos, L) if L is not None and L is CTL.train_loader or \
                    (L is not None and CTL.train_loader is None) else (None, None)
                if R["inputs"] is None:
                    R["inputs"] = sig
                    St.call_args = (self, _structure(a), _structure(k))
                    _count_params()
                    save()
            if w["model"] is None and _trained(self):
                w["model"] = id(self)
            if w["model"] == id(self) and not St.in_backward:
                # calls of the step's model: a frozen helper's forward, a separate head or a block recomputed
                # in the backward pass adds FLOPs to the step, not a forward call
                w["fwd_calls"] += 1
            _counting("train")
        else:
            if St.window is not None and St.window["fwd_bwd"] is None and St.steps_seen:
                St.window["tainted"] = True
            _close_eval()
            _mark_eval_loader()
            if not R["eval_seen"] and St.opt_param_ids:
                R["eval_seen"] = True
                R["seconds"]["eval_start"] = round(time.monotonic() - T0, 3)
            if R["train_done"] and (len(R["evals"]) >= int(CFG["max_eval_calls"]) or
                                    (_key(sig), _batch_of(sig)) in St.eval_keys):
                # this evaluation input was measured already. In a real run this call would also hold what the
                # script kept of the previous one (its prediction...): add that to the measured call, then end
                gc.collect()
                now = _current()
                for e in reversed(R["evals"]):
                    if _key(e["inputs"]) == _key(sig) and e["batch"] == _batch_of(sig):
                        e["steady_peak"] = e["peak"] + max(0, now - e["start_bytes"])
                        break
                save()
                raise _DryRunDone()
            gc.collect()
            _reset()
            FL.state["flops"] = 0.0
            _counting("eval")
            St.eval_call = {"t0": time.monotonic(), "start_bytes": _current(), "batch": _batch_of(sig),
                            "inputs": sig, "grad": _grad_enabled(), "training_mode": bool(self.training),
                            "layer": self, "native_batch": _eval_native()}
    St.depth += 1
    try:
        return _orig_call(self, *a, **k)
    finally:
        St.depth -= 1
        if St.depth == 0 and St.counting == "train" and St.window is not None:
            St.window["flops"] = FL.state["flops"]
        elif St.depth == 0 and St.counting == "eval" and St.eval_call is not None and St.eval_call["layer"] is self:
            # the evaluation forward ended: keep what it measured now (the script may never call the model again)
            c = St.eval_call
            c["peak_at_exit"], c["flops"] = _peak(), FL.state["flops"]
            St.eval_keys.add((_key(c["inputs"]), c["batch"]))
            save_eval_partial(c)


paddle.nn.Layer.__call__ = _layer_call
_orig_backward = paddle.Tensor.backward


def _backward(self, *a, **k):
    """``loss.backward()``: the FLOPs counted while it runs are forward passes recomputed (``recompute``), kept
    apart so that a step's training FLOPs are 3 x its forward plus them."""
    w, before, outer = St.window, FL.state["flops"], St.in_backward
    St.in_backward = True
    try:
        return _orig_backward(self, *a, **k)
    finally:
        St.in_backward = outer
        if w is not None and St.window is w and St.counting == "train" and not outer:
            w["recompute_flops"] += FL.state["flops"] - before


paddle.Tensor.backward = _backward  # type: ignore[method-assign]


def _on_step_enter(opt):
    if opt not in St.optimizers:
        # an optimizer's first update creates its state (moments): that step is a warm-up, not measured
        St.optimizers.append(opt)
        St.opt_param_ids.update(id(p) for p in _opt_params(opt))
        if St.window is not None:
            St.window["warmup"] = True
    L = St.last_loader
    if L is not None and getattr(L, "_autodl_role", None) is None and CTL.train_loader is None:
        L._autodl_role = "train"
        CTL.train_loader = L
        CTL.native = getattr(L, "_autodl_batch", None)
        if not getattr(L, "_autodl_walked", False):
            L._autodl_walked = True
            R["epoch_walk"].append({"loader": getattr(L, "_autodl_index", None), "read": False, "error": (
                "an IterableDataset" if getattr(L, "batch_sampler", None) is None else "not walked")})
    St.steps_seen += 1
    St.stepped = True
    if St.window is not None and St.counting == "train":
        St.window["flops"] = FL.state["flops"]  # with what ran outside any layer (a loss's matmul after forward)
    if St.window is not None and St.window["fwd_bwd"] is None:
        St.window["fwd_bwd"] = _peak()
        St.window["t_step"] = time.monotonic()
        _reset()
    _counting(None)


def _wrap_step(orig):
    def step(self, *a, **k):
        if St.step_depth == 0 and not _dynamic():
            # paddle.static: minimize() adds backward and update ops to the program; the steps are the
            # Executor.run calls of that program (see _static_run)
            St.step_depth += 1
            try:
                r = orig(self, *a, **k)
            finally:
                St.step_depth -= 1
            _static_minimized(self, a[0] if a else k.get("loss"))
            return r
        if St.step_depth == 0:
            _on_step_enter(self)
        St.step_depth += 1
        try:
            return orig(self, *a, **k)
        finally:
            St.step_depth -= 1
    step._autodl = True
    return step


def _wrap_clear(orig):
    def clear(self, *a, **k):
        r = orig(self, *a, **k)
        if St.step_depth == 0 and St.stepped:
            if St.ends == 0:
                _count_params()
            _end_step()
        return r
    clear._autodl = True
    return clear


def _patch_optimizer_class(cls):
    for name in ("step", "minimize"):
        f = cls.__dict__.get(name)
        if f is not None and not getattr(f, "_autodl", False):
            setattr(cls, name, _wrap_step(f))
    f = cls.__dict__.get("clear_grad")
    if f is not None and not getattr(f, "_autodl", False):
        setattr(cls, "clear_grad", _wrap_clear(f))


_Opt = paddle.optimizer.Optimizer
for _n in dir(paddle.optimizer):
    _c = getattr(paddle.optimizer, _n)
    if isinstance(_c, type) and issubclass(_c, _Opt):
        _patch_optimizer_class(_c)
_patch_optimizer_class(_Opt)
_orig_init_subclass = _Opt.__dict__.get("__init_subclass__")


def _opt_init_subclass(cls, **kw):
    super(_Opt, cls).__init_subclass__(**kw)
    _patch_optimizer_class(cls)


_Opt.__init_subclass__ = classmethod(_opt_init_subclass)
paddle.nn.Layer.clear_gradients = _wrap_clear(paddle.nn.Layer.clear_gradients)
if hasattr(paddle.nn.Layer, "clear_grad"):
    paddle.nn.Layer.clear_grad = _wrap_clear(paddle.nn.Layer.clear_grad)


# ----------------------------------------------------------------------------------------- paddle.static
def _dynamic():
    try:
        return paddle.in_dynamic_mode()
    except Exception:  # noqa: BLE001
        return True


def _static_minimized(opt, loss):
    """``minimize(loss)`` in static mode: remember the program it trains, its parameters and forward FLOPs."""
    prog = None
    try:
        prog = loss.block.program if hasattr(loss, "block") else loss.get_defining_op().get_parent_block().program
    except Exception:  # noqa: BLE001
        pass
    if prog is None:
        prog = paddle.static.default_main_program()
    St.static_programs[id(prog)] = prog
    if opt not in St.static_optimizers:
        St.static_optimizers.append(opt)
    total = trainable = 0
    flops = 0.0
    try:
        ops = list(prog.global_block().ops)
        for op in ops:
            name = op.name() if callable(getattr(op, "name", None)) else getattr(op, "type", "")
            if name == "builtin.parameter":
                n = 1
                for d in op.results()[0].shape:
                    n *= int(d)
                total += n
                attrs = op.attrs()
                trainable += n if attrs.get("trainable", True) and not attrs.get("stop_gradient", [False])[0] else 0
            elif name in ("pd_op.matmul", "pd_op.conv2d", "pd_op.conv3d", "pd_op.depthwise_conv2d",
                          "pd_op.conv1d"):
                out = [int(d) for d in op.results()[0].shape]
                srcs = [[int(d) for d in v.shape] for v in op.operands_source()]
                if not out or out[0] != -1 or any(d <= 0 for d in out[1:]):
                    continue
                per = 1
                for d in out[1:]:
                    per *= d
                if name == "pd_op.matmul":
                    attrs = op.attrs()
                    x = srcs[0]
                    k_dim = x[-2] if attrs.get("transpose_x") else x[-1]
                    flops += 2.0 * per * max(0, k_dim)
                else:
                    w = srcs[1]
                    kk = 1
                    for d in w[1:]:
                        kk *= d
                    flops += 2.0 * per * kk
    except Exception as exc:  # noqa: BLE001 - a legacy Program: its own API
        try:
            ps = prog.all_parameters()
            total = sum(int(abs(__import__("math").prod(p.shape))) for p in ps)
            trainable = sum(int(abs(__import__("math").prod(p.shape))) for p in ps if getattr(p, "trainable", True))
        except Exception:  # noqa: BLE001
            note(f"the static program's parameters could not be counted ({type(exc).__name__})")
            total = trainable = None
    St.static_info = {"params": total, "trainable": trainable, "flops": flops or None}


def _feed_sig(feed):
    out = []
    for v in (feed or {}).values() if isinstance(feed, dict) else []:
        shape = getattr(v, "shape", None)
        if shape is None:
            continue
        out.append({"shape": [int(x) for x in shape], "dtype": str(getattr(v, "dtype", "float32")).split(".")[-1]})
    return out


def _static_run(orig):
    def run(self, program=None, *a, **k):
        feed = k.get("feed", a[0] if a else None)
        prog = program if program is not None else paddle.static.default_main_program()
        prog = getattr(prog, "_program", prog)  # a CompiledProgram
        if not St.static_programs or id(prog) not in St.static_programs or not feed or St.step_depth:
            return orig(self, program, *a, **k)
        sig = _feed_sig(feed)
        batch = sig[0]["shape"][0] if sig and sig[0]["shape"] else None
        gc.collect()
        start = _current()
        _reset()
        t0 = time.monotonic()
        St.step_depth += 1
        try:
            r = orig(self, program, *a, **k)
        finally:
            St.step_depth -= 1
        peak = _peak()
        info = St.static_info or {}
        St.ends += 1
        prev = R["steps"][-1]["batch"] if R["steps"] else None
        secs = round(time.monotonic() - t0, 4)
        flops = (info.get("flops") or 0.0) * (batch or 0)
        R["steps"].append({"batch": batch, "peak": peak, "fwd_bwd_peak": peak, "update_peak": peak,
                           "start_bytes": start, "seconds": secs, "fwd_bwd_seconds": secs, "update_seconds": 0.0,
                           "inputs": sig, "fwd_flops": flops, "fwd_calls": 1 if flops else 0,
                           "measured": St.ends > 1 and batch is not None, "index": St.ends,
                           "steady": prev == batch, "static": True})
        if R["inputs"] is None:
            R["inputs"] = sig
        R["params"], R["trainable"] = info.get("params"), info.get("trainable")
        R["model"] = ["paddle.static Program"]
        R["optimizer"] = [type(o).__name__ for o in St.static_optimizers]
        note("the script trains a paddle.static program: each Executor.run of it with a feed is a step "
             "(forward, backward and update together), run at the script's own batch")
        save()
        steady = [x for x in R["steps"] if x["measured"] and x["steady"]]
        if len(steady) >= 1 and len([x for x in R["steps"] if x["measured"]]) >= 2:
            CTL.mark_done()
            _maybe_finish()
        return r
    run._autodl = True
    return run


try:
    paddle.static.Executor.run = _static_run(paddle.static.Executor.run)
except Exception:  # noqa: BLE001 - a build without paddle.static
    pass


# ------------------------------------------------------------------------------------------------- FLOPs
def _load_flops():
    import importlib.util
    spec = importlib.util.spec_from_file_location("_autodl_flops", os.path.join(os.path.dirname(__file__), "_flops.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FL = _load_flops()
FL.install(paddle)
_attach_flops = FL.attach


# ------------------------------------------------------------------------------------------- data loaders
from paddle.io import DataLoader  # noqa: E402

_orig_dl_init = DataLoader.__init__
_orig_dl_iter = DataLoader.__iter__


class _DynBatches:
    """A batch sampler over the loader's own one: the same indices in the same order, batch sizes chosen by
    :class:`Ctl`. It runs in the loader's prefetch thread, ahead of the script as in a real run (the prefetched
    batches are part of the measured peak), so a new size reaches the script a few batches after it is chosen."""

    def __init__(self, inner, loader):
        self.inner, self.loader = inner, loader
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)
        self.sampler = getattr(inner, "sampler", None)

    def __len__(self):
        return len(self.inner)

    def _role(self):
        L = self.loader
        if L._autodl_role == "train" or (L._autodl_role is None and CTL.train_loader in (None, L)):
            return "train"
        return "eval"

    def __iter__(self):
        pending = []
        src = iter(self.inner)
        orig = self.batch_size or 1
        own = self.batch_size is None  # the sampler builds its batches (a bucketing one): its sizes, not Ctl's
        head, src = _epoch_head(self, src)
        n_eval = n_train = 0
        while True:
            role = self._role()
            if role == "train":
                if R["train_done"]:
                    return
                self.loader._autodl_positions.append(CTL.k)
                if own:
                    try:
                        out = head if head is not None and n_train < HEAD_BATCHES else list(next(src))
                    except StopIteration:
                        return
                    CTL.own = True
                    CTL.intended[CTL.k] = len(out)
                    CTL.k += 1
                    n_train += 1
                    yield out
                    continue
                want = CTL.next_size(orig)
                if head is not None and n_train < HEAD_BATCHES:
                    n_train += 1
                    # the epoch's largest batch, its longest samples first: every measured size holds them
                    out = (head + [i for i in pending if i not in head])[:want]
                    while len(out) < want:
                        try:
                            out.extend(i for i in next(src) if i not in head)
                        except StopIteration:
                            break
                        out = out[:want]
                    if want != orig:
                        R["reduced"] = True
                    yield out
                    continue
            else:
                e = CTL.eval_batch(orig)
                want = max(1, e // 2) if n_eval == 0 else e
                n_eval += 1
            while len(pending) < want:
                try:
                    pending.extend(next(src))
                except StopIteration:
                    break
            if not pending or (len(pending) < want and self.drop_last):
                return
            out, pending = pending[:want], pending[want:]
            if want != orig:
                R["reduced"] = True
            yield out


HEAD_BATCHES = 12
"""Training batches of the first epoch made of its largest batch: the schedule's measured positions (two at each of
three sizes, :class:`Ctl`) and the batches the loader prefetches past them (up to five, ``_autodl_depth``)."""

EPOCH_WALK_S = 4.0
"""Seconds the walk over the first epoch may spend reading samples (a tenth of the dry run's budget,
``autodl.profile.dryrun.DRY_RUN_BUDGET_S`` = 40 s): a data set of small samples is read whole, a slow one (decoded
images) in part, and the report says so."""

EPOCH_WALK_SAMPLES = 50_000
"""Samples the walk reads at most (a CIFAR-sized epoch); the indices past it are not read."""


def _epoch_head(dyn, src):
    """Walk the first epoch of the training loader's own batch sampler (indices, then each batch read the
    framework's way: its samples, through the loader's ``collate_fn`` when it has one) and return its largest
    batch by the bytes the collated batch holds, longest samples first, and the iterator of the epoch's batches
    (those walked, then the rest). ``(None, src)`` when it is not the training loader or its samples cannot be
    read; what was read is in ``R["epoch_walk"]``."""
    L = dyn.loader
    if dyn._role() != "train" or getattr(L, "_autodl_walked", False):
        return None, src
    L._autodl_walked = True
    t0 = time.monotonic()
    info = {"loader": L._autodl_index, "read": False, "complete": False, "batches": 0, "samples": 0,
            "seconds": 0.0, "largest_bytes": None, "first_bytes": None, "largest_at": None, "largest_batch": None}
    R["epoch_walk"].append(info)
    walked, best, best_b = [], None, -1
    states = _rng_states()
    try:
        for b in src:
            walked.append(list(b))
            nb = _batch_bytes(L, walked[-1])
            info["first_bytes"] = nb if info["first_bytes"] is None else info["first_bytes"]
            if nb > best_b:
                best, best_b = len(walked) - 1, nb
            info["samples"] += len(walked[-1])
            if time.monotonic() - t0 > EPOCH_WALK_S or info["samples"] >= EPOCH_WALK_SAMPLES:
                break
        else:
            info["complete"] = True
        head = None if best is None else _steady_head(L, walked[best], best_b, info)
    except Exception as exc:  # noqa: BLE001 - a sample or a collate that fails here fails the run in its place
        info["error"] = f"{type(exc).__name__}: {exc}"[:200]
    _rng_restore(states)
    info["batches"], info["seconds"] = len(walked), round(time.monotonic() - t0, 3)
    rest = _chain(walked, src)
    if best is None or info.get("error"):
        info["samples"] = 0
        return None, rest
    info.update(read=True, largest_bytes=best_b, largest_at=best, largest_batch=len(walked[best]))
    save()
    return head, rest


def _steady_head(L, idx, nb, info):
    """The largest batch ``idx`` (``nb`` bytes when walked), longest samples first, when reading it again gives the
    same bytes; None when the data set draws its sizes anew at every read (a random resize in ``__getitem__``): then
    what the walk read is not what the steps get, ``info["varies"]`` says so and the steps run as the loader yields."""
    if _batch_bytes(L, idx) != nb:
        info["varies"] = True
        return None
    return _longest_first(L, idx)


def _rng_states():
    """Python's and NumPy's global generators, which a data set's random augmentation draws from: the walk's reads
    leave them as they were, so the steps draw what they would have drawn without the walk."""
    import random

    import numpy as np
    return random.getstate(), np.random.get_state()


def _rng_restore(states):
    import random

    import numpy as np
    random.setstate(states[0])
    np.random.set_state(states[1])


def _chain(walked, src):
    yield from walked
    yield from src


def _batch_bytes(L, idx):
    """Bytes of the tensors the loader makes of the samples ``idx`` (its ``collate_fn`` pads as it pads)."""
    items = [L._autodl_dataset[i] for i in idx]
    if L._autodl_collate is None:
        return sum(_sig_bytes(_sample_sig(x)) for x in items)
    return _sig_bytes(_sample_sig(L._autodl_collate(items)))


def _sig_bytes(sig):
    return sum(int(np_prod(d["shape"])) * _itemsize(d["dtype"]) for d in sig)


def _longest_first(L, idx):
    """``idx`` with, first, the samples longest in some dimension of some field (a batch of the first ``k`` is padded
    to the whole batch's lengths when ``k`` covers them), then the rest by their bytes."""
    sigs = {i: _sample_sig(L._autodl_dataset[i]) for i in idx}
    first = []
    for f in range(min(len(s) for s in sigs.values())):
        for d in range(min(len(s[f]["shape"]) for s in sigs.values())):
            i = max(idx, key=lambda j: sigs[j][f]["shape"][d])
            if i not in first:
                first.append(i)
    return first + sorted((i for i in idx if i not in first), key=lambda j: -_sig_bytes(sigs[j]))


def _dl_init(self, dataset, *a, **k):
    names = _orig_dl_init.__code__.co_varnames[2:_orig_dl_init.__code__.co_argcount]
    bound = dict(zip(names, a))
    bound.update(k)
    nw = bound.get("num_workers", 0)
    R["num_workers"].append(nw if isinstance(nw, int) else str(nw))
    if isinstance(nw, int) and nw > 2:
        bound["num_workers"] = 2  # fewer processes; batches still arrive through shared memory, as asked
    if bound.get("persistent_workers"):
        bound["persistent_workers"] = False
    if callable(bound.get("collate_fn")):
        bound["collate_fn"] = _collating(bound["collate_fn"])
    _orig_dl_init(self, dataset, **bound)
    self._autodl_role = None
    self._autodl_positions = []
    self._autodl_dataset, self._autodl_collate = dataset, bound.get("collate_fn")
    # batches the single-process loader holds ahead of the one in use (measured on Paddle 3.3.1: the blocking
    # queue's prefetch_factor, the buffered reader's two and the one its thread is pushing); with workers the
    # batches live in shared memory, outside the allocator
    single = not (isinstance(nw, int) and nw > 0)
    pf = bound.get("prefetch_factor", 2) or 2
    self._autodl_depth = (pf + (3 if bound.get("use_buffer_reader", True) else 2)) if single else 0
    self._autodl_batch = getattr(getattr(self, "batch_sampler", None), "batch_size", None) or bound.get("batch_size")
    info = {"batch_size": bound.get("batch_size", 1), "num_workers": nw if isinstance(nw, int) else None,
            "dataset": type(dataset).__name__}
    try:
        sample = dataset[0]
        info["first_sample"] = _sample_sig(sample)
    except Exception as exc:  # an IterableDataset or a dataset that cannot be indexed
        info["first_sample"] = None
        info["sample_error"] = type(exc).__name__
    info["sample_bytes"] = sum(int(np_prod(d["shape"])) * _itemsize(d["dtype"]) for d in info["first_sample"] or [])
    self._autodl_sample_bytes = info["sample_bytes"]
    self._autodl_index = len(R["loaders"])
    R["loaders"].append(info)
    if getattr(self, "batch_sampler", None) is not None:
        self.batch_sampler = _DynBatches(self.batch_sampler, self)
        if getattr(self, "_batch_sampler", None) is not None:
            self._batch_sampler = self.batch_sampler
    save()


_COLLATE = threading.local()
"""``on`` while a DataLoader's ``collate_fn`` runs (in the loader's prefetch thread or a worker)."""


def _collating(fn):
    """``fn``, marked while it runs: the tensors a collate function creates are the batch the loader's sampler
    already sized (the dry run drives it), not tensors of the run's batch to shrink; the prefetch thread collates
    batches ahead of the step the schedule is at, so shrinking them to that step's size cut a batch's images and
    left its list of boxes whole (retinanet_multiscale)."""
    def collate(*a, **k):
        _COLLATE.on = True
        try:
            return fn(*a, **k)
        finally:
            _COLLATE.on = False
    return collate


def np_prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _itemsize(dtype):
    d = str(dtype)
    for k, v in (("64", 8), ("32", 4), ("16", 2), ("8", 1), ("bool", 1)):
        if k in d:
            return v
    return 4


def _sample_sig(sample):
    import numpy as np
    out = []

    def rec(x, d=0):
        if isinstance(x, np.ndarray):
            out.append({"shape": list(x.shape), "dtype": str(x.dtype)})
        elif isinstance(x, paddle.Tensor):
            out.append({"shape": [int(s) for s in x.shape], "dtype": str(x.dtype).split(".")[-1]})
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            out.append({"shape": [], "dtype": "int64" if isinstance(x, int) else "float32"})
        elif isinstance(x, (list, tuple)) and x and all(isinstance(y, (int, float)) and not isinstance(y, bool)
                                                          for y in x):
            # a Python list of numbers (a tokenizer's ids): one field of that length, as a collate_fn stacks it
            out.append({"shape": [len(x)], "dtype": "int64" if all(isinstance(y, int) for y in x) else "float32"})
        elif isinstance(x, (list, tuple)) and d < 2:
            for y in x:
                rec(y, d + 1)
        elif isinstance(x, dict) and d < 2:
            for y in x.values():
                rec(y, d + 1)
    rec(sample)
    return out[:SAMPLE_FIELDS]


SAMPLE_FIELDS = 64
"""Fields of a first sample the report keeps (the parent refuses more:
:data:`autodl.profile.dryrun_report.SIG_TENSORS`)."""


def _dl_iter(self):
    it = _orig_dl_iter(self)

    def gen():
        n = 0
        try:
            while True:
                role = getattr(self, "_autodl_role", None)
                if role == "train" and R["train_done"]:
                    return
                if role == "eval" and n >= CTL.max_eval_batches:
                    return
                try:
                    batch = next(it)
                except StopIteration:
                    return
                n += 1
                St.last_loader = self
                pos = self._autodl_positions
                St.last_pos = pos.pop(0) if pos and getattr(self, "_autodl_role", None) != "eval" else None
                yield batch
        finally:
            try:
                it._try_shutdown_all()
            except Exception:
                pass
    return gen()


DataLoader.__init__ = _dl_init
DataLoader.__iter__ = _dl_iter

def _eval_native():
    """The batch size the evaluation loader feeding this call was built with (None: not from a loader)."""
    L = St.last_loader
    if L is not None and getattr(L, "_autodl_role", None) == "eval":
        return getattr(L, "_autodl_batch", None)
    return None


def _mark_eval_loader():
    L = St.last_loader
    if L is not None and getattr(L, "_autodl_role", None) is None and L is not CTL.train_loader:
        L._autodl_role = "eval"


# ------------------------------------------------------------------------------ data sets that download
STANDIN_SAMPLES = {"train": 1000, "test": 200}
"""Samples of a stand-in data set (per mode): enough batches for the dry run's steps, a few MiB on disk; multiples
of 100, as Paddle's MNIST reader reads 100 at a time (``buffer_size=100`` in ``paddle.vision.datasets.mnist``)."""


def _standin_file(url):
    """A file of the real format (Paddle's own reader parses it) with random samples, for a data set of Paddle's
    own that cannot download here: CIFAR-10/100 (a tar.gz of pickled batches: uint8 [N, 3072], labels) and the
    MNIST family (gzip idx files: uint8 [N, 28, 28] images, uint8 labels). None for any other URL."""
    import gzip
    import io
    import pickle
    import struct
    import tarfile

    import numpy as np

    name = url.rsplit("/", 1)[-1]
    path = os.path.join(os.getcwd(), ".autodl-standin", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(0)
    if name.startswith("cifar-"):
        k = 100 if "100" in name else 10
        key = b"fine_labels" if k == 100 else b"labels"
        members = {"train": "cifar-100-python/train" if k == 100 else "cifar-10-batches-py/data_batch_1",
                   "test": "cifar-100-python/test" if k == 100 else "cifar-10-batches-py/test_batch"}
        with tarfile.open(path, "w:gz") as tf:
            for mode, member in members.items():
                n = STANDIN_SAMPLES[mode]
                blob = pickle.dumps({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                                     key: [int(i % k) for i in range(n)]})
                info = tarfile.TarInfo(member)
                info.size = len(blob)
                tf.addfile(info, io.BytesIO(blob))
        return path
    if name.endswith("-ubyte.gz"):
        n = STANDIN_SAMPLES["test" if name.startswith("t10k") else "train"]
        with gzip.open(path, "wb") as f:
            if "images" in name:
                f.write(struct.pack(">IIII", 2051, n, 28, 28) + rng.integers(0, 256, n * 784, dtype=np.uint8).tobytes())
            else:
                f.write(struct.pack(">II", 2049, n) + bytes(i % 10 for i in range(n)))
        return path
    return None


def _patch_download(mod):
    orig = getattr(mod, "_check_exists_and_download", None)
    if orig is None:
        return

    def check(path, url, md5, module_name, download=True):
        try:
            return orig(path, url, md5, module_name, download)
        except Exception as exc:  # noqa: BLE001 - no network in the sandbox: a stand-in of the same format
            standin = _standin_file(url) if path is None else None
            if standin is None:
                raise
            R["standins"].append(url.rsplit("/", 1)[-1])
            note(f"Paddle's own data set file {url.rsplit('/', 1)[-1]} could not be downloaded here "
                 f"({type(exc).__name__}); random samples of its format stood in, through the script's own transform")
            return standin

    setattr(mod, "_check_exists_and_download", check)


R["standins"] = []
for _m in ("paddle.vision.datasets.cifar", "paddle.vision.datasets.mnist"):
    try:
        import importlib
        _patch_download(importlib.import_module(_m))
    except Exception:  # noqa: BLE001 - a Paddle without the module: nothing to stand in for
        pass


# ------------------------------------------------------------------------------ tensors the script creates
NATIVE_BATCHES = set(int(b) for b in CFG["native_batches"] if isinstance(b, int) and b > 1)


def _creation_batch():
    """The batch a tensor created by the script with the run's batch as first dimension should get now."""
    if not NATIVE_BATCHES:
        return None
    if not CTL.reduce:  # not reduced: still recorded as the step's batch in the script's unit
        return max(NATIVE_BATCHES)
    return CTL.at(_position(), max(NATIVE_BATCHES))


def _patch_creation(mod, name, shape_pos, shape_kw="shape"):
    orig = getattr(mod, name, None)
    if orig is None:
        return

    def f(*a, **k):
        b = _creation_batch() if _user_frame(2) and not getattr(_COLLATE, "on", False) else None
        if b is not None:
            shp = k.get(shape_kw) if shape_kw in k else (a[shape_pos] if len(a) > shape_pos else None)
            native = isinstance(shp, (list, tuple)) and shp and isinstance(shp[0], int) and shp[0] in NATIVE_BATCHES
            if native:
                CTL.intended[_position()] = min(b, shp[0])  # the step's batch in the script's unit, reduced or not
            if native and b < shp[0]:
                new = [b, *shp[1:]]
                if len(R["created_batches"]) < 50:
                    R["created_batches"].append([shp[0], b])
                R["reduced"] = True
                if shape_kw in k:
                    k[shape_kw] = new
                else:
                    a = a[:shape_pos] + (new,) + a[shape_pos + 1:]
        return orig(*a, **k)
    setattr(mod, name, f)


for _name in ("randn", "rand", "zeros", "ones", "empty", "standard_normal"):
    _patch_creation(paddle, _name, 0)
_patch_creation(paddle, "randint", 2)
_patch_creation(paddle, "full", 0)
_patch_creation(paddle, "uniform", 0)
_patch_creation(paddle, "normal", 2)
_orig_to_tensor = paddle.to_tensor


def _to_tensor(data, *a, **k):
    """``paddle.to_tensor(array)`` of an array the script made with the run's batch as first dimension: the rows
    the schedule's batch needs (the same data, fewer samples)."""
    b = _creation_batch() if _user_frame(2) and not getattr(_COLLATE, "on", False) else None
    shape = getattr(data, "shape", None)
    native = b is not None and shape is not None and len(shape) >= 1 and int(shape[0]) in NATIVE_BATCHES
    if native:
        CTL.intended[_position()] = min(b, int(shape[0]))
    if native and b < int(shape[0]):
        if len(R["created_batches"]) < 50:
            R["created_batches"].append([int(shape[0]), b])
        R["reduced"] = True
        data = data[:b]
    return _orig_to_tensor(data, *a, **k)


paddle.to_tensor = _to_tensor


# ------------------------------------------------------------------------ sizes the script draws per batch
MAX_DRAWN_SIZES = 64
"""Longest population of whole numbers whose draws the dry run takes at their largest (a list of scales, not a data
set's indices)."""

_orig_choice = random.choice


def _drawn_sizes(seq):
    """Whether ``seq`` is a short list of sizes: whole numbers, each at least 2 (indices and flags -- a task index of
    ``[0, 1, 2]``, a flip of ``[0, 1]`` -- start below), not all the same."""
    return isinstance(seq, (list, tuple, range)) and 2 <= len(seq) <= MAX_DRAWN_SIZES \
        and all(type(x) is int for x in seq) and min(seq) >= 2 and max(seq) > min(seq)


def _choice(seq):
    """``random.choice`` as the script gets it: while training steps run (after the first model call), a draw the
    script makes from a short list of whole numbers (``random.choice(args.scales)``: multi-scale training) gives
    the largest of them, so the dry run measures at the largest size the script can choose (the draw is still
    made, so the script's random stream goes on as it would)."""
    got = _orig_choice(seq)
    if St.window is None or not _user_frame(2) or not _drawn_sizes(seq):
        return got
    top = max(seq)
    note(f"the script drew a size per batch with random.choice from {list(seq)[:16]}: while it trained, the dry run "
         f"took the largest, {top}, at every draw (the figure is for the largest size it can choose)")
    return top


random.choice = _choice


# ---------------------------------------------------------------------------------------- CPU, one process
def _set_device(device=None, *a, **k):
    if device is not None and str(device) not in R["devices_asked"]:
        R["devices_asked"].append(str(device))
    return _orig_set_device("cpu")


paddle.set_device = _set_device
if hasattr(paddle, "device"):
    paddle.device.set_device = _set_device

import paddle.distributed as _dist  # noqa: E402


def _noop(name, ret=None):
    def f(*a, **k):
        if name not in R["distributed_calls"]:
            R["distributed_calls"].append(name)
        return ret(*a, **k) if callable(ret) else ret
    return f


_dist.init_parallel_env = _noop("init_parallel_env")
_dist.get_rank = _noop("get_rank", 0)
_dist.get_world_size = _noop("get_world_size", 1)


def _spawn(func, args=(), nprocs=-1, *a, **k):
    R["distributed_calls"].append(f"spawn(nprocs={nprocs})")
    func(*args)


_dist.spawn = _spawn


def _data_parallel(layer, *a, **k):
    if "DataParallel" not in R["distributed_calls"]:
        R["distributed_calls"].append("DataParallel")
    object.__setattr__(layer, "_layers", layer)
    return layer


paddle.DataParallel = _data_parallel
try:
    from paddle.distributed import fleet as _fleet

    _fleet.init = _noop("fleet.init")
    _fleet.distributed_model = _noop("fleet.distributed_model", lambda m, *a, **k: m)
    _fleet.distributed_optimizer = _noop("fleet.distributed_optimizer", lambda o, *a, **k: o)
    _fleet.worker_num = _noop("fleet.worker_num", 1)
    _fleet.worker_index = _noop("fleet.worker_index", 0)
except Exception:
    pass


# ---------------------------------------------------------------------------------------- AMP, as called
AMP_LEVEL_ARG = {"auto_cast": 3, "amp_guard": 3, "decorate": 2}
"""Position of ``level`` in ``paddle.amp.auto_cast(enable, custom_white_list, custom_black_list, level, ...)``,
``amp_guard`` (the same) and ``paddle.amp.decorate(models, optimizers, level, ...)`` (Paddle 3.3)."""


def _amp_seen(name, orig):
    def f(*a, **k):
        pos = AMP_LEVEL_ARG[name]
        level = k.get("level", a[pos] if len(a) > pos else "O1")
        enabled = k.get("enable", a[0] if a and name != "decorate" else True)
        if enabled is not False and str(level) in ("O1", "O2") and str(level) not in R["amp"]:
            R["amp"].append(str(level))
        return orig(*a, **k)
    return f


for _name in AMP_LEVEL_ARG:
    if callable(getattr(paddle.amp, _name, None)):
        setattr(paddle.amp, _name, _amp_seen(_name, getattr(paddle.amp, _name)))
if isinstance(getattr(paddle.amp, "GradScaler", None), type):
    class _GradScaler(paddle.amp.GradScaler):
        def __init__(self, *a, **k):
            if k.get("enable", a[0] if a else True) is not False and "O1" not in R["amp"] and not R["amp"]:
                R["amp"].append("O1")
            super().__init__(*a, **k)

    setattr(paddle.amp, "GradScaler", _GradScaler)


# ---------------------------------------------------------------------------------------- slope by replay
def _lead_rows(v, d=0):
    """The leading dimension of the first tensor in a captured call (:class:`_TSpec`), or None."""
    if isinstance(v, _TSpec):
        return v.shape[0] if v.shape else None
    items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else ()
    for x in items:
        r = _lead_rows(x, d + 1) if d < 4 else None
        if r:
            return r
    return None


def _replay():
    """When the script's own steps ran at one batch size only: train the captured model on generated inputs
    of the same shapes and dtypes (the batch dimension changed) at two batch sizes and keep the slope."""
    sizes = CTL.measured_sizes()
    if len(sizes) >= 2 or not sizes or St.call_args is None or not St.optimizers or R["replay"]:
        return
    model, args, kwargs = St.call_args
    opt = St.optimizers[0]
    b = _lead_rows([args, kwargs]) or sizes[-1]  # the captured call's own batch: the dimension to change
    pts = [max(1, b // 4), max(2, b // 2)] if b >= 4 else [1, 2]

    def make(x, n):
        if not isinstance(x, _TSpec):
            return x
        shape = list(x.shape)
        if shape and shape[0] == b:
            shape[0] = n
        dt = x.dtype
        if "int" in dt:
            lo = x.lo if x.lo is not None else 0
            hi = x.hi if x.hi is not None else 1
            return paddle.randint(lo, max(lo + 1, hi + 1), shape, dtype=dt)
        if dt == "bool":
            return paddle.rand(shape) > 0.5
        return paddle.randn(shape).astype(dt)

    def build(n):
        def rec(v, d=0):
            if isinstance(v, (list, tuple)) and d < 3:
                return type(v)(rec(x, d + 1) for x in v)
            if isinstance(v, dict) and d < 3:
                return {kk: rec(x, d + 1) for kk, x in v.items()}
            return make(v, n)
        return rec(list(args)), rec(dict(kwargs))

    _counting(None)
    model.train()
    peaks = {}
    St.step_depth += 1
    _note_reading()  # what the script reached up to now is its own; the replay's allocations are not
    READINGS_PAUSED[0] = True
    # the gradients are left as the script left them: freed (clear_grad(set_to_zero=False)) or kept as zeros; a
    # replay that kept them (Paddle's default) added a gradient per parameter to the script's next step
    kept = any(getattr(p, "grad", None) is not None for p in model.parameters())
    try:
        for i, n in enumerate(pts, start=1):
            xa, xk = build(n)
            gc.collect()
            _reset()
            out = _orig_call(model, *xa, **xk)
            while isinstance(out, (tuple, list)):
                out = out[0]
            if isinstance(out, dict):
                out = next(iter(out.values()))
            loss = out.astype("float32").mean()
            loss.backward()
            opt.step()
            opt.clear_grad(set_to_zero=kept)
            if i:
                peaks[n] = _peak()
            del out, loss, xa, xk
        R["replay"] = [[n, peaks[n]] for n in pts]
    except BaseException as exc:  # noqa: BLE001 - the slope then comes from elsewhere
        R["replay_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        St.step_depth -= 1
        # what the replay's graphs keep in reference cycles is freed now, and its peak is not the next step's
        gc.collect()
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        READINGS_PAUSED[0] = False


# ----------------------------------------------------------------------------------------------------- run
def _exc_info(exc):
    frames = [{"file": f.filename, "line": f.lineno, "func": f.name, "code": (f.line or "")[:200]}
              for f in traceback.extract_tb(exc.__traceback__)]
    user = [f for f in frames if _in_user_dirs(f["file"])]
    msg = str(exc).strip()
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": msg[-2000:],
            "frames": frames[-12:], "user_frame": user[-1] if user else None,
            "last_frame": frames[-1] if frames else None,
            "errno": getattr(exc, "errno", None),
            "during": "train" if St.window is not None and not R["train_done"] else (
                "eval" if St.eval_call is not None else "setup"),
            "batch_reduced": bool(R.get("reduced"))}


def main():
    sys.argv = [SCRIPT, *CFG["argv"]]
    sys.path.insert(0, SCRIPT_DIR)
    R["status"] = "running"
    save()
    threading.Thread(target=_watch, name="autodl-dryrun-watch", daemon=True).start()
    try:
        runpy.run_path(SCRIPT, run_name="__main__")
        R["end"] = "script-finished"
    except _DryRunDone:
        R["end"] = "measured"
    except SystemExit as exc:
        R["end"] = "exit"
        R["exit_code"] = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code not in (None, 0):
            R["exit_message"] = str(exc.code)[:500] if not isinstance(exc.code, int) else None
    except BaseException as exc:  # noqa: BLE001 - whatever the script raised is the result
        R["end"] = "exception"
        R["error"] = _exc_info(exc)
    if St.eval_call is not None:
        _close_eval()
    R["seconds"]["script"] = round(time.monotonic() - T0, 3)
    if (St.models or St.optimizers) and not St.static_programs:
        _count_params()
    if St.opt_param_ids:  # evaluation calls of frozen helpers (not what the optimizers train) are not eval passes
        R["evals"] = [e for e, layer in zip(R["evals"], St.eval_layers) if _trained(layer)]
    R["optimizer"] = [type(o).__name__ for o in St.optimizers or St.static_optimizers]
    _note_reading()
    R["status"] = "replaying"
    save()
    if R["end"] != "exception" or R["steps"]:
        _replay()
    R["status"] = "done"
    save()
    sys.stdout.flush()
    sys.stderr.flush()
    _kill_children()
    os._exit(0)


if __name__ == "__main__":
    main()
