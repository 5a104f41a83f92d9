"""Stand-ins for Paddle's own data sets that cannot download in the sandbox (CIFAR, MNIST): random samples of the
real file format, read by Paddle's own reader."""

import importlib
import os

from .report import note
from .state import R

STANDIN_SAMPLES = {"train": 1000, "test": 200}
"""Samples of a stand-in data set (per mode): enough batches for the dry run's steps, a few MiB on disk; multiples
of 100, as Paddle's MNIST reader reads 100 at a time (``buffer_size=100`` in ``paddle.vision.datasets.mnist``)."""


def _standin_file(url):
    """A file of the real format (Paddle's own reader parses it) with random samples, for a data set of Paddle's
    own that cannot download here: CIFAR-10/100 (a tar.gz of pickled batches: uint8 [N, 3072], labels) and the
    MNIST family (gzip idx files: uint8 [N, 28, 28] images, uint8 labels). None for any other URL."""
    import gzip
    import io
    import pickle
    import struct
    import tarfile

    import numpy as np

    name = url.rsplit("/", 1)[-1]
    path = os.path.join(os.getcwd(), ".autodl-standin", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(0)
    if name.startswith("cifar-"):
        k = 100 if "100" in name else 10
        key = b"fine_labels" if k == 100 else b"labels"
        members = {"train": "cifar-100-python/train" if k == 100 else "cifar-10-batches-py/data_batch_1",
                   "test": "cifar-100-python/test" if k == 100 else "cifar-10-batches-py/test_batch"}
        with tarfile.open(path, "w:gz") as tf:
            for mode, member in members.items():
                n = STANDIN_SAMPLES[mode]
                blob = pickle.dumps({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                                     key: [int(i % k) for i in range(n)]})
                info = tarfile.TarInfo(member)
                info.size = len(blob)
                tf.addfile(info, io.BytesIO(blob))
        return path
    if name.endswith("-ubyte.gz"):
        n = STANDIN_SAMPLES["test" if name.startswith("t10k") else "train"]
        with gzip.open(path, "wb") as f:
            if "images" in name:
                f.write(struct.pack(">IIII", 2051, n, 28, 28) + rng.integers(0, 256, n * 784, dtype=np.uint8).tobytes())
            else:
                f.write(struct.pack(">II", 2049, n) + bytes(i % 10 for i in range(n)))
        return path
    return None


def _patch_download(mod):
    orig = getattr(mod, "_check_exists_and_download", None)
    if orig is None:
        return

    def check(path, url, md5, module_name, download=True):
        try:
            return orig(path, url, md5, module_name, download)
        except Exception as exc:  # noqa: BLE001 - no network in the sandbox: a stand-in of the same format
            standin = _standin_file(url) if path is None else None
            if standin is None:
                raise
            R["standins"].append(url.rsplit("/", 1)[-1])
            note(f"Paddle's own data set file {url.rsplit('/', 1)[-1]} could not be downloaded here "
                 f"({type(exc).__name__}); random samples of its format stood in, through the script's own transform")
            return standin

    setattr(mod, "_check_exists_and_download", check)


def install():
    """Hook the download of ``paddle.vision.datasets``' CIFAR and MNIST readers."""
    R["standins"] = []
    for m in ("paddle.vision.datasets.cifar", "paddle.vision.datasets.mnist"):
        try:
            _patch_download(importlib.import_module(m))
        except Exception:  # noqa: BLE001 - a Paddle without the module: nothing to stand in for
            pass
