"""Siamese network for one-shot character verification (Omniglot-style 105x105 grayscale pairs).

forward takes two images; one shared tower embeds both; contrastive loss on the Euclidean distance.
"""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset


class PairDataset(Dataset):
    def __init__(self, n_pairs=32, size=105):
        self.n, self.size = n_pairs, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        a = (np.random.rand(1, self.size, self.size) > 0.8).astype("float32")
        same = i % 2
        b = a.copy() if same else (np.random.rand(1, self.size, self.size) > 0.8).astype("float32")
        return a, b, np.array([same], dtype="float32")


class SiameseNet(nn.Layer):
    def __init__(self, embed_dim=256):
        super().__init__()
        self.tower = nn.Sequential(
            nn.Conv2D(1, 64, 10), nn.ReLU(), nn.MaxPool2D(2),       # 96 -> 48
            nn.Conv2D(64, 128, 7), nn.ReLU(), nn.MaxPool2D(2),      # 42 -> 21
            nn.Conv2D(128, 128, 4), nn.ReLU(), nn.MaxPool2D(2),     # 18 -> 9
            nn.Conv2D(128, 256, 4), nn.ReLU(),                      # 6
            nn.Flatten(),
            nn.Linear(256 * 6 * 6, 1024), nn.Sigmoid(),
            nn.Linear(1024, embed_dim),
        )

    def embed(self, x):
        return F.normalize(self.tower(x), axis=1)

    def forward(self, left, right):
        return self.embed(left), self.embed(right)


def contrastive_loss(e1, e2, same, margin=1.0):
    d = paddle.norm(e1 - e2, p=2, axis=1, keepdim=True)
    return paddle.mean(same * d.pow(2) + (1 - same) * F.relu(margin - d).pow(2))


def main():
    net = SiameseNet()
    opt = paddle.optimizer.Adam(learning_rate=6e-5, parameters=net.parameters())
    loader = DataLoader(PairDataset(), batch_size=8, shuffle=True)
    for epoch in range(2):
        for i, (x1, x2, same) in enumerate(loader):
            e1, e2 = net(x1, x2)
            loss = contrastive_loss(e1, e2, same)
            loss.backward()
            opt.step()
            opt.clear_grad()
        print("epoch", epoch, "loss", loss.item())


if __name__ == "__main__":
    main()
