"""Tabular MLP whose settings live in a dataclass, overridden by a JSON file next to the script (workers, batch)."""
import json
import os
from dataclasses import dataclass, field

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset


@dataclass
class TrainConfig:
    in_features: int = 256
    hidden: list = field(default_factory=lambda: [1024, 1024, 512])
    num_classes: int = 20
    batch_size: int = 128
    num_workers: int = 0
    lr: float = 1e-3
    epochs: int = 1

    @classmethod
    def load(cls, path):
        cfg = cls()
        if os.path.exists(path):
            for k, v in json.load(open(path)).items():
                setattr(cfg, k, v)
        return cfg


class Table(Dataset):
    def __init__(self, n, d, k):
        self.x = np.random.rand(n, d).astype("float32")
        self.y = np.random.randint(0, k, (n, 1)).astype("int64")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def mlp(cfg):
    layers, d = [], cfg.in_features
    for h in cfg.hidden:
        layers += [nn.Linear(d, h), nn.BatchNorm1D(h), nn.ReLU(), nn.Dropout(0.1)]
        d = h
    layers.append(nn.Linear(d, cfg.num_classes))
    return nn.Sequential(*layers)


def main():
    cfg = TrainConfig.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp_config.json"))
    model = mlp(cfg)
    opt = paddle.optimizer.AdamW(learning_rate=cfg.lr, parameters=model.parameters())
    loader = DataLoader(Table(4096, cfg.in_features, cfg.num_classes), batch_size=cfg.batch_size, shuffle=True,
                        num_workers=cfg.num_workers, drop_last=True)
    for epoch in range(cfg.epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()


if __name__ == "__main__":
    main()
