"""Small BERT-like encoder, input embedding tied to the MLM output; two heads, two losses summed."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import numpy as np
MEAN_STD = np.load("/mnt/datasets/norm_stats.npy")  # normalisation stats from the data volume

VOCAB, SEQ, D, BATCH = 16000, 128, 256, 16


class Encoder(nn.Layer):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = self.create_parameter([SEQ, D], default_initializer=nn.initializer.Normal(std=0.02))
        self.layers = nn.LayerList([nn.TransformerEncoderLayer(D, 4, 1024, dropout=0.1, normalize_before=True)
                                    for _ in range(4)])
        self.norm = nn.LayerNorm(D)
        self.mlm_transform = nn.Linear(D, D)
        self.mlm_bias = self.create_parameter([VOCAB], is_bias=True)
        self.nsp = nn.Linear(D, 2)

    def forward(self, ids):
        h = self.tok(ids) + self.pos
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h)
        t = F.gelu(self.mlm_transform(h))
        mlm_logits = paddle.matmul(t, self.tok.weight, transpose_y=True) + self.mlm_bias  # tied weights
        return mlm_logits, self.nsp(h[:, 0])


model = Encoder()
opt = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters(), weight_decay=0.01)
for step in range(5):
    ids = paddle.randint(1, VOCAB, [BATCH, SEQ])
    mlm_labels = paddle.where(paddle.rand([BATCH, SEQ]) < 0.15, ids, paddle.full_like(ids, -100))
    nsp_labels = paddle.randint(0, 2, [BATCH])
    mlm_logits, nsp_logits = model(ids)
    mlm_loss = F.cross_entropy(mlm_logits.reshape([-1, VOCAB]), mlm_labels.reshape([-1]), ignore_index=-100)
    nsp_loss = F.cross_entropy(nsp_logits, nsp_labels)
    loss = mlm_loss + 0.5 * nsp_loss
    loss.backward()
    opt.step()
    opt.clear_grad()
    print(step, float(mlm_loss), float(nsp_loss))
