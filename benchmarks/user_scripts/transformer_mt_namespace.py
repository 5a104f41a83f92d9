"""Neural machine translation with paddle.nn.Transformer (encoder-decoder), settings in a SimpleNamespace.

forward(src, tgt_in) builds the padding and causal masks itself; label-smoothed cross entropy that ignores
padding; Adam with the Noam warm-up schedule of "Attention Is All You Need".
"""
import types

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset

cfg = types.SimpleNamespace(
    src_vocab=10000, tgt_vocab=10000, d_model=512, nhead=8, num_encoder_layers=3, num_decoder_layers=3,
    dim_feedforward=2048, dropout=0.1, max_len=256, pad_id=0, bos_id=1, eos_id=2,
    batch_size=16, src_len=48, tgt_len=52, warmup=4000, label_smoothing=0.1, steps=6,
)


class ParallelCorpus(Dataset):
    def __len__(self):
        return cfg.batch_size * cfg.steps

    def __getitem__(self, i):
        src = np.full(cfg.src_len, cfg.pad_id, dtype="int64")
        tgt = np.full(cfg.tgt_len + 1, cfg.pad_id, dtype="int64")
        n = np.random.randint(cfg.src_len // 2, cfg.src_len + 1)
        m = np.random.randint(cfg.tgt_len // 2, cfg.tgt_len)
        src[:n] = np.random.randint(3, cfg.src_vocab, n)
        tgt[0] = cfg.bos_id
        tgt[1:m] = np.random.randint(3, cfg.tgt_vocab, m - 1)
        tgt[m] = cfg.eos_id
        return src, tgt


class PositionalEncoding(nn.Layer):
    def __init__(self, d_model, max_len):
        super().__init__()
        pos = np.arange(max_len)[:, None]
        div = np.exp(np.arange(0, d_model, 2) * (-np.log(10000.0) / d_model))
        pe = np.zeros((max_len, d_model), dtype="float32")
        pe[:, 0::2] = np.sin(pos * div)
        pe[:, 1::2] = np.cos(pos * div)
        self.register_buffer("pe", paddle.to_tensor(pe[None]))

    def forward(self, x):
        return x + self.pe[:, : x.shape[1]]


class Seq2SeqTransformer(nn.Layer):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.src_emb = nn.Embedding(c.src_vocab, c.d_model, padding_idx=c.pad_id)
        self.tgt_emb = nn.Embedding(c.tgt_vocab, c.d_model, padding_idx=c.pad_id)
        self.pos = PositionalEncoding(c.d_model, c.max_len)
        self.drop = nn.Dropout(c.dropout)
        self.transformer = nn.Transformer(d_model=c.d_model, nhead=c.nhead,
                                          num_encoder_layers=c.num_encoder_layers,
                                          num_decoder_layers=c.num_decoder_layers,
                                          dim_feedforward=c.dim_feedforward, dropout=c.dropout)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab)

    def forward(self, src, tgt_in):
        scale = self.c.d_model ** 0.5
        src_pad = (src == self.c.pad_id).astype("float32")[:, None, None, :] * -1e9
        causal = self.transformer.generate_square_subsequent_mask(tgt_in.shape[1])
        s = self.drop(self.pos(self.src_emb(src) * scale))
        t = self.drop(self.pos(self.tgt_emb(tgt_in) * scale))
        out = self.transformer(s, t, src_mask=src_pad, tgt_mask=causal, memory_mask=src_pad)
        return self.generator(out)


def smoothed_loss(logits, target):
    v = logits.shape[-1]
    soft = F.label_smooth(F.one_hot(target, v), epsilon=cfg.label_smoothing)
    loss = F.cross_entropy(logits, soft, soft_label=True, reduction="none").squeeze(-1)
    keep = (target != cfg.pad_id).astype(loss.dtype)
    return (loss * keep).sum() / keep.sum()


if __name__ == "__main__":
    model = Seq2SeqTransformer(cfg)
    sched = paddle.optimizer.lr.NoamDecay(d_model=cfg.d_model, warmup_steps=cfg.warmup, learning_rate=2.0)
    opt = paddle.optimizer.Adam(learning_rate=sched, beta1=0.9, beta2=0.98, epsilon=1e-9,
                                parameters=model.parameters())
    loader = DataLoader(ParallelCorpus(), batch_size=cfg.batch_size, shuffle=True)
    model.train()
    for step, (src, tgt) in enumerate(loader):
        tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
        logits = model(src, tgt_in)
        loss = smoothed_loss(logits, tgt_out)
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        print(f"step {step} loss {loss.item():.3f} lr {sched.get_lr():.2e}")
