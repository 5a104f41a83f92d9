"""Vision Transformer trained on wide 96x160 frames (e.g. dash-cam crops), configured with a @dataclass.

Patch embedding by a strided Conv2D, a learnable [CLS] token prepended with paddle.concat, multi-head attention
written with paddle.einsum, Momentum with L2 weight decay and a piecewise learning-rate schedule.
"""
from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset
from paddle.regularizer import L2Decay


@dataclass
class ViTConfig:
    image_size: Tuple[int, int] = (96, 160)
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 20
    embed_dim: int = 384
    depth: int = 6
    num_heads: int = 6
    mlp_ratio: float = 4.0
    drop_rate: float = 0.1


@dataclass
class TrainConfig:
    batch_size: int = 16
    epochs: int = 1
    steps_per_epoch: int = 5
    base_lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-5
    lr_boundaries: List[int] = field(default_factory=lambda: [3, 4])
    lr_decay: List[float] = field(default_factory=lambda: [1.0, 0.1, 0.01])


class FrameDataset(Dataset):
    def __init__(self, cfg: ViTConfig, length: int):
        self.h, self.w = cfg.image_size
        self.c = cfg.in_chans
        self.num_classes = cfg.num_classes
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        img = np.random.normal(0.0, 1.0, (self.c, self.h, self.w)).astype("float32")
        label = np.int64(np.random.randint(self.num_classes))
        return img, label


class Attention(nn.Layer):
    def __init__(self, dim, heads, drop):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        b, n, d = x.shape
        qkv = self.qkv(x).reshape([b, n, 3, self.heads, d // self.heads])
        q, k, v = qkv.unbind(axis=2)
        attn = paddle.einsum("bnhd,bmhd->bhnm", q, k) * self.scale
        attn = self.drop(F.softmax(attn, axis=-1))
        out = paddle.einsum("bhnm,bmhd->bnhd", attn, v).reshape([b, n, d])
        return self.drop(self.proj(out))


class EncoderBlock(nn.Layer):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        hidden = int(cfg.embed_dim * cfg.mlp_ratio)
        self.norm1 = nn.LayerNorm(cfg.embed_dim, epsilon=1e-6)
        self.attn = Attention(cfg.embed_dim, cfg.num_heads, cfg.drop_rate)
        self.norm2 = nn.LayerNorm(cfg.embed_dim, epsilon=1e-6)
        self.mlp = nn.Sequential(nn.Linear(cfg.embed_dim, hidden), nn.GELU(), nn.Dropout(cfg.drop_rate),
                                 nn.Linear(hidden, cfg.embed_dim), nn.Dropout(cfg.drop_rate))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Layer):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        h, w = cfg.image_size
        self.num_patches = (h // cfg.patch_size) * (w // cfg.patch_size)
        self.patch_embed = nn.Conv2D(cfg.in_chans, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = self.create_parameter([1, 1, cfg.embed_dim],
                                               default_initializer=nn.initializer.Constant(0.0))
        self.pos_embed = self.create_parameter([1, self.num_patches + 1, cfg.embed_dim],
                                               default_initializer=nn.initializer.TruncatedNormal(std=0.02))
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.blocks = nn.Sequential(*[EncoderBlock(cfg) for _ in range(cfg.depth)])
        self.norm = nn.LayerNorm(cfg.embed_dim, epsilon=1e-6)
        self.head = nn.Linear(cfg.embed_dim, cfg.num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose([0, 2, 1])  # [B, N, D]
        cls = self.cls_token.expand([x.shape[0], -1, -1])
        x = paddle.concat([cls, x], axis=1) + self.pos_embed
        x = self.blocks(self.pos_drop(x))
        return self.head(self.norm(x)[:, 0])


def train(model_cfg: ViTConfig, train_cfg: TrainConfig):
    model = VisionTransformer(model_cfg)
    lr = paddle.optimizer.lr.PiecewiseDecay(boundaries=train_cfg.lr_boundaries,
                                            values=[train_cfg.base_lr * d for d in train_cfg.lr_decay])
    opt = paddle.optimizer.Momentum(learning_rate=lr, momentum=train_cfg.momentum,
                                    parameters=model.parameters(), weight_decay=L2Decay(train_cfg.weight_decay))
    ds = FrameDataset(model_cfg, train_cfg.batch_size * train_cfg.steps_per_epoch)
    loader = DataLoader(ds, batch_size=train_cfg.batch_size, shuffle=True, drop_last=True)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    for epoch in range(train_cfg.epochs):
        model.train()
        for step, (img, label) in enumerate(loader):
            loss = criterion(model(img), label)
            loss.backward()
            opt.step()
            opt.clear_grad()
            lr.step()
            print(f"epoch {epoch} step {step} loss {float(loss):.4f}")


if __name__ == "__main__":
    train(ViTConfig(), TrainConfig())
