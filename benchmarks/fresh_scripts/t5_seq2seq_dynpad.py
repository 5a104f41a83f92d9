# T5-like encoder-decoder (shared embeddings, RMSNorm, gated-GELU FFN, relative position buckets) trained on dict
# batches from a collate_fn that pads each batch to its own longest example (DataCollatorForSeq2Seq style), so
# batch shapes change every step. model(**batch) returns the loss when labels are given (-100 = ignored).
import argparse
import math

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description="t5-small-ish summarisation fine-tune on synthetic data")
    p.add_argument("--vocab-size", type=int, default=32128)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--per-device-train-batch-size", type=int, default=8)
    p.add_argument("--max-source-length", type=int, default=160)
    p.add_argument("--max-target-length", type=int, default=48)
    p.add_argument("--num-examples", type=int, default=80)
    p.add_argument("--num-train-epochs", type=int, default=2)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


class SummaryDataset(paddle.io.Dataset):
    def __init__(self, args):
        rng = np.random.default_rng(args.seed)
        self.src = [rng.integers(3, args.vocab_size, rng.integers(24, args.max_source_length)) for _ in
                    range(args.num_examples)]
        self.tgt = [rng.integers(3, args.vocab_size, rng.integers(6, args.max_target_length)) for _ in
                    range(args.num_examples)]

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return {"input_ids": np.append(self.src[i], 1), "labels": np.append(self.tgt[i], 1)}


def collate(features, pad_id=0, label_pad=-100):
    n_src = max(len(f["input_ids"]) for f in features)
    n_tgt = max(len(f["labels"]) for f in features)
    ids = np.full((len(features), n_src), pad_id, "int64")
    mask = np.zeros((len(features), n_src), "int64")
    labels = np.full((len(features), n_tgt), label_pad, "int64")
    for i, f in enumerate(features):
        ids[i, :len(f["input_ids"])] = f["input_ids"]
        mask[i, :len(f["input_ids"])] = 1
        labels[i, :len(f["labels"])] = f["labels"]
    return {"input_ids": paddle.to_tensor(ids), "attention_mask": paddle.to_tensor(mask),
            "labels": paddle.to_tensor(labels)}


class T5LayerNorm(nn.Layer):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = self.create_parameter([d], default_initializer=nn.initializer.Constant(1.0))
        self.eps = eps

    def forward(self, x):
        return x * paddle.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class T5Attention(nn.Layer):
    def __init__(self, cfg, has_bias, bidirectional):
        super().__init__()
        self.h, self.dk = cfg.num_heads, cfg.d_model // cfg.num_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias_attr=False)
        self.k = nn.Linear(cfg.d_model, cfg.d_model, bias_attr=False)
        self.v = nn.Linear(cfg.d_model, cfg.d_model, bias_attr=False)
        self.o = nn.Linear(cfg.d_model, cfg.d_model, bias_attr=False)
        self.bidirectional, self.buckets = bidirectional, 32
        self.rel_bias = nn.Embedding(self.buckets, self.h) if has_bias else None

    def bucket(self, rel):
        nb = self.buckets // 2 if self.bidirectional else self.buckets
        ret = (rel > 0).astype("int64") * nb if self.bidirectional else paddle.zeros_like(rel)
        n = rel.abs() if self.bidirectional else paddle.clip(-rel, min=0)
        exact = nb // 2
        large = exact + (paddle.log(n.astype("float32") / exact + 1e-6) / math.log(128 / exact)
                         * (nb - exact)).astype("int64")
        large = paddle.clip(large, max=nb - 1)
        return ret + paddle.where(n < exact, n, large)

    def position_bias(self, q_len, k_len):
        rel = paddle.arange(k_len).unsqueeze(0) - paddle.arange(q_len).unsqueeze(1)
        return self.rel_bias(self.bucket(rel)).transpose([2, 0, 1]).unsqueeze(0)

    def forward(self, x, kv, mask, bias):
        b = x.shape[0]
        sh = lambda t: t.reshape([b, -1, self.h, self.dk]).transpose([0, 2, 1, 3])  # noqa: E731
        q, k, v = sh(self.q(x)), sh(self.k(kv)), sh(self.v(kv))
        if bias is None and self.rel_bias is not None:
            bias = self.position_bias(x.shape[1], kv.shape[1])
        scores = paddle.matmul(q, k, transpose_y=True) + mask + (bias if bias is not None else 0.0)
        out = paddle.matmul(F.softmax(scores, axis=-1), v).transpose([0, 2, 1, 3]).reshape([b, -1, self.h * self.dk])
        return self.o(out), bias


class T5Block(nn.Layer):
    def __init__(self, cfg, first, decoder):
        super().__init__()
        self.self_attn = T5Attention(cfg, first, bidirectional=not decoder)
        self.cross_attn = T5Attention(cfg, False, True) if decoder else None
        self.norms = nn.LayerList([T5LayerNorm(cfg.d_model) for _ in range(3 if decoder else 2)])
        self.wi_0 = nn.Linear(cfg.d_model, cfg.d_ff, bias_attr=False)
        self.wi_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias_attr=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias_attr=False)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, mask, bias, enc=None, enc_mask=None):
        a, bias = self.self_attn(self.norms[0](x), self.norms[0](x), mask, bias)
        x = x + self.drop(a)
        if self.cross_attn is not None:
            c, _ = self.cross_attn(self.norms[1](x), enc, enc_mask, None)
            x = x + self.drop(c)
        h = self.norms[-1](x)
        return x + self.drop(self.wo(F.gelu(self.wi_0(h), approximate=True) * self.wi_1(h))), bias


class T5ForConditionalGeneration(nn.Layer):
    def __init__(self, cfg):
        super().__init__()
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder = nn.LayerList([T5Block(cfg, i == 0, False) for i in range(cfg.num_layers)])
        self.decoder = nn.LayerList([T5Block(cfg, i == 0, True) for i in range(cfg.num_layers)])
        self.enc_norm, self.dec_norm = T5LayerNorm(cfg.d_model), T5LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias_attr=False)

    def forward(self, input_ids, attention_mask, labels=None, decoder_input_ids=None):
        if decoder_input_ids is None:  # shift right, pad id 0 as the decoder start token
            dec = paddle.where(labels == -100, paddle.zeros_like(labels), labels)
            decoder_input_ids = paddle.concat([paddle.zeros_like(dec[:, :1]), dec[:, :-1]], axis=1)
        enc_mask = (1.0 - attention_mask.astype("float32"))[:, None, None, :] * -1e9
        h, bias = self.shared(input_ids), None
        for blk in self.encoder:
            h, bias = blk(h, enc_mask, bias)
        enc = self.enc_norm(h)
        t = decoder_input_ids.shape[1]
        causal = paddle.triu(paddle.full([t, t], -1e9), diagonal=1)[None, None]
        d, bias = self.shared(decoder_input_ids), None
        for blk in self.decoder:
            d, bias = blk(d, causal, bias, enc, enc_mask)
        logits = self.lm_head(self.dec_norm(d))
        if labels is None:
            return logits
        return F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), labels.reshape([-1, 1]), ignore_index=-100)


def main():
    args = parse_args()
    paddle.seed(args.seed)
    np.random.seed(args.seed)  # DataLoader(shuffle=True) draws its order from NumPy's global generator
    ds = SummaryDataset(args)
    loader = paddle.io.DataLoader(ds, batch_size=args.per_device_train_batch_size, shuffle=True, collate_fn=collate)
    model = T5ForConditionalGeneration(args)
    opt = paddle.optimizer.AdamW(args.learning_rate, parameters=model.parameters(), weight_decay=0.0)
    for epoch in range(args.num_train_epochs):
        for step, batch in enumerate(loader):
            loss = model(**batch)
            loss.backward()
            opt.step()
            opt.clear_grad()
            if step % 5 == 0:
                print(f"epoch {epoch} step {step} src {batch['input_ids'].shape} loss {float(loss):.3f}")


if __name__ == "__main__":
    main()
