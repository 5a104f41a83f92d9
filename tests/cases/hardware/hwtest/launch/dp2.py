"""Two-rank data parallel on whatever device Paddle is told (CPU here)."""
import json, os, time
import paddle
import paddle.distributed as dist
import paddle.nn as nn

dev = os.environ.get("AUTODL_PADDLE_DEVICE", "cpu")
if dev.startswith("gpu") and not paddle.is_compiled_with_cuda():
    dev = "cpu"   # this machine has a CPU build
paddle.set_device(dev)
dist.init_parallel_env()
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank}/{world} on {dev} pid {os.getpid()} CVD={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
try:
    model = paddle.DataParallel(model)
except AssertionError as e:  # CPU build: gloo ranks without a default group
    print("rank", rank, "plain model:", e, flush=True)
opt = paddle.optimizer.Momentum(parameters=model.parameters(), learning_rate=0.01)
steps = int(os.environ.get("HWTEST_STEPS", "20"))
for step in range(steps):
    loss = model(paddle.randn([16, 32])).mean()
    loss.backward(); opt.step(); opt.clear_grad()
    time.sleep(float(os.environ.get("HWTEST_SLEEP", "0.5")))
    mf = os.environ.get("AUTODL_METRICS_FILE")
    if mf and rank == 0:
        with open(mf, "a") as f:
            f.write(json.dumps({"step": step, "samples": 16 * world, "t": time.time()}) + "\n")
print("rank", rank, "done", flush=True)
