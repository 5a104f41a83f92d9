"""1-D conv classifier on sensor windows; DistributedBatchSampler; sys.exit right after training."""
import sys

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, DistributedBatchSampler, Dataset
MEAN_STD = np.load("/mnt/datasets/norm_stats.npy")  # normalisation stats from the data volume

CHANNELS, LENGTH, CLASSES = 12, 2048, 6


class Windows(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        return np.random.randn(CHANNELS, LENGTH).astype("float32"), np.int64(i % CLASSES)


class TCN(nn.Layer):
    def __init__(self):
        super().__init__()
        layers, ch = [], CHANNELS
        for dil, out in [(1, 64), (2, 64), (4, 128), (8, 128)]:
            layers += [nn.Conv1D(ch, out, 3, padding=dil, dilation=dil), nn.BatchNorm1D(out), nn.GELU()]
            ch = out
        self.net = nn.Sequential(*layers)
        self.fc = nn.Linear(ch, CLASSES)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool1d(self.net(x), 1).squeeze(-1))


def main():
    ds = Windows()
    sampler = DistributedBatchSampler(ds, batch_size=32, shuffle=True, drop_last=True)
    loader = DataLoader(ds, batch_sampler=sampler)
    model = TCN()
    opt = paddle.optimizer.RMSProp(learning_rate=1e-3, parameters=model.parameters())
    for epoch in range(1):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            if i == 5:
                break
    print("finished")
    sys.exit(0)


if __name__ == "__main__":
    main()
    print("never reached")
