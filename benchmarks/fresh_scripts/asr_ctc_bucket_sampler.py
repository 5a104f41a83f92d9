# CTC speech recognition (conv 4x subsampling + Transformer encoder) on synthetic log-mel utterances of different
# lengths, batched by a custom paddle.io.BatchSampler that buckets by length and fills each batch up to a frame
# budget (ESPnet/WeNet "dynamic batch"), so both the batch size and the padded length change from step to step.
# Hyper-parameters from a TOML file (tomllib).
import math
import os
import tomllib

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "asr_ctc.toml"), "rb") as fh:
    HP = tomllib.load(fh)


class Utterances(paddle.io.Dataset):
    def __init__(self, d, seed):
        rng = np.random.default_rng(seed)
        self.frames = rng.integers(d["min_frames"], d["max_frames"] + 1, d["num_utterances"])
        self.d, self.seed = d, seed

    def __len__(self):
        return len(self.frames)

    def __getitem__(self, i):
        rng = np.random.default_rng(self.seed * 7919 + i)
        n = int(self.frames[i])
        feats = rng.standard_normal((n, self.d["n_mels"])).astype("float32")
        text = rng.integers(1, self.d["vocab"], max(1, n // self.d["frames_per_token"])).astype("int32")
        return feats, text


class BucketFrameBatchSampler(paddle.io.BatchSampler):
    """Sort by length within buckets, cut batches so that batch_size x longest <= max_frames, shuffle the batches."""

    def __init__(self, lengths, max_frames, num_buckets, seed):
        self.lengths, self.max_frames, self.num_buckets = np.asarray(lengths), max_frames, num_buckets
        self.rng = np.random.default_rng(seed)
        self.batches = self._make()

    def _make(self):
        order = np.argsort(self.lengths, kind="stable")
        batches = []
        for bucket in np.array_split(order, self.num_buckets):
            self.rng.shuffle(bucket)
            bucket = bucket[np.argsort(self.lengths[bucket], kind="stable")]
            cur = []
            for idx in bucket:
                if cur and (len(cur) + 1) * max(self.lengths[cur + [idx]]) > self.max_frames:
                    batches.append(cur)
                    cur = []
                cur.append(int(idx))
            if cur:
                batches.append(cur)
        return batches

    def __iter__(self):
        for j in self.rng.permutation(len(self.batches)):
            yield self.batches[j]

    def __len__(self):
        return len(self.batches)


def pad_collate(items):
    t = max(len(f) for f, _ in items)
    u = max(len(y) for _, y in items)
    feats = np.zeros((len(items), t, items[0][0].shape[1]), "float32")
    labels = np.zeros((len(items), u), "int32")
    for i, (f, y) in enumerate(items):
        feats[i, :len(f)], labels[i, :len(y)] = f, y
    flen = np.array([len(f) for f, _ in items], "int64")
    ylen = np.array([len(y) for _, y in items], "int64")
    return [paddle.to_tensor(a) for a in (feats, flen, labels, ylen)]


class Conv2dSubsampling4(nn.Layer):
    def __init__(self, n_mels, d, channels=64):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2D(1, channels, 3, 2), nn.ReLU(), nn.Conv2D(channels, channels, 3, 2), nn.ReLU())
        self.out = nn.Linear(channels * (((n_mels - 1) // 2 - 1) // 2), d)

    def forward(self, x):
        x = self.conv(x.unsqueeze(1))                      # [B, d, T', F']
        b, c, t, f = x.shape
        return self.out(x.transpose([0, 2, 1, 3]).reshape([b, t, c * f]))


class CTCModel(nn.Layer):
    def __init__(self, d, m):
        super().__init__()
        self.sub = Conv2dSubsampling4(d["n_mels"], m["d_model"])
        layer = nn.TransformerEncoderLayer(m["d_model"], m["heads"], m["ffn"], dropout=0.1, normalize_before=True)
        self.encoder = nn.TransformerEncoder(layer, m["layers"], norm=nn.LayerNorm(m["d_model"]))
        self.ctc_lo = nn.Linear(m["d_model"], d["vocab"])

    def forward(self, feats, feat_lens):
        x = self.sub(feats)
        x = x * math.sqrt(x.shape[-1])
        out_lens = ((feat_lens - 1) // 2 - 1) // 2
        keep = paddle.arange(x.shape[1]).unsqueeze(0) < out_lens.unsqueeze(1)      # [B, T']
        mask = paddle.where(keep, paddle.zeros(keep.shape), paddle.full(keep.shape, -1e9))[:, None, None, :]
        return self.ctc_lo(self.encoder(x, src_mask=mask)), out_lens


def noam(step, d_model, warmup, peak):
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


if __name__ == "__main__":
    paddle.seed(HP["seed"])
    np.random.seed(HP["seed"])
    ds = Utterances(HP["data"], HP["seed"])
    sampler = BucketFrameBatchSampler(ds.frames, HP["data"]["max_frames_per_batch"], HP["data"]["num_buckets"],
                                      HP["seed"])
    loader = paddle.io.DataLoader(ds, batch_sampler=sampler, collate_fn=pad_collate)
    model = CTCModel(HP["data"], HP["model"])
    tr = HP["train"]
    sched = paddle.optimizer.lr.LambdaDecay(1.0, lambda s: noam(s, HP["model"]["d_model"], tr["warmup_steps"],
                                                                tr["peak_lr"]))
    opt = paddle.optimizer.Adam(sched, parameters=model.parameters(), grad_clip=nn.ClipGradByGlobalNorm(5.0),
                                weight_decay=1e-6)
    print(f"{len(sampler)} batches per epoch")
    for epoch in range(tr["epochs"]):
        for it, (feats, flen, labels, ylen) in enumerate(loader):
            logits, olen = model(feats, flen)
            log_probs = F.log_softmax(logits, -1).transpose([1, 0, 2])      # [T, B, V]
            loss = F.ctc_loss(log_probs, labels, olen, ylen, blank=0, reduction="mean")
            loss.backward()
            opt.step()
            opt.clear_grad()
            sched.step()
            print(f"epoch {epoch} it {it} batch {list(feats.shape)} loss {float(loss):.3f}")
