"""A GPT-style decoder-only language model with causal self-attention (benchmark model)."""
import math

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

BATCH_SIZE = 8
BLOCK_SIZE = 256
VOCAB_SIZE = 8192
N_EMBD = 256
N_HEAD = 4
N_LAYER = 4


class CausalSelfAttention(nn.Layer):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.attn_drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = paddle.split(self.qkv(x), 3, axis=-1)
        q = q.reshape([b, t, self.n_head, c // self.n_head]).transpose([0, 2, 1, 3])
        k = k.reshape([b, t, self.n_head, c // self.n_head]).transpose([0, 2, 1, 3])
        v = v.reshape([b, t, self.n_head, c // self.n_head]).transpose([0, 2, 1, 3])
        att = paddle.matmul(q, k, transpose_y=True) / math.sqrt(c // self.n_head)
        mask = paddle.triu(paddle.full([t, t], float("-inf")), diagonal=1)
        att = F.softmax(att + mask, axis=-1)
        att = self.attn_drop(att)
        y = paddle.matmul(att, v).transpose([0, 2, 1, 3]).reshape([b, t, c])
        return self.proj(y)


class Block(nn.Layer):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(0.1))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Layer):
    def __init__(self, vocab_size=VOCAB_SIZE, block_size=BLOCK_SIZE, n_embd=N_EMBD, n_head=N_HEAD, n_layer=N_LAYER):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.LayerList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias_attr=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(paddle.arange(t))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def main():
    model = GPT()
    opt = paddle.optimizer.AdamW(learning_rate=3e-4, parameters=model.parameters())
    for _ in range(3):
        idx = paddle.randint(0, VOCAB_SIZE, [BATCH_SIZE, BLOCK_SIZE])
        tgt = paddle.randint(0, VOCAB_SIZE, [BATCH_SIZE, BLOCK_SIZE, 1])
        loss = F.cross_entropy(model(idx), tgt)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
