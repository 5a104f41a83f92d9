"""Transformer encoder text classifier (benchmark model; --seq-len sets the sequence length)."""
import argparse

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=128)
parser.add_argument("--vocab-size", type=int, default=8000)
parser.add_argument("--d-model", type=int, default=256)
parser.add_argument("--layers", type=int, default=4)


class TextClassifier(nn.Layer):
    def __init__(self, vocab_size, d_model, nhead, num_layers, num_classes, max_len=2048):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model, dropout=0.1)
        self.encoder = nn.TransformerEncoder(layer, num_layers)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, ids):
        pos = paddle.arange(ids.shape[1]).unsqueeze(0)
        x = self.embed(ids) + self.pos(pos)
        x = self.encoder(x)
        x = self.norm(x.mean(axis=1))
        return self.head(x)


def main():
    args = parser.parse_args()
    model = TextClassifier(args.vocab_size, args.d_model, 4, args.layers, num_classes=2)
    opt = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters())
    for _ in range(3):
        ids = paddle.randint(0, args.vocab_size, [args.batch_size, args.seq_len])
        y = paddle.randint(0, 2, [args.batch_size, 1])
        loss = F.cross_entropy(model(ids), y)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
