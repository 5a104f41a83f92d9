# RetinaNet-like one-stage detector (small ResNet-ish backbone, FPN P3-P5, shared class/box towers, focal loss) with
# multi-scale training: every batch is resized to a size drawn from a list, boxes are a list of [n_i, 4] tensors.
import argparse
import random

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=2)
parser.add_argument("--scales", type=int, nargs="+", default=[256, 320, 384, 448])
parser.add_argument("--num_classes", type=int, default=20)
parser.add_argument("--num_images", type=int, default=20)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()

random.seed(0)
np.random.seed(0)
paddle.seed(0)


class SyntheticVOC(paddle.io.Dataset):
    def __init__(self, n, size=448):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        k = int(rng.integers(1, 8))
        xy = rng.uniform(0, self.size * 0.7, (k, 2))
        wh = rng.uniform(24, self.size * 0.3, (k, 2))
        boxes = np.concatenate([xy, np.minimum(xy + wh, self.size - 1)], 1).astype("float32")
        img = rng.standard_normal((3, self.size, self.size)).astype("float32")
        return img, boxes, rng.integers(0, args.num_classes, k).astype("int64")


def det_collate(items):
    return (paddle.to_tensor(np.stack([it[0] for it in items])), [paddle.to_tensor(it[1]) for it in items],
            [paddle.to_tensor(it[2]) for it in items])


def conv_bn(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2D(cin, cout, 3, stride, 1, bias_attr=False), nn.BatchNorm2D(cout), nn.ReLU())


class Backbone(nn.Layer):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 32, 2), conv_bn(32, 64, 2))                  # /4
        self.c3 = nn.Sequential(conv_bn(64, 128, 2), conv_bn(128, 128))                   # /8
        self.c4 = nn.Sequential(conv_bn(128, 256, 2), conv_bn(256, 256))                  # /16
        self.c5 = nn.Sequential(conv_bn(256, 512, 2), conv_bn(512, 512))                  # /32

    def forward(self, x):
        c3 = self.c3(self.stem(x))
        c4 = self.c4(c3)
        return c3, c4, self.c5(c4)


class FPN(nn.Layer):
    def __init__(self, chans=(128, 256, 512), out=128):
        super().__init__()
        self.lat = nn.LayerList([nn.Conv2D(c, out, 1) for c in chans])
        self.smooth = nn.LayerList([nn.Conv2D(out, out, 3, padding=1) for _ in chans])

    def forward(self, feats):
        lat = [l(f) for l, f in zip(self.lat, feats)]
        for i in range(len(lat) - 2, -1, -1):
            lat[i] = lat[i] + F.interpolate(lat[i + 1], size=lat[i].shape[2:], mode="nearest")
        return [s(p) for s, p in zip(self.smooth, lat)]


class RetinaNet(nn.Layer):
    def __init__(self, num_classes, anchors_per_loc=3, ch=128):
        super().__init__()
        self.backbone, self.fpn = Backbone(), FPN(out=ch)
        tower = lambda: nn.Sequential(*[m for _ in range(3) for m in (nn.Conv2D(ch, ch, 3, padding=1), nn.ReLU())])  # noqa
        self.cls_tower, self.box_tower = tower(), tower()
        prior = -float(np.log((1 - 0.01) / 0.01))
        self.cls_out = nn.Conv2D(ch, anchors_per_loc * num_classes, 3, padding=1,
                                 bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(prior)))
        self.box_out = nn.Conv2D(ch, anchors_per_loc * 4, 3, padding=1)
        self.k, self.nc = anchors_per_loc, num_classes

    def forward(self, images):
        cls, box = [], []
        for p in self.fpn(self.backbone(images)):
            b = p.shape[0]
            cls.append(self.cls_out(self.cls_tower(p)).transpose([0, 2, 3, 1]).reshape([b, -1, self.nc]))
            box.append(self.box_out(self.box_tower(p)).transpose([0, 2, 3, 1]).reshape([b, -1, 4]))
        return paddle.concat(cls, 1), paddle.concat(box, 1)


def make_anchors(h, w, strides=(8, 16, 32), scales=(1.0, 1.26, 1.59)):
    out = []
    for s in strides:
        ys, xs = np.meshgrid(np.arange(0, h, s) + s / 2, np.arange(0, w, s) + s / 2, indexing="ij")
        ctr = np.stack([xs, ys], -1).reshape(-1, 1, 2)
        half = np.array([[4 * s * k / 2] * 2 for k in scales])[None]
        out.append(np.concatenate([ctr - half, ctr + half], -1).reshape(-1, 4))
    return paddle.to_tensor(np.concatenate(out).astype("float32"))


def box_iou(a, b):
    lt = paddle.maximum(a[:, None, :2], b[None, :, :2])
    rb = paddle.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = paddle.clip(rb - lt, min=0).prod(-1)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None] - inter)


def encode(anchors, gt):
    aw, ah = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
    gw, gh = gt[:, 2] - gt[:, 0], gt[:, 3] - gt[:, 1]
    dx = ((gt[:, 0] + gt[:, 2]) - (anchors[:, 0] + anchors[:, 2])) / 2 / aw
    dy = ((gt[:, 1] + gt[:, 3]) - (anchors[:, 1] + anchors[:, 3])) / 2 / ah
    return paddle.stack([dx, dy, paddle.log(gw / aw), paddle.log(gh / ah)], -1)


def retina_loss(cls_logits, box_deltas, anchors, gt_boxes, gt_labels, nc):
    total = 0.0
    for i in range(len(gt_boxes)):
        iou = box_iou(anchors, gt_boxes[i])
        best, idx = iou.max(1), iou.argmax(1)
        pos, neg = best >= 0.5, best < 0.4
        target = F.one_hot(paddle.gather(gt_labels[i], idx), nc) * pos.astype("float32").unsqueeze(-1)
        valid = paddle.logical_or(pos, neg).astype("float32").unsqueeze(-1)
        npos = paddle.clip(pos.astype("float32").sum(), min=1.0)
        fl = F.sigmoid_focal_loss(cls_logits[i], target, reduction="none") * valid
        reg_t = encode(anchors, paddle.gather(gt_boxes[i], idx))
        sl1 = F.smooth_l1_loss(box_deltas[i], reg_t, reduction="none", delta=0.11).sum(-1) * pos.astype("float32")
        total = total + (fl.sum() + sl1.sum()) / npos
    return total / len(gt_boxes)


model = RetinaNet(args.num_classes)
loader = paddle.io.DataLoader(SyntheticVOC(args.num_images), batch_size=args.batch_size, shuffle=True,
                              collate_fn=det_collate, drop_last=True)
opt = paddle.optimizer.Momentum(args.lr, momentum=0.9, parameters=model.parameters(), weight_decay=1e-4,
                                grad_clip=nn.ClipGradByNorm(35.0))
for epoch in range(args.epochs):
    for it, (images, boxes, labels) in enumerate(loader):
        size = random.choice(args.scales)        # multi-scale training: one size per batch
        ratio = size / images.shape[-1]
        images = F.interpolate(images, size=[size, size], mode="bilinear", align_corners=False)
        boxes = [b * ratio for b in boxes]
        cls_logits, box_deltas = model(images)
        loss = retina_loss(cls_logits, box_deltas, make_anchors(size, size), boxes, labels, args.num_classes)
        loss.backward()
        opt.step()
        opt.clear_grad()
        print(f"epoch {epoch} it {it} size {size} loss {float(loss):.4f}")
