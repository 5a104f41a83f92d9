"""How close autodl's memory estimates come to the measured training peak (prints one table; not a test).

For each script: the truth is measured by running the real script in a fresh process (its own ``__main__``, its own
training loop) with hooks (``benchmarks/truth.py``: the host allocator's peak of the second full training step,
``core.host_memory_stat_peak_value("Allocated", 0)``, and with ``--eval`` of its first evaluation call); the
estimate is ``profile_script(...)`` with the sandboxed paths on (dry run, else probe, else the conservative bound), its
``tensor_peak_bytes`` (the tensor part of the peak: the GPU-only workspace terms cannot be seen on CPU and are
excluded on both sides). Where a script has an evaluation pass, the truth is the larger of the two phases, as the
profile's peak is. Truth values are cached in ``benchmarks/results/truth.json`` (``--remeasure`` to redo them);
``benchmarks/user_scripts/truth.json`` (written without the estimator's code) and the handed cases' README give
theirs.

    .venv/bin/python benchmarks/estimate_accuracy.py             # all scripts (tens of minutes on 2 cores)
    .venv/bin/python benchmarks/estimate_accuracy.py --only gpt   # scripts whose name contains 'gpt'
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
USER = ROOT / "benchmarks" / "user_scripts"
FRESH = ROOT / "benchmarks" / "fresh_scripts"  # issue 18's 15 scripts, written without the estimator's code
CASES = ROOT / "tests" / "cases" / "estimator"
CACHE = ROOT / "benchmarks" / "results" / "truth.json"
MIB = 2 ** 20

# (name, script, argv, spec task fields, truth options): truth options "eval" (also measure the first evaluation
# call), "fake" (paddle.vision.datasets yield random samples: the script downloads them)
CONFIGS: list[tuple[str, Path, list[str], dict, tuple[str, ...]]] = [
    ("example CNN b64", MODELS / "simple_cnn.py", [], {}, ()),
    ("LeNet b128", MODELS / "lenet.py", [], {}, ()),
    ("VGG16 b4", MODELS / "vgg16.py", [], {}, ()),
    ("ResNet-18 b16", MODELS / "resnet18.py", [], {}, ()),
    ("ResNet-50 b4", MODELS / "resnet50.py", [], {}, ()),
    ("MobileNetV2 b8", MODELS / "mobilenet_v2.py", [], {}, ()),
    ("MobileNetV3-L b8", MODELS / "mobilenet_v3.py", [], {}, ()),
    ("Transformer cls seq128 b8", MODELS / "transformer_cls.py", ["--seq-len", "128"], {}, ()),
    ("Transformer cls seq512 b8", MODELS / "transformer_cls.py", ["--seq-len", "512"], {}, ()),
    ("Transformer cls seq1024 b4", MODELS / "transformer_cls.py", ["--seq-len", "1024", "--batch-size", "4"], {}, ()),
    ("GPT decoder seq256 b8", MODELS / "gpt_decoder.py", [], {}, ()),
    ("BiLSTM tagger seq64 b32", MODELS / "lstm_tagger.py", [], {}, ()),
    # written for issue 8, one style each
    ("dataclass+JSON cfg MLP b256 (workers=2)", MODELS / "cfg_dataclass_mlp.py", [], {}, ()),
    ("Conv3D video b4", MODELS / "conv3d_video.py", [], {}, ()),
    ("Conv-BN autoencoder, module level", MODELS / "conv_bn_autoencoder.py", [], {}, ()),
    ("zoo mobilenet_v2(scale=0.5) 96px", MODELS / "zoo_mobilenet_kwargs.py", [], {}, ()),
    ("hapi Model.fit LeNet + eval", MODELS / "hapi_fit_lenet.py", [], {}, ("eval",)),
    ("grad accumulation Transformer", MODELS / "grad_accum_transformer.py", [], {}, ()),
    ("DCGAN, two optimizers", MODELS / "dcgan_two_optimizers.py", [], {}, ()),
    ("distillation, frozen teacher", MODELS / "distill_frozen_teacher.py", [], {}, ()),
    ("ResNet-18 64px b256 (reduced)", MODELS / "big_batch_resnet18.py", [], {}, ()),
    ("DataParallel, spec batch 64", MODELS / "data_parallel_env.py", [], {"batch_size_per_gpu": 64}, ()),
    ("TextCNN dict cfg, functional", MODELS / "textcnn_dict_cfg.py", [], {}, ()),
    ("tiny ViT cfg class + val pass", MODELS / "vit_tiny_cfg_class.py", [], {}, ("eval",)),
    ("Cifar10 download (fallback)", MODELS / "cifar_download.py", [], {}, ("fake",)),
    ("eval at 320px > train at 96px", MODELS / "eval_bigger_input.py", [], {}, ("eval",)),
    ("nn.Transformer seq2seq + mask", MODELS / "transformer_seq2seq_masks.py", [], {}, ()),
    ("LSTMCell loop, time-major", MODELS / "lstm_cell_loop.py", [], {}, ()),
]

def all_configs() -> list[tuple[str, Path, list[str], dict, tuple[str, ...], dict | None]]:
    """The benchmark's scripts with, where measured elsewhere, their truth: the handed cases'
    ``tests/cases/estimator/truth.json``, ``benchmarks/user_scripts/truth.json`` (written and measured without
    the estimator's code, by ``benchmarks/user_scripts/measure.py``: truth.py's method, eval = second eval step) and
    ``tests/cases/estimator/esttest/truth.json`` (a fresh user's scripts and faults; ``task`` there is the spec's)."""
    out = [(*c, None) for c in CONFIGS]
    for folder, key, prefix in ((CASES, "cases", "case"), (USER, "scripts", "user"),
                                (CASES / "esttest", "cases", "esttest"), (CASES / "t3", "cases", "t3"),
                                (FRESH, "scripts", "fresh")):
        tj = folder / "truth.json"
        if not tj.exists():
            continue
        for t in json.loads(tj.read_text()).get(key, []):
            script = t.get("file")
            if not script or not (folder / script).exists():
                continue
            inp = t.get("measured_input_of_first_call")
            # a peak over several steps of different input sizes (max_over_steps) has a FLOPs count averaged over
            # those sizes and calls: no per-sample reference of the measured size, so no FLOPs comparison
            varied = bool(t.get("max_over_steps"))
            truth = {"peak": t["train_peak_bytes"], "eval_peak": t.get("eval_peak_bytes"), "params": t.get("params"),
                     "fwd_flops_per_call": None if varied else t.get("hook_forward_flops_per_call"), "input": inp,
                     "fwd_calls": t.get("forward_calls_in_step"),
                     "fwd_flops_in_backward_per_call": t.get("hook_forward_flops_in_backward_per_call"),
                     "fwd_flops_per_sample": t.get("fwd_flops_per_sample"),
                     "spec": str(folder / t["spec"]) if t.get("spec") else None, "env": t.get("env") or {}}
            task = dict(t.get("task") or ({"batch_size_per_gpu": t["spec_batch_size"]} if t.get("spec_batch_size") else {}))
            out.append((f"{prefix} {script[:-3]}", folder / script, list(t.get("args") or []), task, (), truth))
    return out


def measure(script: Path, argv: list[str], opts: tuple[str, ...] = ()) -> dict:
    """Run the real script in a fresh process and return its measured peak (bytes) and parameters."""
    env = dict(os.environ, OMP_NUM_THREADS="2", CUDA_VISIBLE_DEVICES="", GLOG_minloglevel="2")
    flags = [f"--{o}" if o != "fake" else "--fake-datasets" for o in opts]
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "truth.py"), *flags, str(script), *argv],
                       capture_output=True, text=True, env=env, timeout=1800, cwd=script.parent)
    for line in r.stdout.splitlines():
        if line.startswith("TRUTH "):
            t = json.loads(line[6:])
            if "peak" in t:
                return t
    raise RuntimeError(f"{script}: no measurement ({r.stderr.strip().splitlines()[-3:]})")


def _reference_step_flops(ref_per_sample: float | None, truth: dict) -> float | None:
    """The measured step's training FLOPs per sample from the truth's hook count: every forward call of the step
    (issue 18 item 7) x 3 for forward and backward, except the forward passes recomputed inside ``backward``
    (``recompute``; measure.py counts them apart), which run once. None without a reference."""
    if ref_per_sample is None:
        return None
    calls = max(1, int(truth.get("fwd_calls") or 1))
    per_call = truth.get("fwd_flops_per_call") or 0.0
    in_backward = ref_per_sample * (truth.get("fwd_flops_in_backward_per_call") or 0.0) / per_call if per_call else 0.0
    forward = ref_per_sample * calls
    return 3.0 * (forward - in_backward * calls) + in_backward * calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run scripts whose name contains this text")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--remeasure", action="store_true", help="measure the truth again instead of using the cache")
    ap.add_argument("--no-profile", action="store_true", help="only measure the truth (fills the cache)")
    opts = ap.parse_args()
    from autodl.profile import profile_script
    from autodl.spec import load_spec, parse_spec

    cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    rows = []
    for name, path, argv, task, topts, known in all_configs():
        if opts.only and opts.only.lower() not in name.lower():
            continue
        key = f"{path.relative_to(ROOT)} {' '.join(argv)}".strip()
        t0 = time.time()
        truth = known
        if truth is None:
            truth = None if opts.remeasure else cache.get(key)
            if truth is None:
                try:
                    env_b = task.get("batch_size_per_gpu")
                    if env_b:
                        os.environ["AUTODL_BATCH_SIZE_PER_GPU"] = str(env_b)
                    truth = measure(path, argv, topts)
                finally:
                    os.environ.pop("AUTODL_BATCH_SIZE_PER_GPU", None)
                cache[key] = dict(truth, measured_at=time.strftime("%Y-%m-%d"))
                CACHE.parent.mkdir(parents=True, exist_ok=True)
                CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True))
        t_truth = time.time() - t0
        print(f"... {name}: truth {'cached' if t_truth < 1 else f'in {t_truth:.0f}s'}", file=sys.stderr, flush=True)
        if opts.no_profile:
            continue
        # a case with its own spec file (t3: launcher.env) is profiled with it, and with the case's environment
        spec = load_spec(truth["spec"]) if truth.get("spec") else parse_spec({"task": dict(task, args=list(argv))})
        saved = {k: os.environ.get(k) for k in truth.get("env") or {}}
        os.environ.update(truth.get("env") or {})
        load = os.getloadavg()[0]
        t0 = time.time()
        try:
            prof = profile_script(path, spec, probe=True)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        secs = time.time() - t0
        peak = max(truth["peak"], truth.get("eval_peak") or 0)
        ref = truth.get("fwd_flops_per_sample")
        if ref is None and truth.get("fwd_flops_per_call") and truth.get("input"):
            ref = truth["fwd_flops_per_call"] / max(1, truth["input"][0][0])
        ref_step = _reference_step_flops(ref, truth)
        est_step = prof.flops_per_step / max(1, prof.batch_size) if prof.flops_per_step is not None else None
        rows.append({
            "name": name, "params": truth.get("params"), "autodl_params": prof.params, "truth": peak,
            "train_truth": truth["peak"], "eval_truth": truth.get("eval_peak"),
            "estimate": prof.tensor_peak_bytes, "method": prof.method, "why": prof.method_reason,
            "static": prof.estimates_bytes.get("static") or prof.estimates_bytes.get("cold_start"),
            "profile_s": round(secs, 1), "load": round(load, 1),
            "flops_ref": ref_step, "flops_est": est_step if ref_step else None,
            "phases": [(p.name, p.batch_size, p.peak_bytes) for p in prof.phases],
            "errors": [f.message for f in prof.errors],
            "warnings": [f.code for f in prof.findings if f.severity == "warning"],
        })
        print(f"... {name}: profiled in {secs:.0f}s ({prof.method}), load {load:.1f}", file=sys.stderr, flush=True)
        if opts.json:
            Path(opts.json).write_text(json.dumps(rows, indent=1))
    if rows:
        print_table(rows)


def _err(est, truth):
    return None if est is None or not truth else (est - truth) / truth


def print_table(rows: list[dict]) -> None:
    head = (f"{'script':40s} {'params':>11s} {'measured':>9s} {'estimate':>9s} {'err':>7s} {'static':>7s} "
            f"{'path':9s} {'FLOPs':>6s} {'time':>5s} {'load':>4s}")
    print(head)
    print("-" * len(head))
    errs, serrs, ferrs, times = [], [], [], []
    fmt = lambda b: f"{b / MIB:8.1f}M" if b is not None else f"{'-':>9s}"
    pct = lambda e: f"{100 * e:+6.1f}%" if e is not None else f"{'-':>7s}"
    for r in rows:
        e = _err(r["estimate"], r["truth"])
        se = _err(r["static"], r["truth"])
        fe = _err(r["flops_est"], r["flops_ref"])
        if e is not None:
            errs.append(e)
        if se is not None:
            serrs.append(se)
        if fe is not None:
            ferrs.append(fe)
        times.append(r["profile_s"])
        line = (f"{r['name'][:40]:40s} {r['params'] or 0:>11,d} {fmt(r['truth'])} {fmt(r['estimate'])} {pct(e)} "
                f"{(f'{100 * se:+6.0f}%' if se is not None else '-'):>7s} {r['method']:9s} "
                f"{(f'{100 * fe:+5.1f}%' if fe is not None else '-'):>6s} {r['profile_s']:5.0f} {r['load']:4.1f}")
        if r["params"] and r["autodl_params"] != r["params"]:
            line += f"  (autodl params {r['autodl_params']:,d})"
        if r["errors"]:
            line += f"  ERROR: {r['errors'][0][:80]}"
        print(line)
    print("-" * len(head))
    if errs:
        a = [abs(x) for x in errs]
        print(f"estimate: median |err| {100 * statistics.median(a):5.1f}%   worst |err| {100 * max(a):5.1f}%   "
              f"worst under-estimate {100 * min(0.0, min(errs)):+5.1f}%   (n={len(errs)})")
    if serrs:
        a = [abs(x) for x in serrs]
        print(f"static alone: median |err| {100 * statistics.median(a):5.1f}%   worst |err| {100 * max(a):5.1f}%")
    if ferrs:
        print(f"training FLOPs per step vs the reference count (3 x every forward call of the step, plus the "
              f"forwards recomputed in backward once): worst |err| {100 * max(abs(x) for x in ferrs):.1f}% "
              f"(n={len(ferrs)})")
    print(f"errors: {sum(1 for r in rows if r['errors'])} of {len(rows)}; profile time median "
          f"{statistics.median(times):.0f} s, worst {max(times):.0f} s (load = 1-minute load average of the "
          "2-core machine when the profile started)")
    print("MiB = 2^20 bytes; errors are (estimate - measured) / measured of the tensor peak on CPU.")


if __name__ == "__main__":
    main()
