"""How close autodl's memory estimates come to the measured training peak (prints one table; not a test).

For each configuration: the script is run for real in a fresh process (its own ``__main__``, its own
training loop) with ``paddle.optimizer.Optimizer.clear_grad`` wrapped: after step 1 (warm-up: gradients
and optimizer moments now exist) the host allocator's peak is reset, after step 2 it is read
(``core.host_memory_stat_peak_value("Allocated", 0)``) -- the measured truth. ``paddle.summary`` is
called on the same model and input afterwards for its "Estimated Total Size". autodl's estimates are
``profile_script(...).estimates_bytes`` (static analysis and probe), the tensor part of the peak (the
GPU-only workspace terms cannot be seen on CPU and are excluded on both sides).

    .venv/bin/python benchmarks/estimate_accuracy.py            # all configurations (a few minutes)
    .venv/bin/python benchmarks/estimate_accuracy.py --only gpt  # configurations whose name contains 'gpt'
    .venv/bin/python benchmarks/estimate_accuracy.py --ops       # per-op measurements behind layers.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
MODELS = ROOT / "benchmarks" / "models"

CONFIGS: list[tuple[str, str, list[str], dict]] = [
    ("example CNN b64", "simple_cnn.py", [], {}),
    ("LeNet b128", "lenet.py", [], {}),
    ("VGG16 b4", "vgg16.py", [], {}),
    ("ResNet-18 b16", "resnet18.py", [], {}),
    ("ResNet-50 b4", "resnet50.py", [], {}),
    ("MobileNetV2 b8", "mobilenet_v2.py", [], {}),
    ("MobileNetV3-L b8", "mobilenet_v3.py", [], {}),
    ("Transformer cls seq128 b8", "transformer_cls.py", ["--seq-len", "128"], {"sequence_length": 128}),
    ("Transformer cls seq512 b8", "transformer_cls.py", ["--seq-len", "512"], {"sequence_length": 512}),
    ("Transformer cls seq1024 b4", "transformer_cls.py", ["--seq-len", "1024", "--batch-size", "4"],
     {"sequence_length": 1024, "batch_size_per_gpu": 4}),
    ("GPT decoder seq256 b8", "gpt_decoder.py", [], {}),
    ("BiLSTM tagger seq64 b32", "lstm_tagger.py", [], {}),
]

TRUTH = r"""
import contextlib, io, json, os, runpy, sys
import paddle
from paddle.base import core
paddle.set_device("cpu")
script, argv = sys.argv[1], sys.argv[2:]
state = {"n": 0, "model": None, "input": None}
orig_call = paddle.nn.Layer.__call__
depth = [0]
def call(self, *a, **k):
    if depth[0] == 0 and state["model"] is None:
        state["model"] = self
        x = a[0] if a else None
        if isinstance(x, paddle.Tensor):
            state["input"] = (list(x.shape), str(x.dtype).split(".")[-1])
    depth[0] += 1
    try:
        return orig_call(self, *a, **k)
    finally:
        depth[0] -= 1
paddle.nn.Layer.__call__ = call
orig = paddle.optimizer.Optimizer.clear_grad
def hooked(self, *a, **k):
    r = orig(self, *a, **k)
    state["n"] += 1
    if state["n"] == 1:
        core.host_memory_stat_reset_peak_value("Allocated", 0)
    elif state["n"] == 2:
        peak = int(core.host_memory_stat_peak_value("Allocated", 0))
        params = sum(int(p.numel()) for p in self._parameter_list)
        summary = None
        try:
            shape, dtype = state["input"]
            buf = io.StringIO()
            paddle.nn.Layer.__call__ = orig_call
            with contextlib.redirect_stdout(buf):
                paddle.summary(state["model"], tuple(shape), dtypes=dtype)
            for line in buf.getvalue().splitlines():
                if line.startswith("Estimated Total Size (MB):"):
                    summary = int(float(line.split(":")[1]) * 2**20)
        except Exception as exc:
            summary = None
        print("TRUTH " + json.dumps({"peak": peak, "params": params, "summary": summary}), flush=True)
        os._exit(0)
    return r
paddle.optimizer.Optimizer.clear_grad = hooked
sys.argv = [script, *argv]
runpy.run_path(script, run_name="__main__")
"""


def measure(script: Path, argv: list[str]) -> dict:
    """Run the real script in a fresh process and return its measured peak (bytes)."""
    env = dict(os.environ, OMP_NUM_THREADS="2", CUDA_VISIBLE_DEVICES="", GLOG_minloglevel="2")
    r = subprocess.run([sys.executable, "-c", TRUTH, str(script), *argv], capture_output=True, text=True, env=env,
                       timeout=900)
    for line in r.stdout.splitlines():
        if line.startswith("TRUTH "):
            return json.loads(line[6:])
    raise RuntimeError(f"{script}: no measurement ({r.stderr.strip().splitlines()[-1:]})")


def run_ops() -> None:
    """Per-op activation measurements (the constants of autodl/profile/layers.py)."""
    code = (ROOT / "benchmarks" / "models" / "op_memory.py")
    subprocess.run([sys.executable, str(code)], check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run configurations whose name contains this text")
    ap.add_argument("--ops", action="store_true", help="print the per-op measurements instead")
    ap.add_argument("--json", help="also write the rows to this file")
    opts = ap.parse_args()
    if opts.ops:
        run_ops()
        return
    from autodl.profile import profile_script
    from autodl.spec import parse_spec

    rows = []
    for name, script, argv, task in CONFIGS:
        if opts.only and opts.only.lower() not in name.lower():
            continue
        path = MODELS / script
        t0 = time.time()
        truth = measure(path, argv)
        t_truth = time.time() - t0
        spec = parse_spec({"task": task}) if task else None
        t0 = time.time()
        prof = profile_script(path, spec, probe=True)
        rows.append({
            "name": name, "params": truth["params"], "autodl_params": prof.params, "truth": truth["peak"],
            "static": prof.estimates_bytes.get("static") or prof.estimates_bytes.get("cold_start"),
            "probe": prof.estimates_bytes.get("probe"), "summary": truth["summary"],
            "probe_s": prof.probe_seconds, "measure_s": round(t_truth, 1), "method": prof.method,
            "errors": [f.message for f in prof.errors],
        })
        print(f"... {name}: measured in {t_truth:.0f}s, profiled in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    print_table(rows)


def _err(est, truth):
    return None if est is None else (est - truth) / truth


def print_table(rows: list[dict]) -> None:
    mib = 2**20
    head = f"{'configuration':28s} {'params':>11s} {'measured':>9s} {'static':>9s} {'err':>7s} {'probe':>9s} {'err':>7s} {'summary':>9s} {'err':>7s}"
    print(head)
    print("-" * len(head))
    errs = {"static": [], "probe": [], "summary": []}
    fmt = lambda b: f"{b / mib:8.1f}M" if b is not None else f"{'-':>9s}"
    pct = lambda e: f"{100 * e:+6.1f}%" if e is not None else f"{'-':>7s}"
    for r in rows:
        line = f"{r['name']:28s} {r['params']:>11,d} {fmt(r['truth'])}"
        for k in ("static", "probe", "summary"):
            e = _err(r[k], r["truth"])
            if e is not None:
                errs[k].append(e)
            line += f" {fmt(r[k])} {pct(e)}"
        if r["autodl_params"] != r["params"]:
            line += f"  (autodl params {r['autodl_params']:,d})"
        print(line)
    print("-" * len(head))
    for k, v in errs.items():
        if v:
            a = [abs(x) for x in v]
            print(f"{k:8s} median |err| {100 * statistics.median(a):5.1f}%   worst |err| {100 * max(a):5.1f}%   "
                  f"worst under-estimate {100 * min(0.0, min(v)):+5.1f}%   (n={len(v)})")
    print("MiB = 2^20 bytes; errors are (estimate - measured) / measured of the tensor peak on CPU.")


if __name__ == "__main__":
    main()
