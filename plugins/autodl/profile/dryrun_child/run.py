"""The child's run: install every hook in order, run the user's script as ``__main__``, write the report."""

import os
import runpy
import sys
import threading
import time

from . import amp, creation, devices, flops, hooks, loaders, optimizers, standins, static
from .batch import CTL
from .readings import note_reading, watch
from .replay import replay
from .report import exc_info, kill_children, save
from .state import CFG, SCRIPT, SCRIPT_DIR, T0, DryRunDone, R, St
from .steps import close_eval, count_params, trained


def install_hooks():
    """Install every hook, in the order the single-file child installed them (models, optimizers, static programs,
    FLOPs, loaders, downloads, created tensors, devices, AMP); the controller replays through :func:`replay`."""
    hooks.install()
    optimizers.install()
    static.install()
    flops.install()
    loaders.install()
    standins.install()
    creation.install()
    devices.install()
    amp.install()
    CTL.replay = replay


def main():
    """Run the user's script (``CFG["script"]`` with ``CFG["argv"]``) with the hooks, write the report, exit."""
    install_hooks()
    sys.argv = [SCRIPT, *CFG["argv"]]
    sys.path.insert(0, SCRIPT_DIR)
    R["status"] = "running"
    save()
    threading.Thread(target=watch, name="autodl-dryrun-watch", daemon=True).start()
    try:
        runpy.run_path(SCRIPT, run_name="__main__")
        R["end"] = "script-finished"
    except DryRunDone:
        R["end"] = "measured"
    except SystemExit as exc:
        R["end"] = "exit"
        R["exit_code"] = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code not in (None, 0):
            R["exit_message"] = str(exc.code)[:500] if not isinstance(exc.code, int) else None
    except BaseException as exc:  # noqa: BLE001 - whatever the script raised is the result
        R["end"] = "exception"
        R["error"] = exc_info(exc)
    if St.eval_call is not None:
        close_eval()
    R["seconds"]["script"] = round(time.monotonic() - T0, 3)
    if (St.models or St.optimizers) and not St.static_programs:
        count_params()
    if St.opt_param_ids:  # evaluation calls of frozen helpers (not what the optimizers train) are not eval passes
        R["evals"] = [e for e, layer in zip(R["evals"], St.eval_layers) if trained(layer)]
    R["optimizer"] = [type(o).__name__ for o in St.optimizers or St.static_optimizers]
    note_reading()
    R["status"] = "replaying"
    save()
    if R["end"] != "exception" or R["steps"]:
        replay()
    R["status"] = "done"
    save()
    sys.stdout.flush()
    sys.stderr.flush()
    kill_children()
    os._exit(0)
