# A small Mixture-of-Experts language model (top-2 gating over a LayerList of 8 expert FFNs per MoE layer, with the
# Switch-Transformer load-balancing loss) trained by a custom Trainer class with callbacks, fed by a
# paddle.io.IterableDataset that streams fixed-length token windows from a synthetic corpus.
import math
import time

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

CONFIG = {
    "vocab": 16000, "d_model": 384, "n_heads": 6, "n_layers": 4, "moe_every": 2, "n_experts": 8, "top_k": 2,
    "d_ff": 1024, "seq_len": 128, "batch_size": 8, "max_steps": 8, "lr": 4e-4, "aux_loss_coef": 0.01, "seed": 17,
}


class TokenStream(paddle.io.IterableDataset):
    """Endless windows of seq_len + 1 tokens cut from a synthetic Zipf-distributed corpus."""

    def __init__(self, vocab, seq_len, seed):
        super().__init__()
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        while True:
            doc = np.minimum(rng.zipf(1.3, 4096), self.vocab - 1).astype("int64")
            for s in range(0, len(doc) - self.seq_len - 1, self.seq_len):
                yield doc[s:s + self.seq_len + 1]


class Expert(nn.Layer):
    def __init__(self, d, f):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class MoEFFN(nn.Layer):
    def __init__(self, d, f, n_experts, top_k):
        super().__init__()
        self.gate = nn.Linear(d, n_experts, bias_attr=False)
        self.experts = nn.LayerList([Expert(d, f) for _ in range(n_experts)])
        self.k, self.n = top_k, n_experts

    def forward(self, x):
        b, t, d = x.shape
        tokens = x.reshape([-1, d])
        probs = F.softmax(self.gate(tokens), axis=-1)
        top_p, top_i = paddle.topk(probs, self.k, axis=-1)
        top_p = top_p / top_p.sum(-1, keepdim=True)
        out = paddle.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            sel = (top_i == e)
            rows = paddle.nonzero(sel.any(-1)).flatten()
            if rows.shape[0] == 0:
                continue
            w = (top_p * sel.astype(top_p.dtype)).sum(-1).gather(rows).unsqueeze(-1)
            out = paddle.scatter(out, rows, out.gather(rows) + w * expert(tokens.gather(rows)), overwrite=True)
        frac = F.one_hot(top_i[:, 0], self.n).mean(0)
        aux = self.n * (frac * probs.mean(0)).sum()
        return out.reshape([b, t, d]), aux


class Layer(nn.Layer):
    def __init__(self, c, moe):
        super().__init__()
        d = c["d_model"]
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiHeadAttention(d, c["n_heads"])
        self.ffn = MoEFFN(d, c["d_ff"], c["n_experts"], c["top_k"]) if moe else Expert(d, c["d_ff"])
        self.moe = moe

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask)
        y = self.ffn(self.ln2(x))
        y, aux = y if self.moe else (y, paddle.zeros([]))
        return x + y, aux


class MoELM(nn.Layer):
    def __init__(self, c):
        super().__init__()
        self.emb, self.pos = nn.Embedding(c["vocab"], c["d_model"]), nn.Embedding(c["seq_len"], c["d_model"])
        self.layers = nn.LayerList([Layer(c, (i + 1) % c["moe_every"] == 0) for i in range(c["n_layers"])])
        self.norm, self.out = nn.LayerNorm(c["d_model"]), nn.Linear(c["d_model"], c["vocab"])

    def forward(self, ids):
        t = ids.shape[1]
        mask = paddle.tril(paddle.ones([t, t], "bool"))
        x = self.emb(ids) + self.pos(paddle.arange(t))
        aux_total = 0.0
        for layer in self.layers:
            x, aux = layer(x, mask)
            aux_total = aux_total + aux
        return self.out(self.norm(x)), aux_total


class Callback:
    def on_train_begin(self, trainer): ...
    def on_step_end(self, trainer, step, logs): ...
    def on_train_end(self, trainer): ...


class ThroughputLogger(Callback):
    def on_train_begin(self, trainer):
        self.t = time.time()

    def on_step_end(self, trainer, step, logs):
        now = time.time()
        tok = trainer.cfg["batch_size"] * trainer.cfg["seq_len"]
        print(f"step {step} loss {logs['loss']:.3f} aux {logs['aux']:.3f} ppl {math.exp(min(logs['loss'], 20)):.0f} "
              f"{tok / (now - self.t):.0f} tok/s")
        self.t = now


class EarlyStopOnNaN(Callback):
    def on_step_end(self, trainer, step, logs):
        if not math.isfinite(logs["loss"]):
            trainer.should_stop = True


class Trainer:
    def __init__(self, model, cfg, loader, callbacks=()):
        self.model, self.cfg, self.loader, self.callbacks = model, cfg, loader, list(callbacks)
        self.optimizer = paddle.optimizer.Adam(cfg["lr"], parameters=model.parameters(), beta2=0.98)
        self.should_stop = False

    def _fire(self, name, *a):
        for cb in self.callbacks:
            getattr(cb, name)(self, *a)

    def training_step(self, batch):
        ids, targets = batch[:, :-1], batch[:, 1:]
        logits, aux = self.model(ids)
        lm = F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), targets.reshape([-1, 1]))
        return lm + self.cfg["aux_loss_coef"] * aux, lm, aux

    def fit(self):
        self.model.train()
        self._fire("on_train_begin")
        for step, batch in enumerate(self.loader):
            if step >= self.cfg["max_steps"] or self.should_stop:
                break
            loss, lm, aux = self.training_step(batch)
            loss.backward()
            self.optimizer.step()
            self.optimizer.clear_grad()
            self._fire("on_step_end", step, {"loss": float(lm), "aux": float(aux)})
        self._fire("on_train_end")


if __name__ == "__main__":
    paddle.seed(CONFIG["seed"])
    stream = TokenStream(CONFIG["vocab"], CONFIG["seq_len"], CONFIG["seed"])
    loader = paddle.io.DataLoader(stream, batch_size=CONFIG["batch_size"])
    Trainer(MoELM(CONFIG), CONFIG, loader, callbacks=[ThroughputLogger(), EarlyStopOnNaN()]).fit()
