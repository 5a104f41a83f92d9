"""A training stand-in for the multi-host Celery test: holds some memory for a while (its own peak, RSS on
CPU), then writes its report to AUTODL_REPORT_FILE on the machine it runs on."""
import json
import os
import time

held = bytearray(64 << 20)  # 64 MiB touched, so the run's own peak is well above the interpreter's
for i in range(0, len(held), 4096):
    held[i] = 1
time.sleep(2.0)
with open(os.environ["AUTODL_REPORT_FILE"], "w") as fh:
    json.dump({"epoch": 1, "run_key": os.environ.get("AUTODL_RUN_KEY"), "resumed_from": None}, fh)
print("trained", os.environ.get("AUTODL_RUN_KEY"), flush=True)
