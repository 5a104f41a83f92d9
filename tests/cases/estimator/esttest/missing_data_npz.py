"""Reads its training set from an .npz on the cluster's data volume (absent on a laptop)."""
import argparse
import os

import numpy as np
import paddle
import paddle.nn as nn
from paddle.io import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--data-dir", default="/mnt/datasets/satellite_tiles")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()


class Tiles(Dataset):
    def __init__(self, path):
        d = np.load(path)
        self.x, self.y = d["images"], d["labels"]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i].astype("float32") / 255.0, self.y[i].astype("int64")


ds = Tiles(os.path.join(args.data_dir, "train.npz"))
loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, drop_last=True)
model = nn.Sequential(
    nn.Conv2D(4, 32, 5, stride=2, padding=2), nn.BatchNorm2D(32), nn.ReLU(),
    nn.Conv2D(32, 64, 3, stride=2, padding=1), nn.BatchNorm2D(64), nn.ReLU(),
    nn.Conv2D(64, 128, 3, stride=2, padding=1), nn.BatchNorm2D(128), nn.ReLU(),
    nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(128, 9))
opt = paddle.optimizer.Adam(parameters=model.parameters(), learning_rate=1e-3)
for i, (x, y) in enumerate(loader):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.clear_grad()
    if i + 1 == args.steps:
        break
print("trained")
