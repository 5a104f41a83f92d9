"""Measure every script of this folder with measure.py and write truth.json (what each script is, plus its truth).

    python collect.py                 # measure all scripts, rewrite truth.json
    python collect.py NAME [NAME...]  # re-measure only these (by file name), keep the other entries
    python collect.py --repeat NAME   # measure again and print the difference to the stored entry (no write)

Each measurement is a fresh process: ``python measure.py --phase train SCRIPT ARGS`` (and ``--phase eval`` for the
scripts with an evaluation pass), run in this folder with the interpreter that runs collect.py.  Runs one at a
time (the machine is shared).
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "truth.json")

# What each script is.  "args": the command-line arguments it was measured with; "eval": whether it has an
# evaluation pass under paddle.no_grad that is measured separately.
SCRIPTS = [
    dict(file="gpt_lm_cfgclass.py", args=[], batch_size=2, eval=False,
         input="token ids int64 [2, 128] from a Dataset (inputs and shifted targets, both passed to forward)",
         optimizer="AdamW(beta2=0.95, weight_decay=0.1 except 1-D params) + LinearWarmup->CosineAnnealingDecay, "
                   "ClipGradByGlobalNorm(1.0)",
         style="config in class attributes (GPTConfig, TrainConfig); GPT-2-small-like decoder (8 layers, d=768, "
               "vocab 32000) with the output head tied to the token embedding via paddle.matmul(transpose_y=True); "
               "causal mask via paddle.triu buffer + paddle.where; loss computed inside forward; model built under "
               "if __name__ == '__main__'"),
    dict(file="vit_dataclass.py", args=[], batch_size=16, eval=False,
         input="images float32 [16, 3, 96, 160] (not square) from a Dataset",
         optimizer="Momentum(0.9, L2Decay 5e-5) + PiecewiseDecay",
         style="@dataclass configs (with field(default_factory=...)); ViT (patch 16, 6 layers, d=384) with "
               "paddle.einsum attention, cls token via paddle.concat, nn.CrossEntropyLoss(label_smoothing=0.1); "
               "model built inside train(cfg)"),
    dict(file="audio_cnn_dictcfg.py", args=[], batch_size=32, eval=False,
         input="waveforms float32 [32, 1, 16000] from a Dataset",
         optimizer="SGD(weight_decay=1e-4) + MultiStepDecay",
         style="plain dict config (CONFIG['model'][...]); 1-D CNN (M5-like) with F.pad(mode='reflect', NCL), "
               "paddle.split/concat branches, F.max_pool1d, F.adaptive_max_pool1d + F.adaptive_avg_pool1d"),
    dict(file="resnet152_get_args.py", args=[], batch_size=4, eval=False,
         input="images float32 [4, 3, 128, 128] from a Dataset",
         optimizer="Momentum(0.9, nesterov, weight_decay=1e-4 float) + CosineAnnealingDecay",
         style="argparse inside def get_args(); paddle.vision.models.resnet152(num_classes=10); clear_grad() called "
               "before backward (between forward and backward); training loop in a helper train_one_epoch()"),
    dict(file="mobilenet_cli.py",
         args=["--batch-size", "12", "--img-size", "112", "--width-mult", "0.5", "--num-classes", "37",
               "--lr", "0.045"],
         batch_size=12, eval=False,
         input="images float32 [12, 3, 112, 112] made with paddle.uniform in the loop (defaults would be 64 x 224)",
         optimizer="RMSProp(rho=0.9, momentum=0.9, weight_decay=4e-5) + ExponentialDecay",
         style="module-level argparse parser, values given on the command line (defaults differ: batch 64, 224, "
               "width 1.0, 1000 classes); paddle.vision.models.mobilenet_v2(scale=0.5, num_classes=37)"),
    dict(file="video_r2plus1d_main.py", args=[], batch_size=4, eval=True,
         input="train clips float32 [4, 3, 8, 112, 112]; eval clips [4, 3, 16, 128, 171] under paddle.no_grad "
               "(both from Datasets)",
         optimizer="Adam(L2Decay 5e-4)",
         style="model, data and loop built in main() under if __name__ == '__main__'; 3-D convolutions (R(2+1)D: "
               "1xkxk spatial + tx1x1 temporal Conv3D, BatchNorm3D, AdaptiveAvgPool3D); an evaluation pass each "
               "epoch on longer, larger clips"),
    dict(file="mlp_module_level.py", args=[], batch_size=256, eval=False,
         input="images float32 [256, 1, 28, 28] made with paddle.rand at module level",
         optimizer="SGD(lr=0.05)",
         style="everything at module level, no main guard: model = nn.Sequential(...) (conv-conv-flatten-MLP), "
               "loop at top level"),
    dict(file="seg_functional_ops.py", args=[], batch_size=8, eval=False,
         input="images float32 [8, 3, 90, 150] (odd, not square) and labels int64 [8, 90, 150] from a Dataset; "
               "F.pad to 96x160 inside forward",
         optimizer="Adam + ClipGradByNorm(5.0)",
         style="functional ops: F.pad, paddle.split/concat, F.interpolate(size=skip.shape[2:], bilinear), non-local "
               "block with paddle.matmul(transpose_x=True)/(transpose_y=True), output cropped by slicing, loss masked "
               "by a boolean mask"),
    dict(file="siamese_contrastive.py", args=[], batch_size=8, eval=False,
         input="two images float32 [8, 1, 105, 105] + a float32 [8, 1] same/different label from a Dataset; "
               "forward(left, right)",
         optimizer="Adam(lr=6e-5)",
         style="siamese: forward with two inputs through one shared tower (Koch et al. 2015 one-shot net), "
               "contrastive loss"),
    dict(file="clip_text_image.py", args=[], batch_size=32, eval=False,
         input="images float32 [32, 3, 128, 128], token ids int64 [32, 32], attention mask int64 [32, 32] from a "
               "Dataset; forward(images, input_ids, attention_mask)",
         optimizer="AdamW(weight_decay=0.2, beta2=0.98) + OneCycleLR",
         style="text+image multi-input model (CLIP-like): conv image tower + nn.TransformerEncoder text tower "
               "(vocab 49408) with an additive padding mask, take_along_axis pooling, logits via img @ txt.T"),
    dict(file="transformer_mt_namespace.py", args=[], batch_size=16, eval=False,
         input="source ids int64 [16, 48] and target ids int64 [16, 52] (sliced from [16, 53]) from a Dataset; "
               "forward(src, tgt_in)",
         optimizer="Adam(0.9, 0.98, eps=1e-9) + NoamDecay",
         style="config in types.SimpleNamespace; paddle.nn.Transformer encoder-decoder (3+3 layers, d=512) with "
               "padding + causal masks, label-smoothed soft-label cross entropy masked on padding"),
    dict(file="shufflenet_amp.py", args=[], batch_size=32, eval=False,
         input="images float32 [32, 3, 224, 224] made with paddle.randn in the loop",
         optimizer="Momentum(0.9, L2Decay 4e-5) + LinearWarmup; GradScaler(init_loss_scaling=1024)",
         style="AMP: paddle.amp.auto_cast(level='O1') + GradScaler scale/step/update (on CPU auto_cast is a no-op "
               "with a warning: the truth is float32); paddle.vision.models.shufflenet_v2_x0_5(num_classes=102)"),
    dict(file="densenet121_accum.py", args=[], batch_size=4, eval=False,
         input="images float32 [4, 3, 128, 128] per micro-batch from a Dataset; 4 micro-batches per optimizer step",
         optimizer="SGD(L2Decay 1e-4) + StepDecay",
         style="gradient accumulation (loss / 4, step + clear_grad every 4 micro-batches, so a measured step is 4 "
               "forward/backward passes); paddle.vision.models.densenet121(num_classes=14); model and optimizer "
               "at module level, loop under the main guard"),
    dict(file="squeezenet_dataparallel.py", args=[], batch_size=24, eval=False,
         input="images float32 [24, 3, 160, 160] from a Dataset through a DistributedBatchSampler",
         optimizer="Adam + CosineAnnealingDecay",
         style="paddle.DataParallel wrapping (one process here; init_parallel_env only when world size > 1), "
               "DistributedBatchSampler; paddle.vision.models.squeezenet1_1(num_classes=200)"),
    dict(file="bilstm_tagger.py", args=[], batch_size=32, eval=False,
         input="word ids int64 [32, 64] + tags int64 [32, 64] + lengths int64 [32] from a Dataset; "
               "forward(words, lengths)",
         optimizer="Adam + InverseTimeDecay, ClipGradByValue(5.0)",
         style="RNN: 3-layer bidirectional nn.LSTM with sequence_length, token loss masked by length via "
               "paddle.where"),
    dict(file="sr_eval_fullres.py", args=[], batch_size=8, eval=True,
         input="train: LR patches float32 [8, 3, 48, 48] (avg-pooled from [8, 3, 96, 96]); eval: whole frames "
               "[1, 3, 180, 320] under paddle.no_grad",
         optimizer="Adam + MultiStepDecay",
         style="EDSR-baseline-like super-resolution (8 residual blocks, 64 features, F.pixel_shuffle x2); an "
               "evaluation pass each epoch at full frame size"),
    dict(file="hapi_fit_resnet.py", args=[], batch_size=128, eval=False,
         input="images float32 [128, 3, 32, 32] from a Dataset, batched by model.fit",
         optimizer="Momentum(0.9, L2Decay 5e-4) + PiecewiseDecay",
         style="high-level API: paddle.Model(net, inputs=InputSpec, labels=InputSpec).prepare(...).fit(...) "
               "(the step is optimizer.minimize + network.clear_gradients inside hapi); resnet18(num_classes=10)"),
    dict(file="effnet_yaml_workers.py", args=[], batch_size=16, eval=False,
         input="images float32 [16, 3, 128, 192] (not square) from a Dataset, DataLoader num_workers=2",
         optimizer="AdamW(weight_decay=0.05) + CosineAnnealingWarmRestarts, chosen by name from the YAML",
         style="everything from configs/effnet_lite.yaml (image size, num_workers=2, widths, optimizer name); "
               "EfficientNet-lite-like MBConv net with depthwise convs and squeeze-excitation (F.adaptive_avg_pool2d, "
               "F.silu, F.sigmoid gating)"),
    dict(file="gru_attention_seq2seq.py", args=[], batch_size=24, eval=False,
         input="source ids int64 [24, 60] + lengths int64 [24] + target ids int64 [24, 20] from a Dataset; "
               "forward(src, src_len, tgt_in)",
         optimizer="Adam + ClipGradByGlobalNorm(2.0)",
         style="three-input seq2seq: 2-layer bidirectional nn.GRU encoder with sequence_length, nn.GRUCell decoder "
               "unrolled in a Python loop with additive attention (paddle.where masking, paddle.bmm), "
               "paddle.stack of per-step logits"),
    dict(file="conv_autoencoder_json.py", args=[], batch_size=64, eval=False,
         input="images float32 [64, 1, 64, 64] from a TensorDataset, noised in the loop",
         optimizer="Momentum(0.9, L2Decay 5e-4)",
         style="hyper-parameters from configs/autoencoder.json; Conv-BN-ReLU encoder + Conv2DTranspose decoder; "
               "Paddle 2.0 idiom optimizer.minimize(loss) + model.clear_gradients(); all at module level"),
]


METHOD = ("measure.py: Paddle's CPU allocator peak ('Allocated', device 0) of the second full training step in a "
          "fresh process (and of the second eval step for eval-pass scripts); see README.md")


def measure(entry, phase, here=HERE):
    """One fresh ``measure.py`` process for ``entry`` run in folder ``here`` (with ``--max-over-steps N`` when the
    entry has ``max_over_steps``); returns its TRUTH dict plus ``wall_s``."""
    opts = ["--max-over-steps", str(entry["max_over_steps"])] if entry.get("max_over_steps") else []
    cmd = [sys.executable, os.path.join(HERE, "measure.py"), "--phase", phase, *opts, entry["file"], *entry["args"]]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=here, capture_output=True, text=True)
    wall = round(time.time() - t0, 1)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("TRUTH ")]
    if not lines:
        raise SystemExit(f"{entry['file']} ({phase}): no TRUTH line, exit {p.returncode}\n{p.stderr[-3000:]}")
    res = json.loads(lines[-1][6:])
    if "error" in res:
        raise SystemExit(f"{entry['file']} ({phase}): {res}")
    res["wall_s"] = wall
    return res


def build(entry, here=HERE):
    """The truth.json entry of ``entry``; a variable-size script (``max_over_steps``) also gets the per-step peaks."""
    tr = measure(entry, "train", here)
    ev = measure(entry, "eval", here) if entry.get("eval") else None
    out = {
        "file": entry["file"],
        "args": entry["args"],
        "batch_size": entry["batch_size"],
        "input": entry["input"],
        "measured_input_of_first_call": tr["input"],
        "train_peak_bytes": tr["peak"],
        "eval_peak_bytes": ev["peak"] if ev else None,
        "eval_first_step_peak_bytes": ev["first_eval_peak"] if ev else None,
        "params": tr["params"],
        "trainable_params": tr["trainable"],
        "optimizer_params": tr["opt_params"],
        "ref_forward_flops": tr["ref_flops"],
        "ref_forward_flops_input": tr["ref_flops_input"] if tr["ref_flops"] is not None else None,
        "ref_forward_flops_none_because": None if tr["ref_flops"] is not None else (
            tr["ref_flops_input"] or "paddle.flops needs one float input: the model's forward takes token ids "
                                     "and/or several inputs"),
        "hook_forward_flops_per_call": tr["fwd_flops_per_call"],
        "hook_forward_flops_in_backward_per_call": tr.get("fwd_flops_in_backward_per_call"),
        "forward_calls_in_step": tr["fwd_calls"],
        "model_class": tr["model"],
        "optimizer": entry["optimizer"],
        "optimizer_class": tr["opt"],
        "style": entry["style"],
        "measure_seconds": tr["wall_s"],
        "eval_measure_seconds": ev["wall_s"] if ev else None,
        "step_seconds": tr["step_s"],
        "eval_step_seconds": ev["step_s"] if ev else None,
    }
    if entry.get("max_over_steps"):
        out["max_over_steps"] = tr["max_over_steps"]
        out["per_step_peak_bytes"] = tr["per_step_peak_bytes"]
        out["per_step_seconds"] = tr["per_step_s"]
        out["peak_step_index"] = tr["peak_step"]
        out["ended_by"] = tr["ended_by"]
    return out


def main(scripts=SCRIPTS, here=HERE, method=METHOD):
    """Measure ``scripts`` (their files in folder ``here``) as the command line says and write ``here/truth.json``."""
    argv = sys.argv[1:]
    out_path = os.path.join(here, "truth.json")
    repeat = "--repeat" in argv
    names = [a for a in argv if not a.startswith("--")]
    by_name = {e["file"]: e for e in scripts}
    for n in names:
        if n not in by_name:
            raise SystemExit(f"unknown script {n!r}; known: {', '.join(by_name)}")
    todo = names or list(by_name)
    old = {}
    if os.path.exists(out_path):
        with open(out_path) as f:
            old = {s["file"]: s for s in json.load(f)["scripts"]}
    import paddle
    for n in todo:
        print(f"measuring {n} ...", flush=True)
        new = build(by_name[n], here)
        if repeat:
            o = old.get(n, {})
            for k in ("train_peak_bytes", "eval_peak_bytes", "params", "ref_forward_flops", "per_step_peak_bytes"):
                print(f"{n} {k}: stored {o.get(k)} now {new.get(k)}")
            continue
        old[n] = new
        print(json.dumps(new), flush=True)
        doc = {"paddle": paddle.__version__, "device": "CPU (CUDA_VISIBLE_DEVICES='')", "method": method,
               "scripts": [old[e["file"]] for e in scripts if e["file"] in old]}
        with open(out_path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
