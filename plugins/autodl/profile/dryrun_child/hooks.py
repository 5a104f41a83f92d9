"""Model hooks: ``Layer.__call__`` (which call is a training step, which an evaluation) and ``Tensor.backward``."""

import gc
import time

import paddle

from .batch import CTL
from .flops import FL
from .readings import current, peak, reset_peak
from .report import save
from .shapes import batch_of, input_key
from .signatures import signature, structure
from .state import CFG, T0, DryRunDone, R, St
from .steps import (
    close_eval,
    count_params,
    counting,
    end_step,
    grad_enabled,
    maybe_finish,
    save_eval_partial,
    start_window,
    trained,
)

original_layer_call = paddle.nn.Layer.__call__
"""Paddle's own ``Layer.__call__`` (the replay calls the model through it, unhooked)."""


def _first_call_of(layer):
    """Keep a top-level layer the script calls for the first time as a model and count its FLOPs from now on."""
    if id(layer) not in St.model_ids:
        St.model_ids.add(id(layer))
        St.models.append(layer)
        FL.attach(layer)


def _training_call(layer, a, k, sig):
    """A training call of ``layer`` (a forward of the step): close an evaluation, end the step that ended, open the
    step's window and record its batch and inputs."""
    if St.eval_call is not None:
        close_eval()
        if R["train_done"]:
            raise DryRunDone()
    if St.stepped and St.window is not None:  # an update without clear_grad: the step ended
        end_step()
    if R["train_done"]:
        maybe_finish()
    if St.window is None:
        start_window()
    w = St.window
    if w["batch"] is None:
        w["batch"], w["inputs"] = batch_of(sig), sig
        L = St.last_loader
        w["pos"], w["loader"] = (St.last_pos, L) if L is not None and L is CTL.train_loader or \
            (L is not None and CTL.train_loader is None) else (None, None)
        if R["inputs"] is None:
            R["inputs"] = sig
            St.call_args = (layer, structure(a), structure(k))
            count_params()
            save()
    if w["model"] is None and trained(layer):
        w["model"] = id(layer)
    if w["model"] == id(layer) and not St.in_backward:
        # calls of the step's model: a frozen helper's forward, a separate head or a block recomputed
        # in the backward pass adds FLOPs to the step, not a forward call
        w["fwd_calls"] += 1
    counting("train")


def _eval_measured_again(sig):
    """After training was measured, an evaluation input measured already (or the last call the dry run measures):
    in a real run this call would also hold what the script kept of the previous one (its prediction...): add that
    to the measured call, then end the run."""
    gc.collect()
    now = current()
    for e in reversed(R["evals"]):
        if input_key(e["inputs"]) == input_key(sig) and e["batch"] == batch_of(sig):
            e["steady_peak"] = e["peak"] + max(0, now - e["start_bytes"])
            break
    save()
    raise DryRunDone()


def _eval_call(layer, sig):
    """An evaluation call of ``layer`` (no gradient, or eval mode): taint the step it interrupts, open its record."""
    if St.window is not None and St.window["fwd_bwd"] is None and St.steps_seen:
        St.window["tainted"] = True
    close_eval()
    _mark_eval_loader()
    if not R["eval_seen"] and St.opt_param_ids:
        R["eval_seen"] = True
        R["seconds"]["eval_start"] = round(time.monotonic() - T0, 3)
    if R["train_done"] and (len(R["evals"]) >= int(CFG["max_eval_calls"]) or
                            (input_key(sig), batch_of(sig)) in St.eval_keys):
        _eval_measured_again(sig)
    gc.collect()
    reset_peak()
    FL.state["flops"] = FL.state["pair"] = 0.0
    counting("eval")
    St.eval_call = {"t0": time.monotonic(), "start_bytes": current(), "batch": batch_of(sig),
                    "inputs": sig, "grad": grad_enabled(), "training_mode": bool(layer.training),
                    "layer": layer, "native_batch": _eval_native()}


def _call_ended(layer):
    """The outermost call ended: keep the step's FLOPs, or what the evaluation forward measured (the script may
    never call the model again)."""
    if St.counting == "train" and St.window is not None:
        St.window["flops"], St.window["pair_flops"] = FL.state["flops"], FL.state["pair"]
    elif St.counting == "eval" and St.eval_call is not None and St.eval_call["layer"] is layer:
        c = St.eval_call
        c["peak_at_exit"], c["flops"] = peak(), FL.state["flops"]
        St.eval_keys.add((input_key(c["inputs"]), c["batch"]))
        save_eval_partial(c)


def _layer_call(self, *a, **k):
    """``Layer.__call__``: a top-level call of a layer with parameters is a training or an evaluation call."""
    if St.depth == 0 and St.step_depth == 0 and (bool(self._parameters) or any(True for _ in self.parameters())):
        _first_call_of(self)
        training = self.training and grad_enabled()
        if not training and St.opt_param_ids and not trained(self):
            training = True  # a frozen model (teacher, feature extractor) the optimizers do not train: in the step
        sig = signature((a, k), [], first=R["inputs"] is None and training)
        if training:
            _training_call(self, a, k, sig)
        else:
            _eval_call(self, sig)
    St.depth += 1
    try:
        return original_layer_call(self, *a, **k)
    finally:
        St.depth -= 1
        if St.depth == 0:
            _call_ended(self)


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


def install():
    """Hook ``paddle.nn.Layer.__call__`` and ``paddle.Tensor.backward``."""
    setattr(paddle.nn.Layer, "__call__", _layer_call)
    setattr(paddle.Tensor, "backward", _backward)


def _eval_native():
    """The batch size the evaluation loader feeding this call was built with (None: not from a loader)."""
    L = St.last_loader
    if L is not None and getattr(L, "_autodl_role", None) == "eval":
        return getattr(L, "_autodl_batch", None)
    return None


def _mark_eval_loader():
    """The loader that fed this evaluation call, not yet given a role, is an evaluation loader."""
    L = St.last_loader
    if L is not None and getattr(L, "_autodl_role", None) is None and L is not CTL.train_loader:
        L._autodl_role = "eval"
