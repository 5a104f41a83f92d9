"""paddle.nn.Transformer translation model: source and target ids plus a causal mask (several forward inputs)."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

SRC_VOCAB = TGT_VOCAB = 8000
D, HEADS, LAYERS, SRC_LEN, TGT_LEN, BATCH = 256, 8, 3, 64, 64, 16


class Translator(nn.Layer):
    def __init__(self):
        super().__init__()
        self.src_emb = nn.Embedding(SRC_VOCAB, D)
        self.tgt_emb = nn.Embedding(TGT_VOCAB, D)
        self.pos = nn.Embedding(512, D)
        self.core = nn.Transformer(D, HEADS, LAYERS, LAYERS, 4 * D, dropout=0.1)
        self.out = nn.Linear(D, TGT_VOCAB)

    def forward(self, src, tgt, tgt_mask):
        ps = self.pos(paddle.arange(src.shape[1]).unsqueeze(0))
        pt = self.pos(paddle.arange(tgt.shape[1]).unsqueeze(0))
        h = self.core(self.src_emb(src) + ps, self.tgt_emb(tgt) + pt, tgt_mask=tgt_mask)
        return self.out(h)


def main():
    model = Translator()
    opt = paddle.optimizer.Adam(learning_rate=1e-4, parameters=model.parameters())
    mask = model.core.generate_square_subsequent_mask(TGT_LEN)
    for step in range(3):
        src = paddle.randint(1, SRC_VOCAB, [BATCH, SRC_LEN])
        tgt = paddle.randint(1, TGT_VOCAB, [BATCH, TGT_LEN + 1])
        logits = model(src, tgt[:, :-1], mask)
        loss = F.cross_entropy(logits.reshape([-1, TGT_VOCAB]), tgt[:, 1:].reshape([-1, 1]))
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
