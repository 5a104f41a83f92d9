"""Keyword spotting on raw 1-second 16 kHz waveforms with a 1-D CNN; all settings in a plain dict.

Uses functional ops: F.pad (reflect padding of the waveform), paddle.split into two branches of different
receptive fields merged by paddle.concat, F.adaptive_max_pool1d and F.adaptive_avg_pool1d for the global pool.
SGD with a multi-step schedule.
"""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset

CONFIG = {
    "data": {"sample_rate": 16000, "clip_seconds": 1.0, "num_classes": 35},
    "model": {"channels": [64, 128, 128, 256, 256], "first_kernel": 80, "first_stride": 4, "dropout": 0.2},
    "train": {"batch_size": 32, "lr": 0.1, "milestones": [2, 4], "gamma": 0.1, "epochs": 1, "steps": 5},
}


class SpeechCommands(Dataset):
    def __init__(self, cfg, n):
        self.len = int(cfg["sample_rate"] * cfg["clip_seconds"])
        self.num_classes = cfg["num_classes"]
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        wav = (0.1 * np.random.randn(1, self.len)).astype("float32")
        return wav, np.array(i % self.num_classes, dtype="int64")


class ConvBlock(nn.Layer):
    def __init__(self, cin, cout):
        super().__init__()
        half = cout // 2
        self.narrow = nn.Conv1D(cin, half, 3, padding=1, bias_attr=False)
        self.wide = nn.Conv1D(cin, cout - half, 9, padding=4, bias_attr=False)
        self.bn = nn.BatchNorm1D(cout)
        self.pool = nn.MaxPool1D(4)

    def forward(self, x):
        a, b = paddle.split(x, 2, axis=1) if x.shape[1] % 2 == 0 else (x, x)
        y = paddle.concat([self.narrow(paddle.concat([b, a], axis=1)), self.wide(x)], axis=1)
        return self.pool(F.relu(self.bn(y)))


class M5(nn.Layer):
    def __init__(self, model_cfg, num_classes):
        super().__init__()
        ch = model_cfg["channels"]
        self.k0 = model_cfg["first_kernel"]
        self.stem = nn.Conv1D(1, ch[0], self.k0, stride=model_cfg["first_stride"])
        self.stem_bn = nn.BatchNorm1D(ch[0])
        self.blocks = nn.LayerList([ConvBlock(ch[i], ch[i + 1]) for i in range(len(ch) - 1)])
        self.dropout = nn.Dropout(model_cfg["dropout"])
        self.fc = nn.Linear(2 * ch[-1], num_classes)

    def forward(self, wav):
        # reflect-pad half a kernel on each side so the first frame is centred
        x = F.pad(wav, [self.k0 // 2, self.k0 // 2], mode="reflect", data_format="NCL")
        x = F.relu(self.stem_bn(self.stem(x)))
        x = F.max_pool1d(x, 4)
        for blk in self.blocks:
            x = blk(x)
        g = paddle.concat([F.adaptive_max_pool1d(x, 1), F.adaptive_avg_pool1d(x, 1)], axis=1)
        return self.fc(self.dropout(g.squeeze(-1)))


def run(config):
    tc = config["train"]
    model = M5(config["model"], config["data"]["num_classes"])
    sched = paddle.optimizer.lr.MultiStepDecay(learning_rate=tc["lr"], milestones=tc["milestones"],
                                               gamma=tc["gamma"])
    opt = paddle.optimizer.SGD(learning_rate=sched, parameters=model.parameters(), weight_decay=1e-4)
    loader = DataLoader(SpeechCommands(config["data"], tc["batch_size"] * tc["steps"]),
                        batch_size=tc["batch_size"], shuffle=True)
    for epoch in range(tc["epochs"]):
        for step, (wav, label) in enumerate(loader):
            logits = model(wav)
            loss = F.cross_entropy(logits, label)
            loss.backward()
            opt.step()
            opt.clear_grad()
            sched.step()
            print(f"epoch {epoch} step {step}: loss={loss.numpy().item():.3f}")


if __name__ == "__main__":
    run(CONFIG)
