"""DataLoader hooks: the batch sampler the controller sizes, what each loader holds, and which loader trains."""

from paddle.io import DataLoader

from .batch import CTL
from .epoch import HEAD_BATCHES, epoch_head
from .report import save
from .shapes import itemsize, np_prod
from .signatures import sample_sig
from .state import COLLATING, R, St

_orig_dl_init = DataLoader.__init__
_orig_dl_iter = DataLoader.__iter__


class DynBatches:
    """A batch sampler over the loader's own one: the same indices in the same order, batch sizes chosen by
    :class:`Ctl`. It runs in the loader's prefetch thread, ahead of the script as in a real run (the prefetched
    batches are part of the measured peak), so a new size reaches the script a few batches after it is chosen."""

    def __init__(self, inner, loader):
        self.inner, self.loader = inner, loader
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)
        self.sampler = getattr(inner, "sampler", None)

    def __len__(self):
        return len(self.inner)

    def role(self):
        L = self.loader
        if L._autodl_role == "train" or (L._autodl_role is None and CTL.train_loader in (None, L)):
            return "train"
        return "eval"

    def __iter__(self):
        pending = []
        src = iter(self.inner)
        orig = self.batch_size or 1
        own = self.batch_size is None  # the sampler builds its batches (a bucketing one): its sizes, not Ctl's
        head, src = epoch_head(self, src)
        n_eval = n_train = 0
        while True:
            role = self.role()
            if role == "train":
                if R["train_done"]:
                    return
                self.loader._autodl_positions.append(CTL.k)
                if own:
                    try:
                        out = head if head is not None and n_train < HEAD_BATCHES else list(next(src))
                    except StopIteration:
                        return
                    CTL.own = True
                    CTL.intended[CTL.k] = len(out)
                    CTL.k += 1
                    n_train += 1
                    yield out
                    continue
                want = CTL.next_size(orig)
                if head is not None and n_train < HEAD_BATCHES:
                    n_train += 1
                    # the epoch's largest batch, its longest samples first: every measured size holds them
                    out = (head + [i for i in pending if i not in head])[:want]
                    while len(out) < want:
                        try:
                            out.extend(i for i in next(src) if i not in head)
                        except StopIteration:
                            break
                        out = out[:want]
                    if want != orig:
                        R["reduced"] = True
                    yield out
                    continue
            else:
                e = CTL.eval_batch(orig)
                want = max(1, e // 2) if n_eval == 0 else e
                n_eval += 1
            while len(pending) < want:
                try:
                    pending.extend(next(src))
                except StopIteration:
                    break
            if not pending or (len(pending) < want and self.drop_last):
                return
            out, pending = pending[:want], pending[want:]
            if want != orig:
                R["reduced"] = True
            yield out


def _dl_init(self, dataset, *a, **k):
    """``DataLoader(...)``: fewer workers, a collate marked, the batch sampler sized by the controller; recorded."""
    names = _orig_dl_init.__code__.co_varnames[2:_orig_dl_init.__code__.co_argcount]
    bound = dict(zip(names, a))
    bound.update(k)
    nw = bound.get("num_workers", 0)
    R["num_workers"].append(nw if isinstance(nw, int) else str(nw))
    if isinstance(nw, int) and nw > 2:
        bound["num_workers"] = 2  # fewer processes; batches still arrive through shared memory, as asked
    if bound.get("persistent_workers"):
        bound["persistent_workers"] = False
    if callable(bound.get("collate_fn")):
        bound["collate_fn"] = _collating(bound["collate_fn"])
    _orig_dl_init(self, dataset, **bound)
    self._autodl_role = None
    self._autodl_positions = []
    self._autodl_dataset, self._autodl_collate = dataset, bound.get("collate_fn")
    # batches the single-process loader holds ahead of the one in use (measured on Paddle 3.3.1: the blocking
    # queue's prefetch_factor, the buffered reader's two and the one its thread is pushing); with workers the
    # batches live in shared memory, outside the allocator
    single = not (isinstance(nw, int) and nw > 0)
    pf = bound.get("prefetch_factor", 2) or 2
    self._autodl_depth = (pf + (3 if bound.get("use_buffer_reader", True) else 2)) if single else 0
    self._autodl_batch = getattr(getattr(self, "batch_sampler", None), "batch_size", None) or bound.get("batch_size")
    info = {"batch_size": bound.get("batch_size", 1), "num_workers": nw if isinstance(nw, int) else None,
            "dataset": type(dataset).__name__}
    try:
        sample = dataset[0]
        info["first_sample"] = sample_sig(sample)
    except Exception as exc:  # an IterableDataset or a dataset that cannot be indexed
        info["first_sample"] = None
        info["sample_error"] = type(exc).__name__
    info["sample_bytes"] = sum(int(np_prod(d["shape"])) * itemsize(d["dtype"]) for d in info["first_sample"] or [])
    self._autodl_sample_bytes = info["sample_bytes"]
    self._autodl_index = len(R["loaders"])
    R["loaders"].append(info)
    if getattr(self, "batch_sampler", None) is not None:
        self.batch_sampler = DynBatches(self.batch_sampler, self)
        if getattr(self, "_batch_sampler", None) is not None:
            self._batch_sampler = self.batch_sampler
    save()


def _collating(fn):
    """``fn``, marked while it runs: the tensors a collate function creates are the batch the loader's sampler
    already sized (the dry run drives it), not tensors of the run's batch to shrink; the prefetch thread collates
    batches ahead of the step the schedule is at, so shrinking them to that step's size cut a batch's images and
    left its list of boxes whole (retinanet_multiscale)."""
    def collate(*a, **k):
        COLLATING.on = True
        try:
            return fn(*a, **k)
        finally:
            COLLATING.on = False
    return collate


def _dl_iter(self):
    """``iter(loader)``: stops a training loader once training is measured, an evaluation one after its batches."""
    it = _orig_dl_iter(self)

    def gen():
        n = 0
        try:
            while True:
                role = getattr(self, "_autodl_role", None)
                if role == "train" and R["train_done"]:
                    return
                if role == "eval" and n >= CTL.max_eval_batches:
                    return
                try:
                    batch = next(it)
                except StopIteration:
                    return
                n += 1
                St.last_loader = self
                pos = self._autodl_positions
                St.last_pos = pos.pop(0) if pos and getattr(self, "_autodl_role", None) != "eval" else None
                if St.window is not None and role != "eval":  # batches drawn per update: >1 is gradient accumulation
                    St.window["draws"] = St.window.get("draws", 0) + 1
                yield batch
        finally:
            try:
                it._try_shutdown_all()
            except Exception:
                pass
    return gen()


def install():
    """Hook ``paddle.io.DataLoader``'s ``__init__`` (its batch sampler, workers, collate) and ``__iter__``."""
    setattr(DataLoader, "__init__", _dl_init)
    setattr(DataLoader, "__iter__", _dl_iter)
