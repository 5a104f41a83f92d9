"""paddle.vision.models.densenet121 on 128x128 medical-image crops with gradient accumulation.

Memory is tight, so the batch of 16 is taken as 4 micro-batches of 4: loss / ACCUM_STEPS, backward each
micro-batch, one optimizer step and one clear_grad every ACCUM_STEPS.  SGD with step decay and L2 decay.
"""
import numpy as np
import paddle
import paddle.nn as nn
from paddle.io import DataLoader, Dataset
from paddle.vision.models import densenet121

MICRO_BATCH = 4
ACCUM_STEPS = 4
NUM_CLASSES = 14
CROP = 128


class Crops(Dataset):
    def __len__(self):
        return MICRO_BATCH * ACCUM_STEPS * 3

    def __getitem__(self, i):
        x = np.random.standard_normal((3, CROP, CROP)).astype("float32")
        return x, np.array([np.random.randint(NUM_CLASSES)], dtype="int64")


model = densenet121(num_classes=NUM_CLASSES)
criterion = nn.CrossEntropyLoss()
scheduler = paddle.optimizer.lr.StepDecay(learning_rate=0.01, step_size=30, gamma=0.1)
optimizer = paddle.optimizer.SGD(learning_rate=scheduler, parameters=model.parameters(),
                                 weight_decay=paddle.regularizer.L2Decay(1e-4))
loader = DataLoader(Crops(), batch_size=MICRO_BATCH, shuffle=True, drop_last=True)

if __name__ == "__main__":
    model.train()
    running = 0.0
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / ACCUM_STEPS
        loss.backward()
        running += loss.item()
        if (i + 1) % ACCUM_STEPS == 0:
            optimizer.step()
            optimizer.clear_grad()
            scheduler.step()
            print(f"update {(i + 1) // ACCUM_STEPS}: loss {running:.4f}")
            running = 0.0
