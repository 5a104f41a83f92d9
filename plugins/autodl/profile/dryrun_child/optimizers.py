"""Optimizer hooks: an update (``step``/``minimize``) ends a step's forward and backward, ``clear_grad`` the step."""

import time

import paddle

from .batch import CTL
from .flops import FL
from .readings import peak, reset_peak
from .state import R, St
from .static import dynamic, static_minimized
from .steps import count_params, counting, end_step, opt_params


def _on_step_enter(opt):
    if opt not in St.optimizers:
        # an optimizer's first update creates its state (moments): that step is a warm-up, not measured
        St.optimizers.append(opt)
        St.opt_param_ids.update(id(p) for p in opt_params(opt))
        if St.window is not None:
            St.window["warmup"] = True
    L = St.last_loader
    if L is not None and getattr(L, "_autodl_role", None) is None and CTL.train_loader is None:
        L._autodl_role = "train"
        CTL.train_loader = L
        CTL.native = getattr(L, "_autodl_batch", None)
        if not getattr(L, "_autodl_walked", False):
            L._autodl_walked = True
            in_order = getattr(L, "batch_sampler", None) is None  # a loader over an IterableDataset has none
            R["epoch_walk"].append({"loader": getattr(L, "_autodl_index", None), "read": False, "in_order": in_order,
                                    "error": None if in_order else "not walked"})
    St.steps_seen += 1
    St.stepped = True
    if St.window is not None and St.counting == "train":
        # with what ran outside any layer (a loss's matmul after forward)
        St.window["flops"], St.window["pair_flops"] = FL.state["flops"], FL.state["pair"]
    if St.window is not None and St.window["fwd_bwd"] is None:
        St.window["fwd_bwd"] = peak()
        St.window["t_step"] = time.monotonic()
        reset_peak()
    counting(None)


def _wrap_step(orig):
    def step(self, *a, **k):
        if St.step_depth == 0 and not dynamic():
            # paddle.static: minimize() adds backward and update ops to the program; the steps are the
            # Executor.run calls of that program (see _static_run)
            St.step_depth += 1
            try:
                r = orig(self, *a, **k)
            finally:
                St.step_depth -= 1
            static_minimized(self, a[0] if a else k.get("loss"))
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
                count_params()
            end_step()
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


def _opt_init_subclass(cls, **kw):
    """An optimizer class the script (or a library) defines later is hooked as it is made."""
    super(_Opt, cls).__init_subclass__(**kw)
    _patch_optimizer_class(cls)


def install():
    """Hook every optimizer class of ``paddle.optimizer`` (and later subclasses) and ``Layer.clear_gradients``."""
    for n in dir(paddle.optimizer):
        c = getattr(paddle.optimizer, n)
        if isinstance(c, type) and issubclass(c, _Opt):
            _patch_optimizer_class(c)
    _patch_optimizer_class(_Opt)
    setattr(_Opt, "__init_subclass__", classmethod(_opt_init_subclass))
    setattr(paddle.nn.Layer, "clear_gradients", _wrap_clear(paddle.nn.Layer.clear_gradients))
    if hasattr(paddle.nn.Layer, "clear_grad"):
        setattr(paddle.nn.Layer, "clear_grad", _wrap_clear(paddle.nn.Layer.clear_grad))
