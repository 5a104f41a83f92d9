"""Pet-breed classifier: paddle.vision.models.mobilenet_v2 with a width multiplier, all sizes from the command line.

Measured as:  python mobilenet_cli.py --batch-size 12 --img-size 112 --width-mult 0.5 --num-classes 37 --lr 0.045
(the defaults are the full-size recipe: batch 64 at 224, width 1.0).  RMSProp with exponential decay, as in the
MobileNet papers.
"""
import argparse
import sys

import paddle
import paddle.nn as nn
from paddle.vision.models import mobilenet_v2

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--img-size", type=int, default=224)
parser.add_argument("--width-mult", type=float, default=1.0)
parser.add_argument("--num-classes", type=int, default=1000)
parser.add_argument("--lr", type=float, default=0.045)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--log-every", type=int, default=1)


def synthetic_batch(bs, size, num_classes):
    x = paddle.uniform([bs, 3, size, size], min=-1.0, max=1.0)
    y = paddle.randint(0, num_classes, [bs, 1], dtype="int64")
    return x, y


if __name__ == "__main__":
    args = parser.parse_args()
    print("args:", vars(args), file=sys.stderr)
    net = mobilenet_v2(scale=args.width_mult, num_classes=args.num_classes)
    loss_fn = nn.CrossEntropyLoss()
    lr = paddle.optimizer.lr.ExponentialDecay(learning_rate=args.lr, gamma=0.98)
    opt = paddle.optimizer.RMSProp(learning_rate=lr, rho=0.9, momentum=0.9, epsilon=0.0316,
                                   parameters=net.parameters(), weight_decay=4e-5)
    net.train()
    for step in range(args.steps):
        images, labels = synthetic_batch(args.batch_size, args.img_size, args.num_classes)
        logits = net(images)
        loss = loss_fn(logits, labels)
        loss.backward()
        opt.step()
        opt.clear_grad()
        lr.step()
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.4f}")
