"""Road-scene segmentation on 90x150 frames with a small encoder-decoder written mostly with functional ops.

F.pad brings the odd frame size to a multiple of 16 (96x160); a non-local (self-attention) block on the
bottleneck uses paddle.matmul with transpose_x / transpose_y; decoder features are upsampled with
F.interpolate(size=...) and merged with paddle.concat; channel groups are split with paddle.split; the loss
ignores pixels outside the valid (unpadded) region through a mask.
"""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset

NUM_CLASSES = 11
H, W = 90, 150
BATCH_SIZE = 8


class CamVidLike(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        img = np.random.rand(3, H, W).astype("float32")
        lbl = np.random.randint(0, NUM_CLASSES, (H, W)).astype("int64")
        return img, lbl


def conv_bn(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2D(cin, cout, 3, stride, 1, bias_attr=False), nn.BatchNorm2D(cout), nn.ReLU())


class NonLocal(nn.Layer):
    def __init__(self, c):
        super().__init__()
        self.theta = nn.Conv2D(c, c // 2, 1)
        self.phi = nn.Conv2D(c, c // 2, 1)
        self.g = nn.Conv2D(c, c // 2, 1)
        self.out = nn.Conv2D(c // 2, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.theta(x).reshape([b, c // 2, h * w])          # [b, c', n]
        p = self.phi(x).reshape([b, c // 2, h * w])            # [b, c', n]
        g = self.g(x).reshape([b, c // 2, h * w])              # [b, c', n]
        attn = F.softmax(paddle.matmul(t, p, transpose_x=True), axis=-1)   # [b, n, n]
        y = paddle.matmul(g, attn, transpose_y=True)           # [b, c', n]
        return x + self.out(y.reshape([b, c // 2, h, w]))


class SplitBlock(nn.Layer):
    """Half the channels go through a 3x3 conv, the other half pass; then they are re-joined."""

    def __init__(self, c):
        super().__init__()
        self.branch = conv_bn(c // 2, c // 2)

    def forward(self, x):
        keep, work = paddle.split(x, num_or_sections=2, axis=1)
        return paddle.concat([self.branch(work), keep], axis=1)


class SegNetLite(nn.Layer):
    def __init__(self, num_classes):
        super().__init__()
        self.enc1 = nn.Sequential(conv_bn(3, 32), SplitBlock(32))            # 1/1
        self.enc2 = nn.Sequential(conv_bn(32, 64, 2), SplitBlock(64))        # 1/2
        self.enc3 = nn.Sequential(conv_bn(64, 128, 2), SplitBlock(128))      # 1/4
        self.enc4 = nn.Sequential(conv_bn(128, 256, 2), SplitBlock(256))     # 1/8
        self.enc5 = nn.Sequential(conv_bn(256, 256, 2), NonLocal(256))       # 1/16
        self.dec4 = conv_bn(256 + 256, 128)
        self.dec3 = conv_bn(128 + 128, 64)
        self.dec2 = conv_bn(64 + 64, 32)
        self.dec1 = conv_bn(32 + 32, 32)
        self.cls = nn.Conv2D(32, num_classes, 1)

    @staticmethod
    def up_cat(x, skip):
        x = F.interpolate(x, size=skip.shape[2:], mode="bilinear", align_corners=False)
        return paddle.concat([x, skip], axis=1)

    def forward(self, img):
        h, w = img.shape[2], img.shape[3]
        ph, pw = (-h) % 16, (-w) % 16
        x = F.pad(img, [0, pw, 0, ph], mode="constant", value=0.0)
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        e3 = self.enc3(e2)
        e4 = self.enc4(e3)
        e5 = self.enc5(e4)
        d = self.dec4(self.up_cat(e5, e4))
        d = self.dec3(self.up_cat(d, e3))
        d = self.dec2(self.up_cat(d, e2))
        d = self.dec1(self.up_cat(d, e1))
        return self.cls(d)[:, :, :h, :w]


def masked_ce(logits, label, valid):
    loss = F.cross_entropy(logits.transpose([0, 2, 3, 1]), label.unsqueeze(-1), reduction="none").squeeze(-1)
    valid = valid.astype("float32")
    return (loss * valid).sum() / valid.sum().clip(min=1.0)


if __name__ == "__main__":
    model = SegNetLite(NUM_CLASSES)
    opt = paddle.optimizer.Adam(learning_rate=5e-4, parameters=model.parameters(),
                                grad_clip=nn.ClipGradByNorm(clip_norm=5.0))
    loader = DataLoader(CamVidLike(), batch_size=BATCH_SIZE, shuffle=True, drop_last=True)
    for step, (img, lbl) in enumerate(loader):
        logits = model(img)
        valid = lbl != 0  # class 0 = "void"
        loss = masked_ce(logits, lbl, valid)
        loss.backward()
        opt.step()
        opt.clear_grad()
        print(step, round(loss.item(), 4))
