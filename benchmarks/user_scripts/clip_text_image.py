"""Contrastive image-text pre-training (CLIP-style) on synthetic caption/image pairs.

forward(images, input_ids, attention_mask): a small convolutional image tower (128x128 RGB) and a Transformer
text tower (32 token ids from the Dataset, padding masked); symmetric InfoNCE loss with a learnable temperature.
AdamW with a one-cycle schedule.
"""
import math

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset

VOCAB, CTX, EMBED = 49408, 32, 256


class CaptionedImages(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        image = np.random.rand(3, 128, 128).astype("float32")
        length = np.random.randint(5, CTX)
        ids = np.zeros(CTX, dtype="int64")
        ids[:length] = np.random.randint(1, VOCAB, length)
        mask = (ids != 0).astype("int64")
        return image, ids, mask


class ImageTower(nn.Layer):
    def __init__(self, width=64, out_dim=EMBED):
        super().__init__()
        chans = [3, width, 2 * width, 4 * width, 8 * width]
        blocks = []
        for cin, cout in zip(chans[:-1], chans[1:]):
            blocks += [nn.Conv2D(cin, cout, 3, stride=2, padding=1, bias_attr=False), nn.BatchNorm2D(cout), nn.GELU(),
                       nn.Conv2D(cout, cout, 3, padding=1, bias_attr=False), nn.BatchNorm2D(cout), nn.GELU()]
        self.body = nn.Sequential(*blocks)
        self.proj = nn.Linear(chans[-1], out_dim)

    def forward(self, x):
        x = self.body(x)
        return self.proj(x.mean(axis=[2, 3]))


class TextTower(nn.Layer):
    def __init__(self, width=256, layers=4, heads=4, out_dim=EMBED):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = self.create_parameter([CTX, width], default_initializer=nn.initializer.Normal(std=0.01))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           normalize_before=True)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(width))
        self.proj = nn.Linear(width, out_dim, bias_attr=False)

    def forward(self, ids, mask):
        x = self.tok(ids) + self.pos
        key_pad = (1.0 - mask.astype("float32"))[:, None, None, :] * -1e9   # [b, 1, 1, L] additive mask
        x = self.encoder(x, src_mask=key_pad)
        last = mask.sum(axis=1) - 1                                          # index of the last real token
        pooled = paddle.take_along_axis(x, last.reshape([-1, 1, 1]).expand([-1, 1, x.shape[-1]]), axis=1)
        return self.proj(pooled.squeeze(1))


class CLIP(nn.Layer):
    def __init__(self):
        super().__init__()
        self.visual = ImageTower()
        self.text = TextTower()
        self.logit_scale = self.create_parameter([1], default_initializer=nn.initializer.Constant(math.log(1 / 0.07)))

    def forward(self, images, input_ids, attention_mask):
        img = F.normalize(self.visual(images), axis=-1)
        txt = F.normalize(self.text(input_ids, attention_mask), axis=-1)
        logits = self.logit_scale.exp() * img @ txt.T
        return logits


def clip_loss(logits):
    labels = paddle.arange(logits.shape[0], dtype="int64")
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


if __name__ == "__main__":
    batch_size, steps = 32, 6
    model = CLIP()
    sched = paddle.optimizer.lr.OneCycleLR(max_learning_rate=5e-4, total_steps=steps)
    opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(), weight_decay=0.2,
                                 beta2=0.98, epsilon=1e-6)
    loader = DataLoader(CaptionedImages(batch_size * steps), batch_size=batch_size, drop_last=True)
    for step, (images, ids, mask) in enumerate(loader):
        loss = clip_loss(model(images, ids, mask))
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        print(f"step {step} loss {loss.item():.4f} scale {model.logit_scale.exp().item():.2f}")
