"""EfficientNet-lite-style classifier (MBConv blocks with squeeze-and-excitation) configured from a YAML file.

The recipe (configs/effnet_lite.yaml beside this script) sets the image size (128x192, not square), the DataLoader's
num_workers (2, worker processes decode the samples), the widths and the optimizer: AdamW with cosine warm restarts.
"""
import argparse
import os

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import yaml
from paddle.io import DataLoader, Dataset

HERE = os.path.dirname(os.path.abspath(__file__))


class DogBreeds(Dataset):
    def __init__(self, image_size, num_classes, num_samples):
        self.h, self.w = image_size
        self.num_classes, self.num_samples = num_classes, num_samples

    def __len__(self):
        return self.num_samples

    def __getitem__(self, idx):
        rng = np.random.default_rng(idx)
        img = rng.standard_normal((3, self.h, self.w), dtype=np.float32)
        return img, np.int64(rng.integers(self.num_classes))


class SqueezeExcite(nn.Layer):
    def __init__(self, c, reduced):
        super().__init__()
        self.reduce = nn.Conv2D(c, reduced, 1)
        self.expand = nn.Conv2D(reduced, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.sigmoid(self.expand(F.silu(self.reduce(s))))
        return x * s


class MBConv(nn.Layer):
    def __init__(self, cin, cout, stride, expand, se_ratio):
        super().__init__()
        mid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.expand = nn.Sequential(nn.Conv2D(cin, mid, 1, bias_attr=False), nn.BatchNorm2D(mid), nn.Silu())
        self.dw = nn.Sequential(nn.Conv2D(mid, mid, 3, stride, 1, groups=mid, bias_attr=False),
                                nn.BatchNorm2D(mid), nn.Silu())
        self.se = SqueezeExcite(mid, max(1, int(cin * se_ratio)))
        self.project = nn.Sequential(nn.Conv2D(mid, cout, 1, bias_attr=False), nn.BatchNorm2D(cout))

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.use_res else y


class EffNetLite(nn.Layer):
    def __init__(self, mcfg, num_classes):
        super().__init__()
        w = mcfg["width"]
        self.stem = nn.Sequential(nn.Conv2D(3, 32, 3, 2, 1, bias_attr=False), nn.BatchNorm2D(32), nn.Silu())
        blocks, cin = [], 32
        for i, cout in enumerate(w):
            blocks.append(MBConv(cin, cout, 2 if i > 0 else 1, mcfg["expand_ratio"], mcfg["se_ratio"]))
            blocks.append(MBConv(cout, cout, 1, mcfg["expand_ratio"], mcfg["se_ratio"]))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Conv2D(cin, 1280, 1, bias_attr=False), nn.BatchNorm2D(1280), nn.Silu())
        self.dropout = nn.Dropout(mcfg["dropout"])
        self.fc = nn.Linear(1280, num_classes)

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(self.dropout(x))


def build_optimizer(ocfg, params):
    sched = paddle.optimizer.lr.CosineAnnealingWarmRestarts(learning_rate=ocfg["lr"], T_0=ocfg["warm_restart_t0"])
    opt_cls = getattr(paddle.optimizer, ocfg["name"])
    return opt_cls(learning_rate=sched, parameters=params, weight_decay=ocfg["weight_decay"]), sched


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(HERE, "configs", "effnet_lite.yaml"))
    args = ap.parse_args()
    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    d = cfg["data"]
    model = EffNetLite(cfg["model"], d["num_classes"])
    optimizer, sched = build_optimizer(cfg["optim"], model.parameters())
    loader = DataLoader(DogBreeds(d["image_size"], d["num_classes"], d["num_samples"]), batch_size=d["batch_size"],
                        shuffle=d["shuffle"], num_workers=d["num_workers"], drop_last=True)
    for epoch in range(cfg["train"]["epochs"]):
        model.train()
        for it, (img, label) in enumerate(loader):
            loss = F.cross_entropy(model(img), label, label_smoothing=0.1)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            sched.step()
            print(f"epoch {epoch} iter {it} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
