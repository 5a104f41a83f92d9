"""autodl's startup hook in a training process: reports the process's own memory peaks, without touching the script.

Details: docs/launchers.md#autodllaunchchild_pathsitecustomize.
"""

import os
import sys


def _chain_next_sitecustomize():
    """Run the ``sitecustomize`` this one shadows (the next one on ``sys.path``), if any."""
    try:
        import importlib.machinery
        import importlib.util

        here = os.path.dirname(os.path.abspath(__file__))
        rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None or os.path.dirname(os.path.abspath(spec.origin or "")) == here:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["_autodl_shadowed_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - the environment's own hook failing is not ours to report
        pass


_chain_next_sitecustomize()


class _PeakReporter:
    def __init__(self, path):
        self.path = path
        self.steps = 0
        self.last = None
        self.depth = 0
        self.strategy = None

    def peaks(self):
        import paddle

        place = str(paddle.device.get_device())
        if place.startswith("cpu"):
            core = paddle.base.core
            return place, int(core.host_memory_stat_peak_value("Allocated", 0)), \
                int(core.host_memory_stat_peak_value("Reserved", 0))
        device = getattr(paddle, "device", None)
        try:
            return place, int(device.max_memory_allocated(place)), int(device.max_memory_reserved(place))
        except Exception:  # noqa: BLE001 - older Paddle: the CUDA-only API
            index = int(place.split(":", 1)[1]) if ":" in place else 0
            return place, int(paddle.device.cuda.max_memory_allocated(index)), \
                int(paddle.device.cuda.max_memory_reserved(index))

    def report(self, final=False):
        import json
        import time

        try:
            place, allocated, reserved = self.peaks()
        except Exception:  # noqa: BLE001
            return
        if not final and self.last == (place, allocated, reserved):
            return
        if final and self.steps == 0 and (not reserved or place.startswith("cpu")):
            return  # a process that never trained (e.g. paddle.distributed.launch itself)
        self.last = (place, allocated, reserved)
        device = place
        # in a container the visibility variable lists positions: AUTODL_DEVICE_IDS has the host's ids in that order
        visible = os.environ.get("AUTODL_DEVICE_IDS") or os.environ.get(os.environ.get("AUTODL_VISIBLE_ENV", ""), "")
        if ":" in place and visible:
            ids = [v for v in visible.split(",") if v]
            try:
                device = ids[int(place.split(":", 1)[1])]
            except (ValueError, IndexError):
                device = place
        row = {"kind": "memory", "t": time.time(), "pid": os.getpid(), "rank": os.environ.get("PADDLE_TRAINER_ID", "0"),
               "place": place, "device": device, "step": self.steps, "allocated_peak_bytes": allocated,
               "reserved_peak_bytes": reserved, "final": final}
        if self.strategy is None:
            try:
                import paddle

                self.strategy = str(paddle.get_flags(["FLAGS_allocator_strategy"])["FLAGS_allocator_strategy"])
            except Exception:  # noqa: BLE001
                self.strategy = ""
        if self.strategy:
            row["allocator_strategy"] = self.strategy
        try:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        except OSError:
            pass

    def wrap(self, fn):
        import functools

        if getattr(fn, "_autodl_wrapped", False):
            return fn
        reporter = self

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            reporter.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                reporter.depth -= 1
                if reporter.depth == 0:
                    reporter.steps += 1
                    reporter.report()

        wrapped._autodl_wrapped = True
        return wrapped

    def patch_class(self, cls):
        for name in ("step", "minimize"):
            if name in cls.__dict__ and callable(cls.__dict__[name]):
                try:
                    setattr(cls, name, self.wrap(cls.__dict__[name]))
                except Exception:  # noqa: BLE001
                    pass

    def patch_optimizers(self, module):
        base = getattr(module, "Optimizer", None)
        if base is None:
            return
        seen, todo = set(), [base]
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            self.patch_class(cls)
            todo.extend(cls.__subclasses__())
        reporter = self
        original = base.__dict__.get("__init_subclass__")

        def init_subclass(cls, **kwargs):
            if original is not None:
                original.__func__(cls, **kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            reporter.patch_class(cls)

        try:
            base.__init_subclass__ = classmethod(init_subclass)
        except Exception:  # noqa: BLE001
            pass


def _install(path):
    import atexit
    import importlib.abc

    reporter = _PeakReporter(path)

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, target_path=None, target=None):
            if fullname != "paddle.optimizer":
                return None

            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, target_path, target)
                if spec is not None and spec.loader is not None:
                    loader = spec.loader
                    exec_module = loader.exec_module

                    def exec_and_patch(module, _exec=exec_module):
                        _exec(module)
                        try:
                            reporter.patch_optimizers(module)
                        except Exception:  # noqa: BLE001
                            pass

                    try:
                        loader.exec_module = exec_and_patch
                    except Exception:  # noqa: BLE001
                        return None
                    return spec
            return None

    sys.meta_path.insert(0, _Finder())
    atexit.register(lambda: reporter.report(final=True) if "paddle" in sys.modules else None)


RELAY_EVERY_S = 0.5
"""Seconds between two relays of the run's files to stderr (the follower polls every 0.5-5 s)."""

RELAY_PREFIX = "@autodl-runfact "
"""Must equal :data:`autodl.runfacts.PREFIX` (this file imports nothing of autodl: it runs in the training)."""

MAX_REPORT_BYTES = 65536
"""A report larger than this is not relayed (:data:`autodl.runfacts.MAX_REPORT_BYTES`)."""


class _Relay:
    def __init__(self, metrics_path, report_path):
        self.metrics_path = metrics_path
        self.report_path = report_path
        self.offset = 0
        self.partial = b""
        self.report_seen = None
        self.lock = None

    def emit(self, channel, payload):
        try:
            os.write(2, (RELAY_PREFIX + channel + " " + payload + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    def metrics(self):
        if not self.metrics_path:
            return
        try:
            with open(self.metrics_path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace").strip()
            if text:
                self.emit("metrics", text)

    def report(self):
        import json

        if not self.report_path:
            return
        try:
            st = os.stat(self.report_path)
            if (st.st_mtime_ns, st.st_size) == self.report_seen or st.st_size > MAX_REPORT_BYTES:
                return
            with open(self.report_path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return  # absent, or being written: the next relay sees it whole
        self.report_seen = (st.st_mtime_ns, st.st_size)
        self.emit("report", json.dumps(data, separators=(",", ":")))

    def once(self):
        import threading

        if self.lock is None:
            self.lock = threading.Lock()
        with self.lock:
            try:
                self.metrics()
                self.report()
            except Exception:  # noqa: BLE001 - relaying never breaks the training
                pass

    def loop(self):
        import time

        while True:
            time.sleep(RELAY_EVERY_S)
            self.once()


def _start_relay():
    import atexit
    import threading

    os.environ["AUTODL_RELAY_OWNER"] = str(os.getpid())
    relay = _Relay(os.environ.get("AUTODL_METRICS_FILE"), os.environ.get("AUTODL_REPORT_FILE"))
    relay.once()
    atexit.register(relay.once)  # registered before the peak hook's: runs after its final report
    threading.Thread(target=relay.loop, name="autodl-runfact-relay", daemon=True).start()


if os.environ.get("AUTODL_RUNFACTS") == "log" and not os.environ.get("AUTODL_RELAY_OWNER"):
    try:
        _start_relay()
    except Exception:  # noqa: BLE001
        pass

if os.environ.get("AUTODL_METRICS_FILE") and os.environ.get("AUTODL_PEAK_HOOK", "1") != "0":
    try:
        _install(os.environ["AUTODL_METRICS_FILE"])
    except Exception:  # noqa: BLE001
        pass
