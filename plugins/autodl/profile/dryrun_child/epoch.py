"""The walk over the training loader's first epoch: its largest batch, longest samples first (the head of the run)."""

import time

from .report import save
from .shapes import sig_bytes
from .signatures import sample_sig
from .state import R

HEAD_BATCHES = 12
"""Training batches of the first epoch made of its largest batch: the schedule's measured positions (two at each of
three sizes, :class:`Ctl`) and the batches the loader prefetches past them (up to five, ``_autodl_depth``)."""

EPOCH_WALK_S = 4.0
"""Seconds the walk over the first epoch may spend reading samples (a tenth of the dry run's budget,
``autodl.profile.dryrun.DRY_RUN_BUDGET_S`` = 40 s): a data set of small samples is read whole, a slow one (decoded
images) in part, and the report says so."""

EPOCH_WALK_SAMPLES = 50_000
"""Samples the walk reads at most (a CIFAR-sized epoch); the indices past it are not read."""


def epoch_head(dyn, src):
    """Walk the first epoch of the training loader's own batch sampler (indices, then each batch read the
    framework's way: its samples, through the loader's ``collate_fn`` when it has one) and return its largest
    batch by the bytes the collated batch holds, longest samples first, and the iterator of the epoch's batches
    (those walked, then the rest). ``(None, src)`` when it is not the training loader or its samples cannot be
    read; what was read is in ``R["epoch_walk"]``."""
    L = dyn.loader
    if dyn.role() != "train" or getattr(L, "_autodl_walked", False):
        return None, src
    L._autodl_walked = True
    t0 = time.monotonic()
    info = {"loader": L._autodl_index, "read": False, "complete": False, "batches": 0, "samples": 0,
            "seconds": 0.0, "largest_bytes": None, "first_bytes": None, "largest_at": None, "largest_batch": None}
    R["epoch_walk"].append(info)
    if _iterable(getattr(L, "dataset", None)):  # read in order, not by index: nothing to walk ahead of the steps
        info["in_order"] = True
        save()
        return None, src
    walked, best, best_b = [], None, -1
    states = _rng_states()
    try:
        for b in src:
            walked.append(list(b))
            nb = _batch_bytes(L, walked[-1])
            info["first_bytes"] = nb if info["first_bytes"] is None else info["first_bytes"]
            if nb > best_b:
                best, best_b = len(walked) - 1, nb
            info["samples"] += len(walked[-1])
            if time.monotonic() - t0 > EPOCH_WALK_S or info["samples"] >= EPOCH_WALK_SAMPLES:
                break
        else:
            info["complete"] = True
        head = None if best is None else _steady_head(L, walked[best], best_b, info)
    except Exception as exc:  # noqa: BLE001 - a sample or a collate that fails here fails the run in its place
        info["error"] = f"{type(exc).__name__}: {exc}"[:200]
    _rng_restore(states)
    info["batches"], info["seconds"] = len(walked), round(time.monotonic() - t0, 3)
    rest = _chain(walked, src)
    if best is None or info.get("error"):
        info["samples"] = 0
        return None, rest
    info.update(read=True, largest_bytes=best_b, largest_at=best, largest_batch=len(walked[best]))
    save()
    return head, rest


def _iterable(dataset):
    """Whether ``dataset`` is a ``paddle.io.IterableDataset`` (by its classes' names: the child does not import Paddle
    before the script does)."""
    return dataset is not None and any(c.__name__ == "IterableDataset" for c in type(dataset).__mro__)


def _steady_head(L, idx, nb, info):
    """The largest batch ``idx`` (``nb`` bytes when walked), longest samples first, when reading it again gives the
    same bytes; None when the data set draws its sizes anew at every read (a random resize in ``__getitem__``): then
    what the walk read is not what the steps get, ``info["varies"]`` says so and the steps run as the loader yields."""
    if _batch_bytes(L, idx) != nb:
        info["varies"] = True
        return None
    return _longest_first(L, idx)


def _rng_states():
    """Python's and NumPy's global generators, which a data set's random augmentation draws from: the walk's reads
    leave them as they were, so the steps draw what they would have drawn without the walk."""
    import random

    import numpy as np
    return random.getstate(), np.random.get_state()


def _rng_restore(states):
    import random

    import numpy as np
    random.setstate(states[0])
    np.random.set_state(states[1])


def _chain(walked, src):
    yield from walked
    yield from src


def _batch_bytes(L, idx):
    """Bytes of the tensors the loader makes of the samples ``idx`` (its ``collate_fn`` pads as it pads)."""
    items = [L._autodl_dataset[i] for i in idx]
    if L._autodl_collate is None:
        return sum(sig_bytes(sample_sig(x)) for x in items)
    return sig_bytes(sample_sig(L._autodl_collate(items)))


def _longest_first(L, idx):
    """``idx`` with, first, the samples longest in some dimension of some field (a batch of the first ``k`` is padded
    to the whole batch's lengths when ``k`` covers them), then the rest by their bytes."""
    sigs = {i: sample_sig(L._autodl_dataset[i]) for i in idx}
    first = []
    for f in range(min(len(s) for s in sigs.values())):
        for d in range(min(len(s[f]["shape"]) for s in sigs.values())):
            i = max(idx, key=lambda j: sigs[j][f]["shape"][d])
            if i not in first:
                first.append(i)
    return first + sorted((i for i in idx if i not in first), key=lambda j: -sig_bytes(sigs[j]))
