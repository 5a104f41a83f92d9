# MLP-Mixer (Tolstikhin et al. 2021, a small "S/16"-like variant at 128x128) whose forward is compiled with
# paddle.jit.to_static and trained in dynamic-to-static mode: the loop is eager, the model runs as a static program.
import os

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

IMG, PATCH, DIM, DEPTH, TOKEN_MLP, CHANNEL_MLP, CLASSES = 128, 16, 384, 8, 192, 1536, 100
BATCH = int(os.getenv("BATCH", 32))
STEPS = 5


class MixerBlock(nn.Layer):
    def __init__(self, tokens):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, TOKEN_MLP), nn.GELU(), nn.Linear(TOKEN_MLP, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(DIM, CHANNEL_MLP), nn.GELU(), nn.Linear(CHANNEL_MLP, DIM))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose([0, 2, 1])).transpose([0, 2, 1])
        return x + self.channel_mlp(self.norm2(x))


class MlpMixer(nn.Layer):
    def __init__(self):
        super().__init__()
        tokens = (IMG // PATCH) ** 2
        self.stem = nn.Conv2D(3, DIM, PATCH, PATCH)
        self.blocks = nn.Sequential(*[MixerBlock(tokens) for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    @paddle.jit.to_static(full_graph=True)
    def forward(self, x):
        x = self.stem(x).flatten(2).transpose([0, 2, 1])
        return self.head(self.norm(self.blocks(x)).mean(1))


class RandomImages(paddle.io.Dataset):
    def __init__(self, n):
        self.rng = np.random.default_rng(0)
        self.x = self.rng.standard_normal((n, 3, IMG, IMG)).astype("float32")
        self.y = self.rng.integers(0, CLASSES, n)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], np.int64(self.y[i])


if __name__ == "__main__":
    paddle.seed(0)
    model = MlpMixer()
    loader = paddle.io.DataLoader(RandomImages(BATCH * STEPS), batch_size=BATCH, shuffle=True, drop_last=True)
    opt = paddle.optimizer.AdamW(paddle.optimizer.lr.CosineAnnealingDecay(1e-3, STEPS), parameters=model.parameters(),
                                 weight_decay=0.05)
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.clear_grad()
        opt._learning_rate.step()
        print(f"step {step} loss {float(loss):.4f}")
