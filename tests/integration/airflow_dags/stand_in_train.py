"""A stand-in training for the real-Airflow tests: the profiler reads a small Paddle model from this file,
while running it only prints a step a second for ``--seconds`` seconds (no Paddle import, so ten runs in a
row cost the tests little CPU) and reports its steps through $AUTODL_METRICS_FILE."""

import json
import os
import sys
import time

if __name__ == "__main__":
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 3.0
    run = os.environ.get("AUTODL_RUN_KEY", "?")
    print(f"stand-in training of {run} starts for {seconds:g} s", flush=True)
    start = time.time()
    step = 0
    while time.time() - start < seconds:
        time.sleep(1.0)
        step += 1
        print(f"step {step}", flush=True)
        if os.environ.get("AUTODL_METRICS_FILE"):
            with open(os.environ["AUTODL_METRICS_FILE"], "a") as fh:
                fh.write(json.dumps({"step": step, "samples": 8, "t": time.time()}) + "\n")
    print(f"stand-in training of {run} done after {step} steps", flush=True)
    sys.exit(0)

import paddle  # noqa: E402 - below the main block on purpose: only the profiler reads the model


class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = paddle.nn.Linear(32, 64)
        self.fc2 = paddle.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(paddle.nn.functional.relu(self.fc1(x)))


BATCH_SIZE = 8
model = Net()
optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
