# FixMatch-style semi-supervised training (Sohn et al. 2020) with two DataLoaders: a labelled one and an unlabelled
# one mu times larger, zipped; weak and strong views of the unlabelled batch are concatenated with the labelled batch
# into one forward (the model's batch is B + 2*mu*B), pseudo-labels above a confidence threshold.
import argparse

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

parser = argparse.ArgumentParser(description="FixMatch on synthetic CIFAR-like data")
parser.add_argument("--batch-size", default=16, type=int, help="labelled batch")
parser.add_argument("--mu", default=3, type=int, help="unlabelled batch = mu * batch-size")
parser.add_argument("--threshold", default=0.95, type=float)
parser.add_argument("--lambda-u", default=1.0, type=float)
parser.add_argument("--widen", default=2, type=int)
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--num-labeled", default=128, type=int)
parser.add_argument("--seed", default=5, type=int)
args, _ = parser.parse_known_args()


class Labeled(paddle.io.Dataset):
    def __init__(self, n, seed):
        r = np.random.default_rng(seed)
        self.x = r.random((n, 3, 32, 32), dtype=np.float32)
        self.y = r.integers(0, 10, n)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i][:, :, ::-1].copy() if np.random.rand() < 0.5 else self.x[i]
        return x, np.int64(self.y[i])


class Unlabeled(paddle.io.Dataset):
    """Returns (weak, strong) views: flip+shift, and flip+shift+cutout+noise."""

    def __init__(self, n, seed):
        self.x = np.random.default_rng(seed + 1).random((n, 3, 32, 32), dtype=np.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        weak = np.roll(self.x[i], np.random.randint(-4, 5), axis=2)
        strong = weak + np.random.normal(0, 0.1, weak.shape).astype("float32")
        cy, cx = np.random.randint(0, 32, 2)
        strong[:, max(0, cy - 8):cy + 8, max(0, cx - 8):cx + 8] = 0.5
        return weak.astype("float32"), strong.astype("float32")


class BasicBlock(nn.Layer):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2D(cin, momentum=0.999), nn.Conv2D(cin, cout, 3, stride, 1, bias_attr=False)
        self.bn2, self.conv2 = nn.BatchNorm2D(cout, momentum=0.999), nn.Conv2D(cout, cout, 3, 1, 1, bias_attr=False)
        self.short = None if cin == cout and stride == 1 else nn.Conv2D(cin, cout, 1, stride, bias_attr=False)

    def forward(self, x):
        o = F.leaky_relu(self.bn1(x), 0.1)
        y = self.conv2(F.leaky_relu(self.bn2(self.conv1(o)), 0.1))
        return y + (x if self.short is None else self.short(o))


class WideResNet(nn.Layer):
    def __init__(self, k, num_classes=10, n=2):
        super().__init__()
        w = [16, 16 * k, 32 * k, 64 * k]
        self.conv = nn.Conv2D(3, w[0], 3, padding=1, bias_attr=False)
        blocks = []
        for g in range(3):
            for j in range(n):
                blocks.append(BasicBlock(w[g] if j == 0 else w[g + 1], w[g + 1], (1 if g == 0 else 2) if j == 0 else 1))
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2D(w[3], momentum=0.999)
        self.fc = nn.Linear(w[3], num_classes)

    def forward(self, x):
        x = F.leaky_relu(self.bn(self.blocks(self.conv(x))), 0.1)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def forever(loader):
    while True:
        for b in loader:
            yield b


def main():
    paddle.seed(args.seed)
    np.random.seed(args.seed)
    labeled_loader = paddle.io.DataLoader(Labeled(args.num_labeled, args.seed), batch_size=args.batch_size,
                                          shuffle=True, drop_last=True)
    unlabeled_loader = paddle.io.DataLoader(Unlabeled(args.num_labeled * 7, args.seed),
                                            batch_size=args.batch_size * args.mu, shuffle=True, drop_last=True)
    model = WideResNet(args.widen)
    steps = args.epochs * len(labeled_loader)
    sched = paddle.optimizer.lr.LambdaDecay(0.03, lambda s: np.cos(7 * np.pi * s / (16 * steps)))
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if "bn" in n or "bias" in n else decay).append(p)
    opt = paddle.optimizer.Momentum(sched, momentum=0.9, use_nesterov=True,
                                    parameters=[{"params": decay, "weight_decay": 5e-4},
                                                {"params": no_decay, "weight_decay": 0.0}])
    unlabeled_iter = forever(unlabeled_loader)
    for epoch in range(args.epochs):
        model.train()
        for it, (x_l, y_l) in enumerate(labeled_loader):
            u_w, u_s = next(unlabeled_iter)
            b = x_l.shape[0]
            logits = model(paddle.concat([x_l, u_w, u_s]))
            logits_x, (logits_w, logits_s) = logits[:b], logits[b:].chunk(2)
            lx = F.cross_entropy(logits_x, y_l)
            probs = F.softmax(logits_w.detach() / 1.0, axis=-1)
            max_p, pseudo = probs.max(-1), probs.argmax(-1)
            mask = (max_p >= args.threshold).astype("float32")
            lu = (F.cross_entropy(logits_s, pseudo, reduction="none").squeeze(-1) * mask).mean()
            loss = lx + args.lambda_u * lu
            opt.clear_grad()
            loss.backward()
            opt.step()
            sched.step()
            print(f"epoch {epoch} it {it} lx {float(lx):.3f} lu {float(lu):.3f} mask {float(mask.mean()):.2f}")


if __name__ == "__main__":
    main()
