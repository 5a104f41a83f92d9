"""``paddle.static`` programs: each ``Executor.run`` of a minimized program with a feed is a step."""

import gc
import time

import paddle

from .batch import CTL
from .readings import current, peak, reset_peak
from .report import note, save
from .state import R, St
from .steps import maybe_finish


def dynamic():
    try:
        return paddle.in_dynamic_mode()
    except Exception:  # noqa: BLE001
        return True


def static_minimized(opt, loss):
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
        start = current()
        reset_peak()
        t0 = time.monotonic()
        St.step_depth += 1
        try:
            r = orig(self, program, *a, **k)
        finally:
            St.step_depth -= 1
        top = peak()
        info = St.static_info or {}
        St.ends += 1
        prev = R["steps"][-1]["batch"] if R["steps"] else None
        secs = round(time.monotonic() - t0, 4)
        flops = (info.get("flops") or 0.0) * (batch or 0)
        R["steps"].append({"batch": batch, "peak": top, "fwd_bwd_peak": top, "update_peak": top,
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
            maybe_finish()
        return r
    run._autodl = True
    return run


def install():
    """Hook ``paddle.static.Executor.run``."""
    try:
        setattr(paddle.static.Executor, "run", _static_run(paddle.static.Executor.run))
    except Exception:  # noqa: BLE001 - a build without paddle.static
        pass
