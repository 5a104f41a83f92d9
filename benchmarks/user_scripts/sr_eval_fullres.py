"""EDSR-style x2 super-resolution: trained on 48x48 low-resolution patches, evaluated on whole 180x320 frames (360p output).

Sub-pixel upsampling (F.pixel_shuffle), L1 loss, Adam with a multi-step schedule.  The validation pass runs
under paddle.no_grad at full frame size, which is where the memory goes.
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

SCALE = 2
N_FEATS = 64
N_RESBLOCKS = 8
PATCH = 48
BATCH = 8
VAL_LR = (180, 320)


class ResBlock(nn.Layer):
    def __init__(self, c, res_scale=0.1):
        super().__init__()
        self.c1 = nn.Conv2D(c, c, 3, padding=1)
        self.c2 = nn.Conv2D(c, c, 3, padding=1)
        self.res_scale = res_scale

    def forward(self, x):
        return x + self.c2(F.relu(self.c1(x))) * self.res_scale


class EDSR(nn.Layer):
    def __init__(self):
        super().__init__()
        self.head = nn.Conv2D(3, N_FEATS, 3, padding=1)
        self.body = nn.Sequential(*[ResBlock(N_FEATS) for _ in range(N_RESBLOCKS)],
                                  nn.Conv2D(N_FEATS, N_FEATS, 3, padding=1))
        self.up = nn.Conv2D(N_FEATS, N_FEATS * SCALE * SCALE, 3, padding=1)
        self.tail = nn.Conv2D(N_FEATS, 3, 3, padding=1)

    def forward(self, lr_img):
        x = self.head(lr_img)
        x = x + self.body(x)
        x = F.pixel_shuffle(self.up(x), SCALE)
        return self.tail(x)


def psnr(sr, hr):
    mse = F.mse_loss(sr.clip(0, 1), hr)
    return float(10 * paddle.log10(1.0 / mse))


def validate(model, n_frames=2):
    model.eval()
    scores = []
    with paddle.no_grad():
        for _ in range(n_frames):
            lr = paddle.rand([1, 3, *VAL_LR])
            hr = F.interpolate(lr, scale_factor=SCALE, mode="bicubic")
            scores.append(psnr(model(lr), hr))
    model.train()
    return sum(scores) / len(scores)


def main():
    model = EDSR()
    sched = paddle.optimizer.lr.MultiStepDecay(learning_rate=1e-4, milestones=[200, 400], gamma=0.5)
    opt = paddle.optimizer.Adam(learning_rate=sched, beta1=0.9, beta2=0.999, epsilon=1e-8,
                                parameters=model.parameters())
    for epoch in range(2):
        for it in range(3):
            hr = paddle.rand([BATCH, 3, PATCH * SCALE, PATCH * SCALE])
            lr = F.avg_pool2d(hr, SCALE)
            loss = F.l1_loss(model(lr), hr)
            loss.backward()
            opt.step()
            opt.clear_grad()
            sched.step()
        print(f"epoch {epoch} loss {loss.item():.4f} val PSNR {validate(model):.2f} dB")


if __name__ == "__main__":
    main()
