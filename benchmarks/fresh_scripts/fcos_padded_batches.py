# FCOS-like anchor-free detector on a zoo ResNet-18 backbone. Each image gets its own random short side and aspect
# (multi-scale training); a collate pads the batch to its largest image rounded up to 32, so every batch has a
# different shape. Targets: per-location ltrb + centerness inside the smallest covering box. Config: YAML file.
import math
import os
import random

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import yaml
from paddle.vision.models import resnet18

CFG = yaml.safe_load(open(os.path.join(os.path.dirname(__file__) or ".", "configs", "fcos_r18.yaml")))


class RandomSizeDetection(paddle.io.Dataset):
    def __init__(self, cfg):
        self.cfg, self.n = cfg, cfg["num_images"]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = random.Random(i * 1000 + random.randint(0, 999))
        short = rng.choice(self.cfg["short_sides"])
        long = int(short * rng.uniform(1.0, self.cfg["max_aspect"]))
        h, w = (short, long) if rng.random() < 0.5 else (long, short)
        k = rng.randint(1, 6)
        boxes = []
        for _ in range(k):
            bw, bh = rng.uniform(16, w * 0.6), rng.uniform(16, h * 0.6)
            x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            boxes.append([x0, y0, x0 + bw, y0 + bh])
        img = np.random.default_rng(i).standard_normal((3, h, w)).astype("float32")
        return img, np.array(boxes, "float32"), np.array([rng.randrange(self.cfg["num_classes"]) for _ in range(k)])


def pad_collate(batch, divisor=CFG["size_divisor"]):
    H = int(math.ceil(max(b[0].shape[1] for b in batch) / divisor) * divisor)
    W = int(math.ceil(max(b[0].shape[2] for b in batch) / divisor) * divisor)
    imgs = np.zeros((len(batch), 3, H, W), "float32")
    for i, (im, _, _) in enumerate(batch):
        imgs[i, :, :im.shape[1], :im.shape[2]] = im
    return (paddle.to_tensor(imgs), [paddle.to_tensor(b[1]) for b in batch],
            [paddle.to_tensor(b[2].astype("int64")) for b in batch])


class FCOS(nn.Layer):
    def __init__(self, num_classes, ch):
        super().__init__()
        r = resnet18(num_classes=0, with_pool=False)
        self.stem = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool, r.layer1)
        self.layer2, self.layer3, self.layer4 = r.layer2, r.layer3, r.layer4
        self.lateral = nn.LayerList([nn.Conv2D(c, ch, 1) for c in (128, 256, 512)])
        self.out = nn.LayerList([nn.Conv2D(ch, ch, 3, padding=1) for _ in range(3)])

        def tower():
            layers = []
            for _ in range(4):
                layers += [nn.Conv2D(ch, ch, 3, padding=1), nn.GroupNorm(32, ch), nn.ReLU()]
            return nn.Sequential(*layers)
        self.cls_tower, self.reg_tower = tower(), tower()
        self.cls_logits = nn.Conv2D(ch, num_classes, 3, padding=1,
                                    bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(-4.595)))
        self.bbox_pred = nn.Conv2D(ch, 4, 3, padding=1)
        self.centerness = nn.Conv2D(ch, 1, 3, padding=1)
        self.scales = self.create_parameter([3], default_initializer=nn.initializer.Constant(1.0))

    def forward(self, x):
        c3 = self.layer2(self.stem(x))
        c4 = self.layer3(c3)
        c5 = self.layer4(c4)
        p5 = self.lateral[2](c5)
        p4 = self.lateral[1](c4) + F.interpolate(p5, size=c4.shape[2:])
        p3 = self.lateral[0](c3) + F.interpolate(p4, size=c3.shape[2:])
        outs = []
        for lvl, p in enumerate([p3, p4, p5]):
            p = self.out[lvl](p)
            c, r = self.cls_tower(p), self.reg_tower(p)
            outs.append((self.cls_logits(c), paddle.exp(self.scales[lvl] * self.bbox_pred(r)), self.centerness(r)))
        return outs


def fcos_targets(shape_hw, stride, lo, hi, boxes, labels, nc):
    h, w = shape_hw
    ys, xs = paddle.meshgrid(paddle.arange(h, dtype="float32"), paddle.arange(w, dtype="float32"))
    px, py = (xs.flatten() + 0.5) * stride, (ys.flatten() + 0.5) * stride
    l, t = px[:, None] - boxes[None, :, 0], py[:, None] - boxes[None, :, 1]
    r, b = boxes[None, :, 2] - px[:, None], boxes[None, :, 3] - py[:, None]
    ltrb = paddle.stack([l, t, r, b], -1)                              # [P, G, 4]
    inside = ltrb.min(-1) > 0
    m = ltrb.max(-1)
    ok = paddle.logical_and(inside, paddle.logical_and(m >= lo, m <= hi))
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))[None].expand([ok.shape[0], boxes.shape[0]])
    area = paddle.where(ok, area, paddle.full_like(area, 1e8))
    gi = area.argmin(1)
    pos = area.min(1) < 1e8
    reg = paddle.take_along_axis(ltrb, gi.reshape([-1, 1, 1]).expand([-1, 1, 4]), 1).squeeze(1)
    cls = F.one_hot(paddle.gather(labels, gi), nc) * pos.astype("float32").unsqueeze(-1)
    lr, tb = reg[:, 0::2], reg[:, 1::2]
    ctr = paddle.sqrt(paddle.clip(lr.min(-1) / lr.max(-1), min=0) * paddle.clip(tb.min(-1) / tb.max(-1), min=0))
    return cls, reg, ctr, pos


def iou_loss(pred, target):
    pa = (pred[:, 0] + pred[:, 2]) * (pred[:, 1] + pred[:, 3])
    ta = (target[:, 0] + target[:, 2]) * (target[:, 1] + target[:, 3])
    iw = paddle.minimum(pred[:, 0], target[:, 0]) + paddle.minimum(pred[:, 2], target[:, 2])
    ih = paddle.minimum(pred[:, 1], target[:, 1]) + paddle.minimum(pred[:, 3], target[:, 3])
    inter = iw * ih
    return -paddle.log((inter + 1) / (pa + ta - inter + 1))


def compute_loss(outs, boxes, labels, cfg):
    total = 0.0
    for i in range(len(boxes)):
        for lvl, (cls, reg, ctr) in enumerate(outs):
            lo, hi = cfg["size_ranges"][lvl]
            t_cls, t_reg, t_ctr, pos = fcos_targets(cls.shape[2:], cfg["strides"][lvl], lo, hi, boxes[i], labels[i],
                                                    cfg["num_classes"])
            p_cls = cls[i].reshape([cfg["num_classes"], -1]).T
            p_reg, p_ctr = reg[i].reshape([4, -1]).T, ctr[i].reshape([-1])
            posf = pos.astype("float32")
            npos = paddle.clip(posf.sum(), min=1.0)
            total = total + F.sigmoid_focal_loss(p_cls, t_cls, reduction="sum") / npos
            total = total + (iou_loss(p_reg, paddle.clip(t_reg, min=1e-3)) * t_ctr * posf).sum() / npos
            total = total + (F.binary_cross_entropy_with_logits(p_ctr, t_ctr, reduction="none") * posf).sum() / npos
    return total / len(boxes)


if __name__ == "__main__":
    random.seed(CFG["seed"])
    np.random.seed(CFG["seed"])
    paddle.seed(CFG["seed"])
    model = FCOS(CFG["num_classes"], CFG["fpn_channels"])
    loader = paddle.io.DataLoader(RandomSizeDetection(CFG), batch_size=CFG["images_per_batch"], shuffle=True,
                                  collate_fn=pad_collate)
    oc = CFG["optimizer"]
    sched = paddle.optimizer.lr.LinearWarmup(oc["lr"], oc["warmup_steps"], oc["lr"] / 3, oc["lr"])
    opt = paddle.optimizer.Momentum(sched, oc["momentum"], parameters=model.parameters(),
                                    weight_decay=paddle.regularizer.L2Decay(oc["weight_decay"]))
    for epoch in range(CFG["epochs"]):
        for it, (images, boxes, labels) in enumerate(loader):
            loss = compute_loss(model(images), boxes, labels, CFG)
            loss.backward()
            opt.step()
            opt.clear_grad()
            sched.step()
            print(f"epoch {epoch} it {it} batch {images.shape} loss {float(loss):.4f}")
