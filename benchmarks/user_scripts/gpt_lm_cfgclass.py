"""Pre-train a small GPT-style causal language model on synthetic token streams.

Config lives in class attributes; the output head shares the token-embedding matrix (weight tying through a
transposed matmul); causal masking with paddle.triu + paddle.where; AdamW without decay on biases/norms,
linear warm-up into cosine decay, global-norm clipping.
"""
import math

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset


class GPTConfig:
    vocab_size = 32000
    block_size = 128
    n_layer = 8
    n_head = 12
    n_embd = 768
    dropout = 0.1
    bias = True


class TrainConfig:
    batch_size = 2
    max_steps = 4
    learning_rate = 6e-4
    min_lr = 6e-5
    warmup_steps = 1
    weight_decay = 0.1
    grad_clip = 1.0


class RandomTokens(Dataset):
    """Stands in for a tokenised corpus: each sample is block_size + 1 consecutive token ids."""

    def __init__(self, n_samples, block_size, vocab_size):
        self.n, self.block, self.vocab = n_samples, block_size, vocab_size

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        chunk = np.random.randint(0, self.vocab, size=(self.block + 1,)).astype("int64")
        return chunk[:-1], chunk[1:]


class CausalSelfAttention(nn.Layer):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias_attr=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias_attr=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        causal = paddle.triu(paddle.ones([config.block_size, config.block_size]), diagonal=1)
        self.register_buffer("causal_mask", causal.astype("bool"), persistable=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(3, axis=2)
        hs = C // self.n_head
        k = k.reshape([B, T, self.n_head, hs]).transpose([0, 2, 1, 3])
        q = q.reshape([B, T, self.n_head, hs]).transpose([0, 2, 1, 3])
        v = v.reshape([B, T, self.n_head, hs]).transpose([0, 2, 1, 3])
        att = paddle.matmul(q, k, transpose_y=True) * (1.0 / math.sqrt(hs))
        mask = self.causal_mask[:T, :T]
        att = paddle.where(mask, paddle.full_like(att, float("-inf")), att)
        att = F.softmax(att, axis=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose([0, 2, 1, 3]).reshape([B, T, C])
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Layer):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias_attr=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias_attr=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=True)))


class Block(nn.Layer):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Layer):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.LayerList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)

    def forward(self, idx, targets=None):
        b, t = idx.shape
        pos = paddle.arange(0, t, dtype="int64")
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = paddle.matmul(x, self.wte.weight, transpose_y=True)  # tied output head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), targets.reshape([-1]))
        return logits, loss


def configure_optimizer(model, tcfg, scheduler):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 else no_decay).append(p)
    print(f"decayed tensors: {len(decay)}, non-decayed tensors: {len(no_decay)}")
    no_decay_names = {p.name for p in no_decay}
    return paddle.optimizer.AdamW(
        learning_rate=scheduler,
        parameters=model.parameters(),
        beta1=0.9,
        beta2=0.95,
        weight_decay=tcfg.weight_decay,
        apply_decay_param_fun=lambda n: n not in no_decay_names,
        grad_clip=nn.ClipGradByGlobalNorm(tcfg.grad_clip),
    )


if __name__ == "__main__":
    paddle.seed(1337)
    cfg, tcfg = GPTConfig(), TrainConfig()
    model = GPT(cfg)
    n_params = sum(p.numel().item() for p in model.parameters())
    print(f"number of parameters: {n_params / 1e6:.2f}M")

    cosine = paddle.optimizer.lr.CosineAnnealingDecay(learning_rate=tcfg.learning_rate,
                                                      T_max=tcfg.max_steps - tcfg.warmup_steps,
                                                      eta_min=tcfg.min_lr)
    scheduler = paddle.optimizer.lr.LinearWarmup(cosine, warmup_steps=tcfg.warmup_steps, start_lr=0.0,
                                                 end_lr=tcfg.learning_rate)
    optimizer = configure_optimizer(model, tcfg, scheduler)
    loader = DataLoader(RandomTokens(tcfg.batch_size * tcfg.max_steps, cfg.block_size, cfg.vocab_size),
                        batch_size=tcfg.batch_size, shuffle=True, drop_last=True)

    model.train()
    for it, (x, y) in enumerate(loader):
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        scheduler.step()
        print(f"iter {it}: loss {loss.item():.4f}, lr {scheduler.get_lr():.2e}")
