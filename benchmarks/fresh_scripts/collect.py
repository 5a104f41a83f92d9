"""Measure every script of this folder with ../user_scripts/measure.py and write truth.json (same format as
../user_scripts/truth.json, plus ``max_over_steps`` / ``per_step_peak_bytes`` for variable-size scripts).

    python collect.py                 # measure all scripts, rewrite truth.json
    python collect.py NAME [NAME...]  # re-measure only these (by file name), keep the other entries
    python collect.py --repeat NAME   # measure again and print the difference to the stored entry (no write)

Each measurement is a fresh process: ``python ../user_scripts/measure.py --phase train [--max-over-steps N] SCRIPT
ARGS``, run in this folder with the interpreter that runs collect.py, one at a time (the machine is shared).  For
scripts whose inputs change size between steps, N is the number of steps of one epoch (``steps_per_epoch``) or, where
every epoch holds the same fixed set of batches in a new order, 2 x that - 1 (so a whole epoch after the warm-up is
covered); ``train_peak_bytes`` is then the largest of the N steps' peaks.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# What each script is.  "max_over_steps": None for fixed-shape scripts (one step is the truth), else N.
SCRIPTS = [
    dict(file="bert_dict_classifier.py", args=[], batch_size=16, max_over_steps=None,
         input="dict batches {input_ids, token_type_ids, attention_mask: int64 [16, 128], labels: int64 [16]} from a "
               "Dataset of dicts (padding='max_length'); model(**batch)",
         optimizer="AdamW(weight_decay=0.01 except bias/LayerNorm, eps=1e-8) + LinearWarmup->PolynomialDecay, "
                   "ClipGradByGlobalNorm(1.0)",
         style="config from environment variables (BATCH_SIZE, MAX_SEQ_LEN, EPOCHS); HF-style BERT encoder "
               "(6 layers, d=384, vocab 30522) for sequence classification, model(**batch) returns a dict "
               "{'logits', 'loss'}"),
    dict(file="t5_seq2seq_dynpad.py", args=[], batch_size=8, max_over_steps=10,
         input="dict batches {input_ids, attention_mask: int64 [8, S], labels: int64 [8, T]} padded per batch to its "
               "longest example (S 25-160, T 7-48); model(**batch)",
         optimizer="AdamW(lr=1e-3, weight_decay=0)",
         style="argparse with defaults in parse_args(); T5-like encoder-decoder (4+4 layers, d=256, vocab 32128, "
               "shared embeddings, RMSNorm, gated-GELU FFN, relative position buckets), DataCollatorForSeq2Seq-like "
               "collate_fn with label padding -100, model(**batch) returns the loss; 10 steps per epoch"),
    dict(file="gcn_graph_batches.py", args=[], batch_size=32, max_over_steps=12,
         input="32 graphs per batch concatenated along the node axis: node features float32 [N, 64] (N ~ 1,200-1,900, "
               "different every batch), edge_index int64 [2, E], graph ids int64 [N]; forward(x, edge_index, batch)",
         optimizer="Adam(weight_decay=5e-4) + ReduceOnPlateau stepped per epoch",
         style="module constants; 4-layer GCN written with paddle.geometric.send_u_recv (symmetric normalisation per "
               "edge, degrees by scatter_), BatchNorm1D, segment_mean + segment_max readout; PyG-style collate "
               "with offset edge ids; 12 steps per epoch"),
    dict(file="gat_dense_adjacency.py", args=[], batch_size=8, max_over_steps=10,
         input="8 graphs per batch stacked along the node axis: node features float32 [N, 50] (N ~ 600-1,300), "
               "a dense block-diagonal bool adjacency [N, N], multi-labels float32 [N, 121]; forward(x, adj)",
         optimizer="Adam(lr=0.005)",
         style="config from configs/gat_ppi.yaml; 3-layer GAT (heads 4/4/6, residual projections) with masked "
               "softmax over a dense adjacency (attention [heads, N, N]), multi-label BCE; 10 steps per epoch"),
    dict(file="retinanet_multiscale.py", args=[], batch_size=2, max_over_steps=10,
         input="images float32 [2, 3, s, s], s drawn per batch from 256/320/384/448 (F.interpolate of 448x448 "
               "Dataset images), boxes and labels as lists of [n_i, 4] / [n_i] tensors",
         optimizer="Momentum(0.9, weight_decay=1e-4) + ClipGradByNorm(35)",
         style="module-level argparse; RetinaNet-like: conv backbone, FPN P3-P5, shared 3-conv class/box towers, "
               "anchors and IoU assignment in paddle ops, sigmoid_focal_loss + smooth L1; multi-scale training "
               "(one random size per batch); 10 steps per epoch"),
    dict(file="fcos_padded_batches.py", args=[], batch_size=2, max_over_steps=12,
         input="images float32 [2, 3, H, W] padded to the batch's largest image rounded up to 32 (short side "
               "224-320, aspect up to 1.6, either orientation), boxes/labels as lists of tensors",
         optimizer="Momentum(0.9, L2Decay 1e-4) + LinearWarmup",
         style="config from configs/fcos_r18.yaml; FCOS-like anchor-free head (GroupNorm towers, learnable "
               "per-level scales, centerness) on paddle.vision.models.resnet18 stages; per-location targets in "
               "paddle ops, focal + IoU + centerness BCE losses; 12 steps per epoch"),
    dict(file="fixmatch_two_loaders.py", args=[], batch_size=112, max_over_steps=None,
         input="labelled images float32 [16, 3, 32, 32] + weak and strong views [48, 3, 32, 32] each from a second "
               "DataLoader, concatenated into one forward of [112, 3, 32, 32]",
         optimizer="Momentum(0.9, nesterov) with parameter groups (weight_decay 5e-4 / 0 for BN and bias) + "
                   "LambdaDecay cosine",
         style="module-level argparse (parse_known_args); FixMatch semi-supervised: a labelled and an unlabelled "
               "DataLoader (mu=3) zipped via an endless generator, pseudo-labels with a confidence mask; "
               "WideResNet-16-2-like; clear_grad() before backward"),
    dict(file="multitask_alternating_ini.py", args=[], batch_size=32, max_over_steps=12,
         input="alternating batches: task 'cls' token ids int64 [32, 64] + labels [32]; task 'tag' token ids "
               "int64 [12, 192] + tags [12, 192]; forward(ids, task=...)",
         optimizer="Adam(5e-4) + ClipGradByGlobalNorm(1.0)",
         style="config from configs/multitask.ini (configparser); two DataLoaders round-robin through a shared "
               "pre-norm nn.TransformerEncoder (4 layers, d=256, vocab 21128) with two heads in an nn.LayerDict; "
               "12 steps per epoch (6 of each task)"),
    dict(file="dlrm_sparse_embedding.py", args=[], batch_size=2048, max_over_steps=None,
         input="dense features float32 [2048, 13] + categorical ids int64 [2048, 8] (Zipf) made with NumPy in the "
               "loop; forward(dense, ids)",
         optimizer="Adam(lazy_mode=True)",
         style="typing.NamedTuple config; DLRM: 8 embedding tables (4M, 200k, 50k, ... rows, dim 16), the 4M-row "
               "one with sparse=True (SelectedRows gradients), bottom/top MLPs, pairwise dot interaction via "
               "paddle.bmm + index_select of the upper triangle"),
    dict(file="wide_deep_two_optimizers.py", args=[], batch_size=1024, max_over_steps=None,
         input="cross-feature ids int64 [1024, 24] (into 2.5M buckets) + 10 field ids int64 [1024, 10] + "
               "continuous float32 [1024, 16]; forward(cross_ids, field_ids, continuous)",
         optimizer="two optimizers: SGD(0.05, L1Decay) on the wide part (2.5M-row sparse=True embedding + bias), "
                   "Adagrad(0.01) on the deep part",
         style="argparse in a module-level parser; Wide & Deep: [2.5M, 1] sparse wide embedding summed + 10 deep "
               "embeddings (400k ... 12 rows, dim 32) + 3-layer MLP with BatchNorm1D; two optimizers step and "
               "clear each step (optimizer_params counts the first one, SGD)"),
    dict(file="gpt2_small_recompute.py", args=[], batch_size=4, max_over_steps=None,
         input="token ids int64 [4, 256] made with paddle.randint in the loop; model(ids, labels=ids)",
         optimizer="AdamW(beta2=0.95, weight_decay=0.1 except norms/biases) + LinearWarmup->CosineAnnealingDecay, "
                   "ClipGradByGlobalNorm(1.0)",
         style="HF-style configs/gpt2_small.json; GPT-2 small (12 layers, d=768, vocab 50257, 124M, tied head) "
               "with every block wrapped in paddle.distributed.fleet.utils.recompute; returns (loss, logits); "
               "clear_grad(set_to_zero=False)"),
    dict(file="gpt_medium_presets.py", args=[], batch_size=2, max_over_steps=None,
         input="token ids int64 [2, 64] sliced from a paddle.randint tensor; forward(idx)",
         optimizer="AdamW(3e-4, weight_decay=0.01) + ClipGradByGlobalNorm(1.0)",
         style="argparse --model preset name (PRESETS dict; default gpt2-medium: 24 layers, d=1024, 16 heads); "
               "decoder-only LM from nn.TransformerEncoderLayer(normalize_before=True) with a causal src_mask, "
               "learned position parameter, untied 50257-way head (405M parameters)"),
    dict(file="mixer_to_static.py", args=[], batch_size=32, max_over_steps=None,
         input="images float32 [32, 3, 128, 128] from a Dataset",
         optimizer="AdamW(weight_decay=0.05) + CosineAnnealingDecay",
         style="@paddle.jit.to_static(full_graph=True) on forward: dynamic-to-static training (the hook FLOP count "
               "is 0: layer hooks and the matmul patch do not run inside the static program); MLP-Mixer (8 blocks, "
               "d=384, 64 tokens); config constants + BATCH env variable"),
    dict(file="moe_iterable_trainer.py", args=[], batch_size=8, max_over_steps=7,
         input="token windows int64 [8, 129] from a paddle.io.IterableDataset, sliced to [8, 128] inputs/targets",
         optimizer="Adam(4e-4, beta2=0.98)",
         style="config dict; custom Trainer class with callbacks (throughput logger, NaN early stop); "
               "decoder LM whose every 2nd FFN is a top-2 Mixture of Experts over an nn.LayerList of 8 experts "
               "(token routing by nonzero/gather/scatter, Switch load-balancing loss); routing changes the "
               "experts' batch sizes every step, so the max over the 7 steps after the warm-up"),
    dict(file="asr_ctc_bucket_sampler.py", args=[], batch_size=None, max_over_steps=19,
         input="log-mel features float32 [B, T, 80] + lengths, BPE targets int32 [B, U] + lengths; B x T <= 3200 "
               "frames per batch (B 1-13, T up to 600) from a length-bucketing BatchSampler; forward(feats, "
               "feat_lens)",
         optimizer="Adam(weight_decay=1e-6) + LambdaDecay Noam warm-up, ClipGradByGlobalNorm(5.0)",
         style="config from configs/asr_ctc.toml (tomllib); custom paddle.io.BatchSampler subclass (buckets by "
               "length, frame budget per batch, batches shuffled per epoch); Conv2D 4x subsampling + pre-norm "
               "Transformer encoder + F.ctc_loss; 10 fixed batches per epoch in a new order each epoch, so "
               "N = 19 covers epoch 1 after the warm-up and all of epoch 2"),
]


METHOD = ("../user_scripts/measure.py: Paddle's CPU allocator peak ('Allocated', device 0) of the second full training "
          "step in a fresh process; for variable-size scripts (max_over_steps set) the largest of the peaks of the N "
          "steps after the warm-up, each reset on its own; see README.md")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(HERE, "..", "user_scripts"))
    import collect as runner  # the user scripts' runner: the same measurement, this folder's scripts

    runner.main(SCRIPTS, HERE, METHOD)
