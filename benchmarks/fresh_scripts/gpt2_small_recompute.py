# GPT-2 small (124M parameters, Radford et al. 2019: 12 layers, d=768, 12 heads, vocab 50257) pre-training on random
# tokens with activation recomputation per block (paddle.distributed.fleet.utils.recompute), HF-style config.json.
import json
import math
import os

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.distributed.fleet.utils import recompute

HERE = os.path.dirname(os.path.abspath(__file__))


class Cfg:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class CausalSelfAttention(nn.Layer):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd)
        self.n_head, self.drop = c.n_head, c.attn_pdrop

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).reshape([b, t, 3, self.n_head, d // self.n_head]).transpose([2, 0, 3, 1, 4]).unbind(0)
        att = (q @ k.transpose([0, 1, 3, 2])) * (1.0 / math.sqrt(d // self.n_head))
        att = att + paddle.triu(paddle.full([t, t], float("-inf")), 1)
        att = F.dropout(F.softmax(att, -1), self.drop, training=self.training)
        y = (att @ v).transpose([0, 2, 1, 3]).reshape([b, t, d])
        return self.c_proj(y)


class Block(nn.Layer):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(c.n_embd, c.layer_norm_epsilon), nn.LayerNorm(c.n_embd, c.layer_norm_epsilon)
        self.attn = CausalSelfAttention(c)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(approximate=True),
                                 nn.Linear(4 * c.n_embd, c.n_embd), nn.Dropout(c.resid_pdrop))

    def forward(self, x):
        x = x + F.dropout(self.attn(self.ln_1(x)), 0.1, training=self.training)
        return x + self.mlp(self.ln_2(x))


class GPT2LMHeadModel(nn.Layer):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.n_embd), nn.Embedding(c.n_positions, c.n_embd)
        self.h = nn.LayerList([Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd, c.layer_norm_epsilon)

    def forward(self, input_ids, labels=None):
        pos = paddle.arange(input_ids.shape[1]).unsqueeze(0)
        x = F.dropout(self.wte(input_ids) + self.wpe(pos), self.c.embd_pdrop, training=self.training)
        for block in self.h:
            x = recompute(block, x) if self.c.use_recompute and self.training else block(x)
        logits = paddle.matmul(self.ln_f(x), self.wte.weight, transpose_y=True)   # tied lm_head
        if labels is None:
            return (logits,)
        loss = F.cross_entropy(logits[:, :-1].reshape([-1, self.c.vocab_size]), labels[:, 1:].reshape([-1, 1]))
        return loss, logits


def main():
    with open(os.path.join(HERE, "configs", "gpt2_small.json")) as f:
        raw = json.load(f)
    tr = raw.pop("training")
    cfg = Cfg(**raw)
    paddle.seed(1337)
    model = GPT2LMHeadModel(cfg)
    sched = paddle.optimizer.lr.LinearWarmup(
        paddle.optimizer.lr.CosineAnnealingDecay(tr["lr"], tr["steps"]), tr["warmup"], 0.0, tr["lr"])
    opt = paddle.optimizer.AdamW(sched, beta1=0.9, beta2=0.95, parameters=model.parameters(),
                                 weight_decay=tr["weight_decay"], apply_decay_param_fun=lambda n: "norm" not in n
                                 and "b_" not in n, grad_clip=nn.ClipGradByGlobalNorm(1.0))
    model.train()
    for step in range(tr["steps"]):
        ids = paddle.randint(0, cfg.vocab_size, [tr["batch_size"], tr["seq_len"]], dtype="int64")
        loss, _ = model(ids, labels=ids)
        loss.backward()
        opt.step()
        opt.clear_grad(set_to_zero=False)
        sched.step()
        print(f"step {step} loss {float(loss):.3f}")


if __name__ == "__main__":
    main()
