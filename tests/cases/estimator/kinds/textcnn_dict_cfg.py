"""TextCNN (Kim 2014) with its settings in a dict; functional ops (F.adaptive_max_pool1d, concat) and a Dataset."""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

CONFIG = {
    "model": {"vocab": 30000, "embed": 300, "filters": 128, "kernels": [3, 4, 5], "classes": 5, "dropout": 0.5},
    "train": {"batch_size": 64, "max_len": 256, "lr": 1e-3},
}


class Reviews(paddle.io.Dataset):
    def __init__(self, cfg, n=1024):
        self.cfg, self.n = cfg, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = np.random.randint(1, self.cfg["model"]["vocab"], (self.cfg["train"]["max_len"],)).astype("int64")
        return ids, np.array([i % self.cfg["model"]["classes"]], dtype="int64")


class TextCNN(nn.Layer):
    def __init__(self, vocab, embed, filters, kernels, classes, dropout):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.convs = nn.LayerList([nn.Conv1D(embed, filters, k) for k in kernels])
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(filters * len(kernels), classes)

    def forward(self, ids):
        x = self.embed(ids).transpose([0, 2, 1])
        pooled = [F.adaptive_max_pool1d(F.relu(conv(x)), 1).squeeze(-1) for conv in self.convs]
        return self.fc(self.drop(paddle.concat(pooled, axis=1)))


def run(cfg):
    model = TextCNN(**cfg["model"])
    opt = paddle.optimizer.Adam(learning_rate=cfg["train"]["lr"], parameters=model.parameters())
    loader = paddle.io.DataLoader(Reviews(cfg), batch_size=cfg["train"]["batch_size"], shuffle=True)
    for ids, label in loader:
        loss = F.cross_entropy(model(ids), label)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    run(CONFIG)
