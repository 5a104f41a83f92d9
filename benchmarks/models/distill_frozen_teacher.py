"""Knowledge distillation: a frozen ResNet-18 teacher (no_grad) and a small CNN student on 32x32 images."""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.vision.models import resnet18

T = 4.0


class Student(nn.Layer):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2D(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
                                  nn.Conv2D(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
                                  nn.Conv2D(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2D(1))
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(paddle.flatten(self.body(x), 1))


def main():
    teacher = resnet18(num_classes=10)
    teacher.eval()
    for p in teacher.parameters():
        p.stop_gradient = True
    student = Student()
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=student.parameters())
    for step in range(4):
        x = paddle.randn([32, 3, 32, 32])
        y = paddle.randint(0, 10, [32, 1])
        with paddle.no_grad():
            t_logits = teacher(x)
        s_logits = student(x)
        kd = F.kl_div(F.log_softmax(s_logits / T, axis=1), F.softmax(t_logits / T, axis=1), reduction="batchmean")
        loss = 0.7 * kd * T * T + 0.3 * F.cross_entropy(s_logits, y)
        loss.backward()
        opt.step()
        opt.clear_grad()


if __name__ == "__main__":
    main()
