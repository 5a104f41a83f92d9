"""hwtest's own stand-in for nvidia-ml-py's ``pynvml`` (written from the public API, scenario-driven).

Scenario: JSON file named by $HWTEST_NVML ({"init": error name, "count_fail": error name, "bytes_strings": bool,
"devices": [{"uuid", "name", "memory": {"total", "used", "reserved"}, "util", "temp", "power_mw", "cc",
"fail": {field: error name}, "fail_after": {field: n}, "lost_after": n, "no_v2": bool,
"procs": [{"pid", "mem" (null = not available), "from_call": n}],
"mig": {"enabled": bool, "instances": [device...], "slot_fail": {"slot": error name}}}]}); fields are
name, uuid, handle, pci, memory, util, temp, power, mig_mode, mig_handle, procs. Error names are NVML's
(``GpuIsLost``, ``NotSupported``, ...). Call counters are kept per device UUID and field for the life of the
process (a GPU lost stays lost across nvmlInit). Every call is logged to $HWTEST_NVML_LOG when set.
Unknown nvml* functions raise NVMLError_NotSupported (a real driver that lacks a feature does the same),
after logging the name.
"""
import json, os, sys

NVML_SUCCESS = 0
_CODES = dict(Uninitialized=1, InvalidArgument=2, NotSupported=3, NoPermission=4, AlreadyInitialized=5,
              NotFound=6, InsufficientSize=7, InsufficientPower=8, DriverNotLoaded=9, Timeout=10,
              IrqIssue=11, LibraryNotFound=12, FunctionNotFound=13, CorruptedInforom=14, GpuIsLost=15,
              ResetRequired=16, OperatingSystem=17, LibRmVersionMismatch=18, InUse=19, Memory=20,
              NoData=21, InsufficientResources=23, ArgumentVersionMismatch=25, NotReady=27,
              GpuNotFound=28, Unknown=999)
_STRINGS = {1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions",
            5: "Already Initialized", 6: "Not Found", 7: "Insufficient Size", 8: "Insufficient External Power",
            9: "Driver Not Loaded", 10: "Timeout", 11: "Interrupt Request Issue",
            12: "NVML Shared Library Not Found", 13: "Function Not Found", 14: "Corrupted infoROM",
            15: "GPU is lost", 16: "GPU requires restart", 17: "The operating system has blocked the request.",
            18: "RM has detected an NVML/RM version mismatch.", 19: "In use by another client",
            20: "Insufficient Memory", 21: "No data", 23: "Insufficient Resources",
            25: "Argument Version Mismatch", 27: "Not Ready", 28: "GPU not found", 999: "Unknown Error"}

for _n, _v in _CODES.items():
    _cn = "NVML_ERROR_" + "".join("_" + c if c.isupper() else c.upper() for c in _n).lstrip("_")
    globals()[_cn] = _v
NVML_ERROR_UNKNOWN = 999
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_INVALID_ARGUMENT = 2

_classmap = {}


class NVMLError(Exception):
    def __new__(cls, value):
        if cls is NVMLError and value in _classmap:
            cls = _classmap[value]
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value):
        self.value = value

    def __str__(self):
        return _STRINGS.get(self.value, "Unknown Error")

    def __eq__(self, other):
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


for _n, _v in _CODES.items():
    def _mk(v):
        def __new__(typ):
            obj = NVMLError.__new__(typ, v)
            return obj
        def __init__(self):
            self.value = v
        return __new__, __init__
    _new, _init = _mk(_v)
    _cls = type("NVMLError_" + _n, (NVMLError,), {"__new__": _new, "__init__": _init})
    globals()[_cls.__name__] = _cls
    _classmap[_v] = _cls


def nvmlExceptionClass(code):
    return _classmap[code]


def nvmlErrorString(code):
    return _STRINGS.get(code, "Unknown Error")


NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_GRAPHICS = 0
NVML_VALUE_NOT_AVAILABLE_ulonglong = 0xFFFFFFFFFFFFFFFF
nvmlMemory_v2 = 40 | (2 << 24)

_LOG = os.environ.get("HWTEST_NVML_LOG")


def _log(msg):
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(f"{os.getpid()} {msg}\n")


def _scenario():
    path = os.environ.get("HWTEST_NVML")
    if not path:
        return {"init": "LibraryNotFound"}
    with open(path) as f:
        return json.load(f)


_S = None
_init = 0
_calls = {}


def _err(name):
    raise _classmap[_CODES[name]]()


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        return f"_Obj({self.__dict__})"


class _Handle:
    def __init__(self, dev, parent=None, mig_index=None):
        self.dev = dev
        self.parent = parent
        self.mig_index = mig_index

    def __repr__(self):
        return f"<fake handle {self.dev.get('uuid')}>"


def _need_init():
    if not _init:
        _err("Uninitialized")


def _field(h, key, fn):
    """Apply the scenario's failure rules for this device and field."""
    _need_init()
    d = h.dev
    n = _calls[(d.get("uuid"), key)] = _calls.get((d.get("uuid"), key), 0) + 1
    _log(f"{fn} {d.get('uuid')} call#{n}")
    fail = d.get("fail", {}).get(key)
    if fail:
        after = d.get("fail_after", {}).get(key, 0)   # succeed this many calls first
        if n > after:
            _err(fail)
    if d.get("lost_after") is not None and n > d["lost_after"]:
        _err("GpuIsLost")


def nvmlInit():
    global _S, _init
    _S = _scenario()
    _log("nvmlInit")
    if _S.get("init"):
        _err(_S["init"])
    _init += 1


nvmlInitWithFlags = lambda flags=0: nvmlInit()


def nvmlShutdown():
    global _init
    _log("nvmlShutdown")
    _need_init()
    _init -= 1


def nvmlSystemGetDriverVersion():
    _need_init()
    return _S.get("driver", "550.54.15")


def nvmlSystemGetNVMLVersion():
    _need_init()
    return "12.550.54.15"


def nvmlSystemGetCudaDriverVersion():
    _need_init()
    return 12040


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion


def nvmlDeviceGetCount():
    _need_init()
    _log("nvmlDeviceGetCount")
    if _S.get("count_fail"):
        _err(_S["count_fail"])
    return len(_S.get("devices", []))


def nvmlDeviceGetHandleByIndex(i):
    _need_init()
    devs = _S.get("devices", [])
    if i >= len(devs):
        _err("InvalidArgument")
    d = devs[i]
    if d.get("fail", {}).get("handle"):
        _err(d["fail"]["handle"])
    return _Handle(d)


def nvmlDeviceGetHandleByUUID(uuid):
    _need_init()
    for d in _S.get("devices", []):
        if d.get("uuid") == uuid:
            return _Handle(d)
        for j, m in enumerate(d.get("mig", {}).get("instances", [])):
            if m.get("uuid") == uuid:
                return _Handle(m, parent=d, mig_index=j)
    _err("NotFound")


def nvmlDeviceGetIndex(h):
    _field(h, "index", "nvmlDeviceGetIndex")
    return _S["devices"].index(h.dev) if h.parent is None else _S["devices"].index(h.parent)


def nvmlDeviceGetName(h):
    _field(h, "name", "nvmlDeviceGetName")
    name = h.dev.get("name", "NVIDIA A100-SXM4-40GB")
    return name.encode() if _S.get("bytes_strings") else name


def nvmlDeviceGetUUID(h):
    _field(h, "uuid", "nvmlDeviceGetUUID")
    u = h.dev["uuid"]
    return u.encode() if _S.get("bytes_strings") else u


def nvmlDeviceGetSerial(h):
    _field(h, "serial", "nvmlDeviceGetSerial")
    return "1320000000000"


def nvmlDeviceGetPciInfo(h):
    _field(h, "pci", "nvmlDeviceGetPciInfo")
    i = _S["devices"].index(h.dev) if h.dev in _S["devices"] else 0
    bus = f"00000000:{0x17 + i:02X}:00.0"
    return _Obj(busId=bus.encode() if _S.get("bytes_strings") else bus, busIdLegacy=bus[4:], domain=0,
                bus=0x17 + i, device=0, pciDeviceId=0x20B010DE, pciSubSystemId=0)


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetMemoryInfo(h, version=None):
    _field(h, "memory", "nvmlDeviceGetMemoryInfo(v2)" if version else "nvmlDeviceGetMemoryInfo(v1)")
    m = h.dev.get("memory", {"total": 40 << 30, "used": 0})
    if version and h.dev.get("no_v2"):
        _err("FunctionNotFound")
    total, used = m["total"], m["used"]
    reserved = m.get("reserved", 0)
    if version:
        free = total - used - reserved
        return _Obj(version=version, total=total, reserved=reserved, used=used,
                    free=free & 0xFFFFFFFFFFFFFFFF)
    # v1: driver-reserved counts as used
    free = total - used - reserved
    return _Obj(total=total, used=used + reserved, free=free & 0xFFFFFFFFFFFFFFFF)


def nvmlDeviceGetUtilizationRates(h):
    _field(h, "util", "nvmlDeviceGetUtilizationRates")
    u = h.dev.get("util", 0)
    return _Obj(gpu=u, memory=h.dev.get("mem_util", 0))


def nvmlDeviceGetTemperature(h, sensor=0):
    _field(h, "temp", "nvmlDeviceGetTemperature")
    return h.dev.get("temp", 40)


def nvmlDeviceGetPowerUsage(h):
    _field(h, "power", "nvmlDeviceGetPowerUsage")
    return h.dev.get("power_mw", 60000)


def nvmlDeviceGetEnforcedPowerLimit(h):
    _field(h, "power_limit", "nvmlDeviceGetEnforcedPowerLimit")
    return h.dev.get("power_limit_mw", 400000)


nvmlDeviceGetPowerManagementLimit = nvmlDeviceGetEnforcedPowerLimit


def nvmlDeviceGetCudaComputeCapability(h):
    _field(h, "cc", "nvmlDeviceGetCudaComputeCapability")
    return tuple(h.dev.get("cc", (8, 0)))


def nvmlDeviceGetMigMode(h):
    _field(h, "mig_mode", "nvmlDeviceGetMigMode")
    if "mig" not in h.dev:
        if h.dev.get("mig_not_supported", True):
            _err("NotSupported")
    on = 1 if h.dev.get("mig", {}).get("enabled") else 0
    return [on, on]


def nvmlDeviceGetMaxMigDeviceCount(h):
    _field(h, "mig_count", "nvmlDeviceGetMaxMigDeviceCount")
    return 7 if "mig" in h.dev else 0


def nvmlDeviceGetMigDeviceHandleByIndex(h, i):
    _field(h, "mig_handle", "nvmlDeviceGetMigDeviceHandleByIndex")
    inst = h.dev.get("mig", {}).get("instances", [])
    slot_fail = h.dev.get("mig", {}).get("slot_fail", {}).get(str(i))
    if slot_fail:
        _err(slot_fail)
    if i >= len(inst):
        _err("NotFound")
    return _Handle(inst[i], parent=h.dev, mig_index=i)


def nvmlDeviceIsMigDeviceHandle(h):
    _need_init()
    return 1 if h.parent is not None else 0


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h):
    _need_init()
    if h.parent is None:
        _err("InvalidArgument")
    return _Handle(h.parent)


def nvmlDeviceGetGpuInstanceId(h):
    _need_init()
    if h.parent is None:
        _err("InvalidArgument")
    return h.dev.get("gi", h.mig_index + 1)


def nvmlDeviceGetComputeInstanceId(h):
    _need_init()
    if h.parent is None:
        _err("InvalidArgument")
    return 0


def nvmlDeviceGetAttributes(h):
    _field(h, "attributes", "nvmlDeviceGetAttributes")
    if h.parent is None:
        return _Obj(multiprocessorCount=108, sharedCopyEngineCount=0, sharedDecoderCount=0,
                    sharedEncoderCount=0, sharedJpegCount=0, sharedOfaCount=0, gpuInstanceSliceCount=7,
                    computeInstanceSliceCount=7, memorySizeMB=40960)
    sl = h.dev.get("slices", 1)
    return _Obj(multiprocessorCount=14 * sl, sharedCopyEngineCount=1, sharedDecoderCount=0,
                sharedEncoderCount=0, sharedJpegCount=0, sharedOfaCount=0, gpuInstanceSliceCount=sl,
                computeInstanceSliceCount=sl, memorySizeMB=h.dev.get("memory", {}).get("total", 5 << 30) >> 20)


nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes


def _procs(h, key):
    _field(h, "procs", key)
    n = _calls[(h.dev.get("uuid"), "procs")]
    return [_Obj(pid=p["pid"], usedGpuMemory=p.get("mem"), gpuInstanceId=0xFFFFFFFF,
                 computeInstanceId=0xFFFFFFFF) for p in h.dev.get("procs", [])
            if n >= p.get("from_call", 0)]


def nvmlDeviceGetComputeRunningProcesses(h):
    return _procs(h, "nvmlDeviceGetComputeRunningProcesses")


nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetGraphicsRunningProcesses(h):
    _field(h, "procs", "nvmlDeviceGetGraphicsRunningProcesses")
    return []


nvmlDeviceGetGraphicsRunningProcesses_v2 = nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses


def __getattr__(name):
    if name.startswith("nvml"):
        _log(f"UNKNOWN-ATTR {name}")

        def _ns(*a, **k):
            _need_init()
            _err("NotSupported")
        return _ns
    raise AttributeError(name)
