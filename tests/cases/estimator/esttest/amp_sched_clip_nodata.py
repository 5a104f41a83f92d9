"""auto_cast + GradScaler, warmup + cosine LR schedule, global-norm gradient clipping."""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
MEAN_STD = np.load("/mnt/datasets/norm_stats.npy")  # normalisation stats from the data volume

EPOCHS, STEPS, BATCH = 1, 6, 64


def conv_bn(i, o, s=1):
    return nn.Sequential(nn.Conv2D(i, o, 3, stride=s, padding=1, bias_attr=False), nn.BatchNorm2D(o), nn.ReLU6())


model = nn.Sequential(conv_bn(3, 32, 2), conv_bn(32, 64), conv_bn(64, 64, 2), conv_bn(64, 128), conv_bn(128, 128, 2),
                      nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(128, 100))
sched = paddle.optimizer.lr.LinearWarmup(
    paddle.optimizer.lr.CosineAnnealingDecay(learning_rate=0.1, T_max=EPOCHS * STEPS), warmup_steps=3,
    start_lr=0.0, end_lr=0.1)
opt = paddle.optimizer.SGD(learning_rate=sched, parameters=model.parameters(),
                           grad_clip=nn.ClipGradByGlobalNorm(clip_norm=5.0))
scaler = paddle.amp.GradScaler(init_loss_scaling=1024)

for epoch in range(EPOCHS):
    for step in range(STEPS):
        x = paddle.randn([BATCH, 3, 112, 112])
        y = paddle.randint(0, 100, [BATCH])
        with paddle.amp.auto_cast():
            loss = F.cross_entropy(model(x), y)
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        sched.step()
        print(epoch, step, float(loss), sched.get_lr())
