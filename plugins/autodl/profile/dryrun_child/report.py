"""The result file (``R``, written whole at every change) and what the report says of the script's code and errors."""

import json
import os
import signal
import sys
import time
import traceback

from .state import RESULT, SAVE_LOCK, T0, USER_DIRS, R, St


def kill_children():
    """DataLoader worker processes would outlive ``os._exit`` and keep the output pipes open."""
    try:
        import multiprocessing
        for c in multiprocessing.active_children():
            os.kill(c.pid, signal.SIGKILL)
    except Exception:  # noqa: BLE001
        pass

def save():
    with SAVE_LOCK:
        R["seconds"]["elapsed"] = round(time.monotonic() - T0, 3)
        tmp = RESULT + ".tmp"
        with open(tmp, "w") as f:
            json.dump(R, f)
        os.replace(tmp, RESULT)


def note(msg):
    if msg not in R["notes"]:
        R["notes"].append(msg)


def user_frame(depth=2):
    """True when the caller ``depth`` frames up is the user's code (the script's folder), not a library."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return False
    return in_user_dirs(f.f_code.co_filename)


def in_user_dirs(filename: str) -> bool:
    """Whether ``filename`` is the user's code: under one of :data:`USER_DIRS`. A pseudo-file (``<frozen os>``,
    ``<string>``) is nobody's file: made absolute it would land in the working folder, the user's."""
    return not filename.startswith("<") and os.path.abspath(filename).startswith(USER_DIRS)


def exc_info(exc):
    frames = [{"file": f.filename, "line": f.lineno, "func": f.name, "code": (f.line or "")[:200]}
              for f in traceback.extract_tb(exc.__traceback__)]
    user = [f for f in frames if in_user_dirs(f["file"])]
    msg = str(exc).strip()
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": msg[-2000:],
            "frames": frames[-12:], "user_frame": user[-1] if user else None,
            "last_frame": frames[-1] if frames else None,
            "errno": getattr(exc, "errno", None),
            "during": "train" if St.window is not None and not R["train_done"] else (
                "eval" if St.eval_call is not None else "setup"),
            "batch_reduced": bool(R.get("reduced"))}
