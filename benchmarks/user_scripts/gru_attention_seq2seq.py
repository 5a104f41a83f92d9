"""Summarisation-style seq2seq: bidirectional GRU encoder, GRUCell decoder with additive (Bahdanau) attention,
unrolled step by step in Python with teacher forcing.

forward(src, src_len, tgt_in) has three inputs; source padding is masked out of the attention with
paddle.where; attention weights are applied with paddle.bmm.  Adam with global-norm clipping.
"""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset

SRC_VOCAB, TGT_VOCAB = 12000, 8000
EMB, HID = 256, 256
SRC_LEN, TGT_LEN = 60, 20
BATCH = 24


class Articles(Dataset):
    def __len__(self):
        return BATCH * 5

    def __getitem__(self, i):
        n = np.random.randint(SRC_LEN // 2, SRC_LEN + 1)
        src = np.zeros(SRC_LEN, "int64")
        src[:n] = np.random.randint(1, SRC_VOCAB, n)
        tgt = np.random.randint(1, TGT_VOCAB, TGT_LEN + 1).astype("int64")
        return src, np.int64(n), tgt


class Encoder(nn.Layer):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(SRC_VOCAB, EMB, padding_idx=0)
        self.rnn = nn.GRU(EMB, HID, num_layers=2, direction="bidirect", dropout=0.1)
        self.bridge = nn.Linear(2 * HID, HID)

    def forward(self, src, src_len):
        out, h = self.rnn(self.emb(src), sequence_length=src_len)          # out [B, S, 2H], h [4, B, H]
        h0 = paddle.tanh(self.bridge(paddle.concat([h[-2], h[-1]], axis=-1)))
        return out, h0


class AdditiveAttention(nn.Layer):
    def __init__(self):
        super().__init__()
        self.w_enc = nn.Linear(2 * HID, HID, bias_attr=False)
        self.w_dec = nn.Linear(HID, HID)
        self.v = nn.Linear(HID, 1, bias_attr=False)

    def forward(self, dec_h, enc_proj, enc_out, src_mask):
        score = self.v(paddle.tanh(enc_proj + self.w_dec(dec_h).unsqueeze(1))).squeeze(-1)   # [B, S]
        score = paddle.where(src_mask, score, paddle.full_like(score, -1e9))
        alpha = F.softmax(score, axis=-1)
        ctx = paddle.bmm(alpha.unsqueeze(1), enc_out).squeeze(1)                            # [B, 2H]
        return ctx, alpha


class Decoder(nn.Layer):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(TGT_VOCAB, EMB)
        self.attn = AdditiveAttention()
        self.cell = nn.GRUCell(EMB + 2 * HID, HID)
        self.out = nn.Linear(HID + 2 * HID + EMB, TGT_VOCAB)

    def forward(self, tgt_in, h, enc_out, src_mask):
        enc_proj = self.attn.w_enc(enc_out)
        emb = self.emb(tgt_in)
        logits = []
        for t in range(tgt_in.shape[1]):
            ctx, _ = self.attn(h, enc_proj, enc_out, src_mask)
            x = paddle.concat([emb[:, t], ctx], axis=-1)
            _, h = self.cell(x, h)
            logits.append(self.out(paddle.concat([h, ctx, emb[:, t]], axis=-1)))
        return paddle.stack(logits, axis=1)


class Seq2Seq(nn.Layer):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.decoder = Decoder()

    def forward(self, src, src_len, tgt_in):
        enc_out, h = self.encoder(src, src_len)
        src_mask = paddle.arange(src.shape[1]).unsqueeze(0) < src_len.unsqueeze(1)
        return self.decoder(tgt_in, h, enc_out, src_mask)


if __name__ == "__main__":
    model = Seq2Seq()
    optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters(),
                                      grad_clip=nn.ClipGradByGlobalNorm(2.0))
    loader = DataLoader(Articles(), batch_size=BATCH, shuffle=True)
    for epoch in range(1):
        for step, (src, src_len, tgt) in enumerate(loader):
            logits = model(src, src_len, tgt[:, :-1])
            loss = F.cross_entropy(logits.reshape([-1, TGT_VOCAB]), tgt[:, 1:].reshape([-1, 1]))
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            print(f"step {step} loss {loss.item():.3f}")
