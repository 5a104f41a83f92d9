"""Mixed-precision training of paddle.vision.models.shufflenet_v2_x0_5 (Flowers-102 sized problem).

paddle.amp.auto_cast (O1) + GradScaler with dynamic loss scaling, Momentum with L2 decay and a warm-up.
"""
import paddle
import paddle.nn.functional as F
from paddle.vision.models import shufflenet_v2_x0_5

BATCH_SIZE = 32
NUM_CLASSES = 102
IMAGE = 224


def main():
    model = shufflenet_v2_x0_5(num_classes=NUM_CLASSES)
    sched = paddle.optimizer.lr.LinearWarmup(learning_rate=0.1, warmup_steps=3, start_lr=0.01, end_lr=0.1)
    optimizer = paddle.optimizer.Momentum(learning_rate=sched, momentum=0.9, parameters=model.parameters(),
                                          weight_decay=paddle.regularizer.L2Decay(4e-5))
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024, incr_every_n_steps=1000)
    model.train()
    for step in range(6):
        images = paddle.randn([BATCH_SIZE, 3, IMAGE, IMAGE])
        labels = paddle.randint(0, NUM_CLASSES, [BATCH_SIZE, 1])
        with paddle.amp.auto_cast(level="O1"):
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        sched.step()
        print(f"step {step} loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
