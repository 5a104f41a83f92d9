"""paddle.vision.models.resnet50 trained on random 224x224 images (benchmark model)."""
import argparse

import paddle
import paddle.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--num-classes", type=int, default=100)


def main():
    args = parser.parse_args()
    model = paddle.vision.models.resnet50(num_classes=args.num_classes)
    opt = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, parameters=model.parameters())
    for _ in range(3):
        x = paddle.randn([args.batch_size, 3, 224, 224])
        y = paddle.randint(0, args.num_classes, [args.batch_size, 1])
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
