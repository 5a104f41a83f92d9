"""A training stand-in for the multi-host tests: says where it runs and which devices it was given."""
import os
import socket

print("trained on", os.environ.get("AUTODL_HOST") or socket.gethostname(),
      "devices:", repr(os.environ.get("CUDA_VISIBLE_DEVICES")), flush=True)
