"""A tiny MLP whose last step asks for far more host memory than the process may have (RLIMIT_AS)."""
import argparse, json, os, resource, time
import paddle
import paddle.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--batch", type=int, default=32)
a = p.parse_args()
limit = 6 << 30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class MLP(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc2(nn.functional.relu(self.fc1(x)))


model = MLP()
opt = paddle.optimizer.Adam(parameters=model.parameters())
mf = os.environ.get("AUTODL_METRICS_FILE")
for step in range(a.steps):
    bs = a.batch if step < a.steps - 1 else a.batch * 2_000_000   # the last batch is absurd
    x = paddle.randn([bs, 256])
    loss = model(x).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
    if mf:
        with open(mf, "a") as f:
            f.write(json.dumps({"step": step, "samples": bs, "t": time.time()}) + "\n")
print("done")
