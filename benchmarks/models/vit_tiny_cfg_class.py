"""A tiny ViT (patch 8 on 64x64) written by hand, config as class attributes, model built at module level,
with a validation pass under no_grad after each epoch."""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


class Cfg:
    img, patch, dim, depth, heads, mlp_ratio, classes = 64, 8, 192, 6, 3, 4, 100
    batch_size, val_batch_size, epochs = 32, 64, 1


class Attention(nn.Layer):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape([b, n, 3, self.heads, c // self.heads]).transpose([2, 0, 3, 1, 4])
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = F.softmax(paddle.matmul(q, k, transpose_y=True) * self.scale, axis=-1)
        out = paddle.matmul(attn, v).transpose([0, 2, 1, 3]).reshape([b, n, c])
        return self.proj(out)


class Block(nn.Layer):
    def __init__(self, dim, heads, ratio):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * ratio), nn.GELU(), nn.Linear(dim * ratio, dim))

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class ViT(nn.Layer):
    def __init__(self, c=Cfg):
        super().__init__()
        self.embed = nn.Conv2D(3, c.dim, c.patch, stride=c.patch)
        n = (c.img // c.patch) ** 2
        self.cls = self.create_parameter([1, 1, c.dim], default_initializer=nn.initializer.Constant(0.0))
        self.pos = self.create_parameter([1, n + 1, c.dim], default_initializer=nn.initializer.Normal(std=0.02))
        self.blocks = nn.LayerList([Block(c.dim, c.heads, c.mlp_ratio) for _ in range(c.depth)])
        self.norm = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose([0, 2, 1])
        x = paddle.concat([self.cls.expand([x.shape[0], -1, -1]), x], axis=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class Images(paddle.io.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.random.rand(3, Cfg.img, Cfg.img).astype("float32"), np.array([i % Cfg.classes], dtype="int64")


model = ViT()
optimizer = paddle.optimizer.AdamW(learning_rate=5e-4, parameters=model.parameters(), weight_decay=0.05)
train_loader = paddle.io.DataLoader(Images(1024), batch_size=Cfg.batch_size, shuffle=True, drop_last=True)
val_loader = paddle.io.DataLoader(Images(256), batch_size=Cfg.val_batch_size)

if __name__ == "__main__":
    for epoch in range(Cfg.epochs):
        model.train()
        for x, y in train_loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
        model.eval()
        correct = 0
        with paddle.no_grad():
            for x, y in val_loader:
                correct += int((model(x).argmax(axis=1) == y.squeeze(1)).sum())
        print("epoch", epoch, "val acc", correct / 256)
