"""The dry-run child's state, in one place: its config, the report it writes, the step tracker and its flags.

``CFG`` is :class:`autodl.profile.dryrun.DryRunConfig` as JSON (``sys.argv[1]``); ``R`` is the result file's
content (:class:`autodl.profile.dryrun_report.ChildReport` on the parent's side); :class:`St` what the hooks track.
"""

import json
import os
import sys
import threading
import time
from typing import Any

CFG = json.load(open(sys.argv[1]))  # autodl.profile.dryrun.DryRunConfig: every key is there
SCRIPT = os.path.abspath(CFG["script"])
SCRIPT_DIR = os.path.dirname(SCRIPT)
USER_DIRS = tuple(os.path.abspath(d) + os.sep for d in CFG["user_dirs"] or [SCRIPT_DIR])
RESULT = CFG["result"]
T0 = time.monotonic()


class DryRunDone(BaseException):
    """Raised from a hook to end the script once everything was measured."""


R: dict[str, Any] = {  # the report, as JSON
    "status": "starting", "steps": [], "evals": [], "replay": [], "params": None, "trainable": None,
    "model": None, "optimizer": None, "inputs": None, "num_workers": [], "datasets": [], "devices_asked": [],
    "distributed_calls": [], "amp": [], "conv": None, "loaders": [], "error": None, "end": None, "notes": [], "seconds": {},
    "train_done": False, "eval_seen": False, "created_batches": [],
    "max_reading": None, "max_reading_batch": None, "epoch_walk": [],
}
SAVE_LOCK = threading.Lock()


READINGS_PAUSED = [False]
"""True while autodl's own replay trains the model (:func:`replay`): what it allocates is not the script's."""


class St:
    """What the hooks track between calls (class attributes: one tracker per process)."""

    model_ids: set[int] = set()          # top-level layers with parameters the script called
    models: list[Any] = []               # those layers (paddle.nn.Layer)
    depth = 0
    step_depth = 0
    window: dict[str, Any] | None = None              # the step being measured
    steps_seen = 0             # optimizer updates
    ends = 0                   # step ends
    stepped = False            # an update since the last step end
    eval_call: dict[str, Any] | None = None           # the evaluation call being measured
    flops = 0.0
    counting: str | None = None            # 'train' | 'eval' | None
    layer_depth = 0
    optimizers: list[Any] = []           # paddle.optimizer.Optimizer, in order of first update
    opt_param_ids: set[int] = set()
    last_loader: Any = None              # the paddle.io.DataLoader that gave the last batch
    call_args: tuple[Any, Any, Any] | None = None  # (model, args, kwargs) of the first training call
    eval_layers: list[Any] = []
    eval_keys: set[tuple[Any, Any]] = set()
    last_pos: int | None = None
    static_programs: dict[int, Any] = {}       # paddle.static: id -> program an optimizer minimized
    static_optimizers: list[Any] = []
    static_info: dict[str, Any] | None = None
    in_backward = False        # inside Tensor.backward: layers called now are recomputed blocks


COLLATING = threading.local()
"""``on`` while a DataLoader's ``collate_fn`` runs (in the loader's prefetch thread or a worker)."""
