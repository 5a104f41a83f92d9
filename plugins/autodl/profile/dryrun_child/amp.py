"""AMP as the script calls it: the levels ``auto_cast``, ``amp_guard``, ``decorate`` and ``GradScaler`` ask for."""

import paddle

from .state import R

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


def install():
    """Record the AMP level of every ``auto_cast``, ``amp_guard``, ``decorate`` and ``GradScaler`` the script makes."""
    for name in AMP_LEVEL_ARG:
        if callable(getattr(paddle.amp, name, None)):
            setattr(paddle.amp, name, _amp_seen(name, getattr(paddle.amp, name)))
    if isinstance(getattr(paddle.amp, "GradScaler", None), type):
        class _GradScaler(paddle.amp.GradScaler):
            def __init__(self, *a, **k):
                if k.get("enable", a[0] if a else True) is not False and "O1" not in R["amp"] and not R["amp"]:
                    R["amp"].append("O1")
                super().__init__(*a, **k)

        setattr(paddle.amp, "GradScaler", _GradScaler)
