"""Batch sizes: the controller (:class:`Ctl`) that shrinks and chooses the batch of every training and evaluation
batch, and the bytes of the batches a loader holds ahead of the step."""

import time

from .report import note, save
from .shapes import input_key, per_sample_elements
from .state import CFG, T0, R, St


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
        self.replay = None                       # the slope by replay (replay.replay, set by run: it reads this)

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
        if len({input_key(s["inputs"]) for s in steps}) < 2:
            return False
        self.varies = True
        most = max(per_sample_elements(s) for s in steps)
        hi = self.hi()
        return hi is not None and not any(self.unit(s) == hi and per_sample_elements(s) >= most for s in steps)

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
            self._decide_plan(rec, elapsed, b, top, m, lo)
        if self.plan is None:
            return
        if self._sizes_measured(rec, elapsed, c, m, lo):
            return
        if len(c) < 2 and elapsed + rec["seconds"] > 1.5 * self.budget_s and not R["replay"]:
            # the next step would end past the budget (a slow step, a big model): the slope from a short replay of
            # the model at two small batches now, not a bound from one size (the script may be killed before)
            self.replay()
            save()
        if elapsed > 1.5 * self.budget_s and c:
            note(f"time budget of {self.budget_s:.0f} s (+50%) reached after measuring batch sizes {sorted(c)}")
            self.mark_done()

    def _decide_plan(self, rec, elapsed, b, top, m, lo):
        """Decide the plan (``[hi]``, or none) from the first measured step's time and memory, and save it."""
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

    def _sizes_measured(self, rec, elapsed, c, m, lo):
        """Whether every size of the schedule is measured (training then ends, or goes on for a larger input). Not
        reducing, the schedule is the script's own batches: the sizes its steps had, in two measured steps at least
        (so that an input whose shape changes between steps shows), are the ones to measure."""
        if not self.reduce and sum(c.values()) < 2:
            return False
        need = sorted({m, lo, *self.plan}) if self.reduce else sorted(c)
        steady = self.counts(steady=True)
        # each size measured in a steady step (after a step of the same size: what the script keeps of the
        # previous step is then of this size); a first step at a size is enough when time is short
        n_opt = max(1, len(St.optimizers))  # a GAN's step is one window per optimizer: each needs a steady one
        if all(steady.get(s, 0) >= n_opt for s in need) or (all(c.get(s) for s in need)
                                                  and elapsed + rec["seconds"] > 1.5 * self.budget_s):
            if self.reduce and self.shape_steps < MAX_SHAPE_STEPS and elapsed + rec["seconds"] <= 1.5 * self.budget_s \
                    and self.larger_input_pending():
                self.shape_steps += 1
                return True
            if self.shape_steps and self.larger_input_pending():
                note(f"the largest training input seen was not measured at batch {self.hi()} within "
                     f"{self.shape_steps} more steps")
            self.mark_done()
            return True
        return False

    def mark_done(self):
        if not R["train_done"]:
            R["train_done"] = True
            R["seconds"]["train_done"] = round(time.monotonic() - T0, 3)
            save()


MAX_SHAPE_STEPS = 8
"""Training steps measured on, at the schedule's largest size, when the inputs change shape between steps and the
largest seen was measured at a smaller size only (a size drawn per batch from a few: 8 draws of 4 sizes miss the
largest with probability 0.1)."""


CTL = Ctl()


def position():
    """The schedule position of the current training step for tensors the script creates: one per optimizer
    update, or per round of updates when several optimizers take turns (a GAN)."""
    return St.ends // max(1, len(St.optimizers))


def queue_bytes(w, shift):
    """Bytes of the batches a single-process loader holds at the start of the window at ``pos + shift``."""
    L, pos = w.get("loader"), w.get("pos")
    if L is None or pos is None or not getattr(L, "_autodl_depth", 0) or not getattr(L, "_autodl_sample_bytes", 0):
        return 0
    return sum((CTL.intended.get(pos + shift + j) or 0) * L._autodl_sample_bytes for j in range(L._autodl_depth))


def prefetch_correction(w):
    """Bytes to add to a step's measured peak so that it is the steady state at its batch: the loader's prefetched
    batches were of the sizes the schedule gave the next positions, in a real run they are of this batch."""
    L, pos = w.get("loader"), w.get("pos")
    if L is None or pos is None or not getattr(L, "_autodl_depth", 0) or not getattr(L, "_autodl_sample_bytes", 0):
        return 0
    b = CTL.intended.get(pos) or w["batch"] or 0  # in the loader's unit, as its prefetched batches are
    ahead = epoch_ahead(L)
    corr = 0
    for j in range(1, L._autodl_depth + 1):
        nxt = CTL.intended.get(pos + j)
        if nxt is None:
            break
        # past the batches the script's epoch has ahead of its first, a prefetched batch is the dry run's own
        # (its head of the epoch's largest batch outlasts a short epoch): none is held in a real run
        corr += ((b if j <= ahead else 0) - nxt) * L._autodl_sample_bytes
    return int(corr)


def beyond_epoch_bytes(w):
    """Bytes of the batches the loader held in the window ``w`` past the script's epoch (:func:`epoch_ahead`): the
    dry run's head of the epoch's largest batch outlasts a short epoch, a real run holds none of them."""
    L, pos = (w or {}).get("loader"), (w or {}).get("pos")
    if L is None or pos is None or not getattr(L, "_autodl_depth", 0) or not getattr(L, "_autodl_sample_bytes", 0):
        return 0
    return sum((CTL.intended.get(pos + j) or 0) * L._autodl_sample_bytes
               for j in range(epoch_ahead(L) + 1, L._autodl_depth + 1))


def epoch_ahead(L):
    """Batches the script's loader can hold ahead of the one in use: its prefetch depth, at most the batches of one
    epoch after the first (an epoch of two batches holds one; a new epoch starts a new iterator). The depth where
    the epoch's length is not known (an iterable data set)."""
    try:
        n = len(L.batch_sampler.inner)
    except Exception:  # noqa: BLE001 - a sampler without a length: the loader's whole depth
        return L._autodl_depth
    return max(0, min(L._autodl_depth, int(n) - 1))


NATIVE_BATCHES = set(int(b) for b in CFG["native_batches"] if isinstance(b, int) and b > 1)
"""The script's own batch sizes (the parent read them in the script): a tensor the script creates with one of them as
first dimension is of the run's batch (:mod:`.creation`)."""
