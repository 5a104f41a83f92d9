"""paddle.nn.TransformerEncoder classifier with gradient accumulation (4 micro-batches of 8 per optimizer step)."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

VOCAB, D_MODEL, HEADS, LAYERS, SEQ = 16000, 256, 4, 4, 128
MICRO_BATCH, ACCUM = 8, 4


class Encoder(nn.Layer):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.1)
        self.encoder = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(D_MODEL, 3)

    def forward(self, ids):
        pos = paddle.arange(ids.shape[1]).unsqueeze(0)
        h = self.encoder(self.tok(ids) + self.pos(pos))
        return self.head(h.mean(axis=1))


model = Encoder()
opt = paddle.optimizer.AdamW(learning_rate=3e-4, parameters=model.parameters(), weight_decay=0.01)

if __name__ == "__main__":
    for step in range(4 * ACCUM):
        ids = paddle.randint(0, VOCAB, [MICRO_BATCH, SEQ])
        y = paddle.randint(0, 3, [MICRO_BATCH, 1])
        loss = F.cross_entropy(model(ids), y) / ACCUM
        loss.backward()
        if (step + 1) % ACCUM == 0:
            opt.step()
            opt.clear_grad()
