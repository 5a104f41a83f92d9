"""Action recognition on short video clips with a small R(2+1)D network (factorised 3-D convolutions).

Trains on 8-frame 112x112 clips; evaluates each epoch on longer 16-frame 128x171 clips under paddle.no_grad
(the usual video test-time protocol).  Everything, including the model, is built inside main().
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.io import DataLoader, Dataset


class ClipDataset(Dataset):
    def __init__(self, num_clips, frames, height, width, num_classes):
        self.num_clips, self.shape, self.num_classes = num_clips, (3, frames, height, width), num_classes

    def __len__(self):
        return self.num_clips

    def __getitem__(self, idx):
        clip = paddle.rand(self.shape).numpy()  # stands in for decoded, normalised frames
        return clip, idx % self.num_classes


class SpatioTemporalConv(nn.Layer):
    """A 3-D conv t x k x k factorised into a spatial 1 x k x k conv followed by a temporal t x 1 x 1 conv."""

    def __init__(self, cin, cout, k=3, t=3, stride=1, temporal_stride=1):
        super().__init__()
        mid = (t * k * k * cin * cout) // (k * k * cin + t * cout)
        self.spatial = nn.Conv3D(cin, mid, (1, k, k), stride=(1, stride, stride), padding=(0, k // 2, k // 2),
                                 bias_attr=False)
        self.bn = nn.BatchNorm3D(mid)
        self.temporal = nn.Conv3D(mid, cout, (t, 1, 1), stride=(temporal_stride, 1, 1), padding=(t // 2, 0, 0),
                                  bias_attr=False)

    def forward(self, x):
        return self.temporal(F.relu(self.bn(self.spatial(x))))


class ResBlock(nn.Layer):
    def __init__(self, cin, cout, downsample=False):
        super().__init__()
        s = 2 if downsample else 1
        self.conv1 = SpatioTemporalConv(cin, cout, stride=s, temporal_stride=s)
        self.bn1 = nn.BatchNorm3D(cout)
        self.conv2 = SpatioTemporalConv(cout, cout)
        self.bn2 = nn.BatchNorm3D(cout)
        self.short = None
        if downsample or cin != cout:
            self.short = nn.Sequential(nn.Conv3D(cin, cout, 1, stride=s, bias_attr=False), nn.BatchNorm3D(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class R2Plus1D(nn.Layer):
    def __init__(self, num_classes, widths=(32, 64, 128, 256)):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv3D(3, 45, (1, 7, 7), stride=(1, 2, 2), padding=(0, 3, 3), bias_attr=False),
            nn.BatchNorm3D(45), nn.ReLU(),
            nn.Conv3D(45, widths[0], (3, 1, 1), padding=(1, 0, 0), bias_attr=False),
            nn.BatchNorm3D(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers.append(ResBlock(cin, w, downsample=i > 0))
            cin = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool3D(1)
        self.fc = nn.Linear(widths[-1], num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(paddle.flatten(self.pool(x), 1))


def evaluate(model, loader):
    model.eval()
    correct = total = 0
    with paddle.no_grad():
        for clips, labels in loader:
            pred = model(clips).argmax(axis=1)
            correct += int((pred == labels).astype("int64").sum())
            total += labels.shape[0]
    return correct / max(total, 1)


def main():
    num_classes = 51
    model = R2Plus1D(num_classes)
    train_loader = DataLoader(ClipDataset(16, 8, 112, 112, num_classes), batch_size=4, shuffle=True)
    val_loader = DataLoader(ClipDataset(8, 16, 128, 171, num_classes), batch_size=4)
    optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters(),
                                      weight_decay=paddle.regularizer.L2Decay(5e-4))
    for epoch in range(2):
        model.train()
        for it, (clips, labels) in enumerate(train_loader):
            loss = F.cross_entropy(model(clips), labels.reshape([-1, 1]))
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            print(f"epoch {epoch} it {it} loss {loss.item():.3f}")
        print(f"epoch {epoch} val acc {evaluate(model, val_loader):.3f}")


if __name__ == "__main__":
    main()
