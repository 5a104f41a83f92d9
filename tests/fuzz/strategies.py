"""Hypothesis strategies for what users hand autodl: spec and pool YAML files, and training scripts.

They produce the kinds of input the first fuzzing round found harmful (issue 13): YAML numbers and tags, deep
nesting, aliases that expand, duplicate keys, binary and non-UTF-8 bytes, huge and infinite sizes, root users
and socket mounts in every spelling, long names, and scripts with long expression chains, huge constants and
statements Python refuses to compile — mixed with valid values, so that valid results are checked too.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

# ------------------------------------------------------------------------------------ YAML scalars
INT_FRAGMENTS = ["0", "-1", "1", "7", "64", "1_000", "0x1F", "017", "+12", "9223372036854775807", "9223372036854775808",
                 "-9223372036854775809", "1" + "0" * 400, "1" * 4301, "1:30", "0b101", "2000000", "16777217"]
FLOAT_FRAGMENTS = [".inf", "-.inf", ".Inf", ".nan", ".NaN", "1e400", "1.0e+400", "-0.0", "0.5", "1.5", "0.85", "3.4e+38",
                   "1.0e-400", "2.5", "-3.75", "1e3"]
BOOL_FRAGMENTS = ["true", "false", "yes", "no", "on", "off", "True", "~", "null"]
TAG_FRAGMENTS = ["!!int 'x'", "!!int '12'", "!!float 'q'", "!!bool maybe", "!!str 5", "!!null ''",
                 "!!python/object/apply:os.system ['true']", "!!python/name:os.system", "!!binary aGk=",
                 "!foo bar", "!!timestamp 2020-01-01", "!!set {a}", "!!omap [{a: 1}]", "!<tag:yaml.org,2002:int> '3'"]
SIZE_FRAGMENTS = ["8g", "'8g'", "512m", "8GiB", "'1.5 GB'", "-1", "0", "99999999999999999t", "'1e3g'", "'8 x'",
                  "1125899906842625", "'0.0001k'", "' 8g '", "'\uff18g'"]
PATH_FRAGMENTS = ["/var/run", "/run", "/", "/var/run/docker.sock/.", "//var//run/", "/var/lib/../run", "/var",
                  "/run/docker.sock", "/var/run/docker.sock", "/data/sets", "/mnt/ckpt", "relative/x", "''",
                  "/run/containerd/containerd.sock", "/home/u/docker.sock", "/data/../var/run", "'/tmp\\x00x'",
                  # sectest: host system trees, a folder holding PostgreSQL's socket, Docker's bind syntax
                  "/proc", "/proc/1", "/sys/fs", "/dev", "/etc", "/etc/../etc/ssl", "/root", "/var/lib/docker", "/tmp",
                  "'/data:/host:rw'", "/data/a,b"]
USER_FRAGMENTS = ["'0:1000'", "'00'", "root", "'root:1000'", "'-0'", "'0'", "0", "'1000:1000'", "1000:1000", "'+1000'",
                  "1000", "'\uff11\uff10\uff10\uff10'", "'4294967295'", "'1000:0'", "trainer", "' 1000'", "'1000:root'",
                  "'000:0'", "'0x3e8'", "'65534:0'", "'1000:00'", "'65534:65534'"]
NETWORK_FRAGMENTS = ["none", "bridge", "host", "HOST", "' host'", "'container:abc'", "'Container:x'", "my-net", "''"]
DEVICE_FRAGMENTS = ["/dev/kfd", "/dev/dri", "/dev/dri/renderD128", "/dev/davinci3", "/dev/sda", "/dev/mem", "/dev/kmsg",
                    "'/dev/kfd:/dev/kfd:rwm'", "'/dev/sda:/dev/kfd'", "'/dev/kfd:/dev/x:rwx'", "/dev/../dev/sda",
                    "/dev/dri/../sda", "'/dev/nvidia0'", "relative", "/dev/xpu1"]
NAME_FRAGMENTS = ["A100-SXM4-40GB", "V100-PCIE-32GB", "T4", "RTX-3090", "Ascend-910", "nonexistent", "''", "a" * 300,
                  "'\u0000'", "'\u202e'", "'x\ny'"]


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of ``choices`` with the given weights. (``st.one_of`` gives each *distinct* strategy the same
    chance, and ``st.floats(0, 1)`` leans towards 0, so neither can weight.)"""
    total = sum(w for w, _ in choices)

    def pick(r: int) -> st.SearchStrategy:
        for w, strategy in choices:
            if r < w:
                return strategy
            r -= w
        return choices[-1][1]

    return st.integers(0, total - 1).flatmap(pick)


def chance(draw, percent: int) -> bool:
    """True with about ``percent`` % probability (Hypothesis leans integers towards their lower bound: the
    rare outcome sits at the top)."""
    return draw(st.integers(0, 99)) >= 100 - percent


def yaml_quote(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (escapes YAML reads: \\uXXXX, \\UXXXXXXXX)."""
    out = []
    for c in text:
        o = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif o < 0x20 or 0x7F <= o <= 0x9F or o in (0xFEFF, 0xFFFE, 0xFFFF):
            out.append(f"\\u{o:04x}")
        elif o > 0xFFFF:
            out.append(f"\\U{o:08x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def quoted_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """A YAML double-quoted string of any characters but lone surrogates (which YAML refuses: they come from raw
    text now and then)."""
    return st.text(st.characters(exclude_categories=("Cs",)), max_size=max_size).map(yaml_quote)


def scalar() -> st.SearchStrategy[str]:
    """Any YAML scalar fragment, from harmless to hostile."""
    return st.one_of(
        st.sampled_from(INT_FRAGMENTS), st.sampled_from(FLOAT_FRAGMENTS), st.sampled_from(BOOL_FRAGMENTS),
        st.sampled_from(TAG_FRAGMENTS), st.sampled_from(SIZE_FRAGMENTS), st.sampled_from(PATH_FRAGMENTS),
        st.sampled_from(USER_FRAGMENTS), st.sampled_from(NAME_FRAGMENTS),
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.floats(allow_nan=False, allow_infinity=False).map(repr).map(lambda r: r if "." in r or "e" in r else r + ".0"),
        quoted_text(),
    )


def flow(value) -> str:
    """Render a tree of fragments in YAML flow style: dict -> {k: v}, list -> [a, b], str -> as is."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return value


def nested(depth: int, leaf: str, kind: str) -> str:
    return ("[" * depth + leaf + "]" * depth) if kind == "list" else ("{a: " * depth + leaf + "}" * depth)


HOSTILE = 20
"""Chance (percent) that a field gets a hostile value instead of a typical one: with a handful of fields per section, about
half of the documents stay valid, so acceptance is checked as often as refusal."""


@st.composite
def value_for(draw, typical: st.SearchStrategy[str]) -> str:
    """A field's value: usually a typical one, else a hostile scalar, a list, a mapping or deep nesting."""
    if not chance(draw, HOSTILE):
        return draw(typical)
    return draw(st.one_of(
        scalar(), scalar(), scalar(),
        st.lists(scalar(), max_size=4).map(flow),
        st.dictionaries(st.sampled_from(["a", "b", "type", "0"]), scalar(), max_size=3).map(flow),
        st.tuples(st.integers(1, 300), scalar(), st.sampled_from(["list", "map"])).map(lambda t: nested(*t)),
    ))


@st.composite
def section(draw, fields: dict[str, st.SearchStrategy[str]]) -> str:
    """A spec section: a subset of its fields (now and then an unknown key), each with a fuzzed value."""
    keys = draw(st.lists(st.sampled_from(sorted(fields)), max_size=len(fields), unique=True))
    if chance(draw, 3):
        keys.append("unknwon_key")
    values = [draw(value_for(fields.get(k, scalar()))) for k in keys]
    return "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, values)) + "}"


ints = st.sampled_from(["1", "8", "64", "2", "3"])
TASK = {"model_name": quoted_text(), "script": st.sampled_from(["model.py", "'model.py'", "missing.py", "/", "''",
                                                                  "'" + "a" * 300 + ".py'"]),
        "args": st.lists(quoted_text(10), max_size=3).map(flow), "batch_size_per_gpu": ints,
        "sequence_length": ints, "input_shape": st.lists(ints, min_size=1, max_size=4).map(flow),
        "num_gpus_estimate": st.sampled_from(["auto", "1", "2", "0", "-1"]), "probe": st.sampled_from(["true", "false"]),
        "framework": st.sampled_from(["paddle", "paddlepaddle"]), "type": quoted_text()}
POLICY = {"memory_threshold": st.sampled_from(["0.85", "0.5", "1", "1.0", "0"]),
          "allow_mixed_precision": st.sampled_from(["true", "false"]),
          "distributed_strategy": st.sampled_from(["none", "data_parallel", "fleet", "bogus"]),
          "preferred_devices": st.lists(st.sampled_from(NAME_FRAGMENTS), max_size=3).map(flow),
          "tag_priorities": st.dictionaries(st.sampled_from(["domestic", "cheap"]),
                                            st.sampled_from(["1.0", "0.5", "-2", "1"]), max_size=2).map(flow),
          "allowed_vendors": st.lists(st.sampled_from(["nvidia", "ascend", "nope"]), max_size=3).map(flow)}
SCHEDULER = {"algorithm": st.sampled_from(["rule_based", "rl_based", "x"]), "timeout": ints,
             "poke_interval": ints}
MOUNT = st.fixed_dictionaries({"source": st.sampled_from(PATH_FRAGMENTS), "target": st.sampled_from(PATH_FRAGMENTS)},
                              optional={"read_only": st.sampled_from(["true", "false", "1"])}).map(flow)
LAUNCHER = {"type": st.sampled_from(["local", "docker", "kubernetes", "slurm"]), "image": quoted_text(),
            "user": st.sampled_from(USER_FRAGMENTS), "shm_size": st.sampled_from(SIZE_FRAGMENTS),
            "memory_limit": st.sampled_from(SIZE_FRAGMENTS), "cpus": st.sampled_from(["1", "2.5", "0.5", "8192"]),
            "mounts": st.lists(MOUNT, max_size=2).map(flow),
            "env": st.dictionaries(st.sampled_from(["A", "HF_TOKEN", "1BAD", "X Y"]), quoted_text(10), max_size=2).map(flow),
            "ipc_mode": st.sampled_from(["private", "host", "shareable"]), "network": st.sampled_from(NETWORK_FRAGMENTS),
            "code_dir": st.sampled_from(["/workspace", "/", "rel", "/w/"]),
            "command": st.lists(quoted_text(10), max_size=2).map(flow),
            "devices": st.lists(st.sampled_from(DEVICE_FRAGMENTS), max_size=2).map(flow)}
SECTIONS = {"task": section(TASK), "resource_policy": section(POLICY), "scheduler": section(SCHEDULER),
            "launcher": st.one_of(section(LAUNCHER), st.sampled_from(["docker", "kubernetes", "local", "slurm"]))}


@st.composite
def laughs(draw) -> str:
    """Aliases of aliases ("billion laughs"), small or explosive, referenced from a spec field."""
    levels, fanout = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    lines = ["l0: &l0 [" + ", ".join(["'lol'"] * fanout) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fanout) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\ntask: {{script: model.py, args: *l{levels - 1}}}\n"


@st.composite
def spec_document(draw) -> str:
    """A whole spec file's text; now and then a section twice (a duplicate key) or an unknown one."""
    keys = draw(st.lists(st.sampled_from(sorted(SECTIONS)), max_size=4, unique=True))
    if chance(draw, 5):
        keys.append(draw(st.sampled_from(["task", "launcher", "extra"])))
    lines = [f"{k}: {draw(SECTIONS.get(k, value_for(scalar())))}" for k in keys]
    return "\n".join(lines) + "\n"


def spec_bytes() -> st.SearchStrategy[bytes]:
    """Spec files as bytes: mostly structured documents, also aliases, deep nesting, binary and non-UTF-8."""
    text = weighted((80, spec_document()), (5, laughs()),
                    (4, st.integers(1, 3000).map(lambda n: "task: " + "[" * n + "]" * n + "\n")),
                    (4, st.integers(1, 400).map(lambda n: "task:\n" + "".join("  " * i + "- \n" for i in range(n)))),
                    (7, st.text(max_size=200)))
    raw = text.map(lambda s: s.encode("utf-8", "surrogatepass"))
    odd = st.one_of(st.binary(max_size=200), text.map(lambda s: b"\xff\xfe\x00" + s.encode("utf-8", "surrogatepass")),
                    text.map(lambda s: s.encode("utf-16")), st.just("name: caf\xe9\n".encode("latin-1")),
                    text.map(lambda s: b"\xef\xbb\xbf" + s.encode("utf-8", "surrogatepass")))
    return weighted((85, raw), (15, odd))


# ------------------------------------------------------------------------------------------- pools
DEVICE = {"index": st.integers(0, 15).map(str),
          "model": st.sampled_from(["A100-SXM4-40GB", "V100-PCIE-32GB", "T4", "RTX-3090", "H100-SXM5-80GB", "Ascend-910"]),
          "uuid": st.integers(0, 99).map(lambda i: f"GPU-{i:04d}"),
          "vendor": st.sampled_from(["nvidia", "ascend"]), "host": st.sampled_from(["h1", "h2"]),
          "memory_total_bytes": st.sampled_from(["42949672960", "17179869184", "85899345920", "1024"]),
          "memory_used_bytes": st.sampled_from(["0", "1024", "1073741824"]),
          "utilization_pct": st.sampled_from(["0", "50", "100", "12.5"]),
          "healthy": st.sampled_from(["true", "false"]), "nvlink_group": quoted_text(10),
          "labels": st.dictionaries(st.sampled_from(["a", "b"]), quoted_text(8), max_size=2).map(flow)}
HOSTILE_DEVICE_VALUES = ["true", "-1", "65536", "1.0", "0", "1e400", ".inf", ".nan", "-5", "100.5", "9223372036854775807",
                         "99999999999999", "'x'", "yes", "nonexistent", "''"]


@st.composite
def device(draw) -> str:
    """A declared device: the index and model always given (a pool needs them), a few hostile values."""
    fields = {k: weighted((92, v), (8, st.sampled_from(HOSTILE_DEVICE_VALUES))) for k, v in DEVICE.items()}
    keys = ["index", "model"] + draw(st.lists(st.sampled_from(sorted(set(DEVICE) - {"index", "model"})), unique=True,
                                              max_size=4))
    if chance(draw, 3):
        keys.remove(draw(st.sampled_from(["index", "model"])))
    values = [draw(value_for(fields[k])) for k in keys]
    return "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, values)) + "}"


@st.composite
def pool_document(draw) -> str:
    devices = draw(st.lists(device(), min_size=0 if chance(draw, 3) else 1, max_size=5))
    lines = []
    if draw(st.booleans()):
        lines.append(f"host: {draw(value_for(st.sampled_from(['node-1', 'h'])))}")
    if not chance(draw, 5):
        lines.append("devices:\n" + "".join(f"  - {d}\n" for d in devices))
    if chance(draw, 3):
        lines.append(f"extra: {draw(scalar())}")
    return "\n".join(lines) + "\n"


def pool_bytes() -> st.SearchStrategy[bytes]:
    text = weighted((88, pool_document()), (5, laughs().map(lambda s: s.replace("task:", "x:"))), (7, st.text(max_size=100)))
    raw = text.map(lambda s: s.encode("utf-8", "surrogatepass"))
    return weighted((88, raw), (6, st.binary(max_size=100)),
                    (6, text.map(lambda s: b"\x00" + s.encode("utf-8", "surrogatepass"))))


# ------------------------------------------------------------------------------------------ scripts
LAYER_ARG = st.one_of(st.integers(1, 4096).map(str), st.sampled_from(
    ["0", "-3", "1000000", "10**6", "10**12", "1" + "0" * 40, "1" + "0" * 400, "'a'", "3.5", "True", "None", "1e400",
     "float('inf')", "float('nan')", "[2, 3]", "X", "2**63", "-(10**20)"]))
HEADER = "import paddle\nimport paddle.nn as nn\n"


@st.composite
def linear_script(draw) -> tuple[str, tuple[int, int] | None]:
    """``model = nn.Linear(a, b)`` (the s_huge_linear shape); returns the source and (a, b) when both are
    plain positive integers, else None."""
    a, b = draw(LAYER_ARG), draw(LAYER_ARG)
    where = draw(st.sampled_from(["module", "function", "optimizer"]))
    if where == "module":
        src = f"{HEADER}model = nn.Linear({a}, {b})\n"
    elif where == "function":
        src = f"{HEADER}def build():\n    return nn.Linear({a}, {b})\nmodel = build()\n"
    else:
        src = (f"{HEADER}net = nn.Linear({a}, {b})\n"
               "opt = paddle.optimizer.Adam(parameters=net.parameters())\n")
    known = None
    try:
        va, vb = eval(a, {}), eval(b, {})  # noqa: S307 - our own literals
        if all(type(v) is int and 0 < v < 10**30 for v in (va, vb)) and where != "function":
            known = (va, vb)
    except Exception:  # noqa: BLE001
        pass
    return src, known


@st.composite
def class_script(draw) -> str:
    """A small ``nn.Layer`` model with fuzzed layer arguments, batch and input."""
    layers = draw(st.lists(st.sampled_from(["Linear", "Conv2D", "ReLU", "Flatten", "BatchNorm2D", "Embedding", "LSTM"]),
                           min_size=1, max_size=4))
    inits, calls = [], []
    for i, kind in enumerate(layers):
        if kind in ("ReLU", "Flatten"):
            args = ""
        elif kind == "Conv2D":
            args = ", ".join(draw(st.lists(LAYER_ARG, min_size=3, max_size=3)))
        elif kind == "BatchNorm2D":
            args = draw(LAYER_ARG)
        else:
            args = ", ".join(draw(st.lists(LAYER_ARG, min_size=2, max_size=2)))
        inits.append(f"        self.l{i} = nn.{kind}({args})")
        calls.append(f"        x = self.l{i}(x)" if kind != "LSTM" else f"        x, _ = self.l{i}(x)")
    batch = draw(LAYER_ARG)
    shape = ", ".join(draw(st.lists(LAYER_ARG, min_size=1, max_size=3)))
    return (f"{HEADER}X = {draw(LAYER_ARG)}\nBATCH_SIZE = {batch}\n\nclass Net(nn.Layer):\n    def __init__(self):\n"
            "        super().__init__()\n" + "\n".join(inits) + "\n\n    def forward(self, x):\n" + "\n".join(calls)
            + "\n        return x\n\nmodel = Net()\nopt = paddle.optimizer.Adam(parameters=model.parameters())\n"
            f"x = paddle.randn([BATCH_SIZE, {shape}])\n")


def expression_chain() -> st.SearchStrategy[str]:
    """Long expression chains and nesting (the RecursionError/MemoryError family)."""
    n = st.integers(1, 3000)
    return st.one_of(
        n.map(lambda k: "x = " + " + ".join(["1"] * k) + "\n"),
        n.map(lambda k: "x = " + "-" * k + "1\n"),
        n.map(lambda k: "x = " + "not " * k + "True\n"),
        n.map(lambda k: "x = " + "(" * k + "1" + ")" * k + "\n"),
        n.map(lambda k: "x = " + "[" * k + "]" * k + "\n"),
        n.map(lambda k: "x = 'a'" + " + 'a'" * k + "\n"),
        n.map(lambda k: "x = a" + ".b" * k + "\n"),
        n.map(lambda k: "x = f" + "(1)" * k + "\n"),
        n.map(lambda k: HEADER + "model = nn.Sequential(" + ", ".join(["nn.ReLU()"] * k) + ")\n"),
        st.integers(1, 100_000).map(lambda k: "x = " + " + ".join(["1"] * k) + "\n"),
    )


NOT_COMPILING = ["return 5\n", "def f(a, a):\n    pass\n", "def f():\n    nonlocal x\n", "nonlocal x\n", "break\n",
                 "continue\n", "yield 1\n", "await f()\n", "x = 1\n  y = 2\n", "print('a'\n", "def f(:\n    pass\n",
                 "class C:\nreturn\n", "x = 1" + "0" * 5000 + "\n", "f(**x, *y)\n", "del f()\n", "a + 1 = 2\n",
                 "def f():\n    x = 1\n    global x\n", "lambda: (yield)\n", "async def f():\n    yield from x\n",
                 "from __future__ import braces\n", "import paddle\nmodel = paddle.nn.Linear(2, 2)\nreturn model\n"]
VALID_ODDITIES = ["", "\n", "# only a comment\n", "pass\n", "x = 1e400\n", "x = 10**400\n", "import os\nos.system('true')\n",
                  "if __name__ == '__main__':\n    main()\n", "x: int = 'a'\n", "\ufeffx = 1\n", "x = '\\x00'\n",
                  "global X\n", "def f():\n    return (yield)\n"]


SIZE = weighted((80, st.integers(1, 512)), (15, st.integers(513, 10**6)), (5, st.integers(10**6, 10**12)))


@st.composite
def mlp_script(draw) -> str:
    """A coherent MLP (every Linear takes what the previous one gives) at a fuzzed batch and width: it traces."""
    widths = draw(st.lists(SIZE, min_size=2, max_size=5))
    batch = draw(weighted((90, st.integers(1, 256)), (10, st.integers(257, 10**7))))
    layers = ", ".join(f"nn.Linear({a}, {b}), nn.ReLU()" for a, b in zip(widths, widths[1:]))
    return (f"{HEADER}BATCH_SIZE = {batch}\nmodel = nn.Sequential({layers})\n"
            "opt = paddle.optimizer.SGD(parameters=model.parameters())\n"
            f"x = paddle.randn([BATCH_SIZE, {widths[0]}])\nloss = model(x).mean()\n")


@st.composite
def cnn_script(draw) -> str:
    """A coherent small CNN at a fuzzed image size, channels and batch."""
    c = draw(st.lists(weighted((90, st.integers(1, 128)), (10, st.integers(129, 4096))), min_size=2, max_size=4))
    size = draw(weighted((90, st.sampled_from([8, 28, 32, 64, 224])), (10, st.integers(1, 4096))))
    k = draw(st.integers(1, 5))
    convs = ", ".join(f"nn.Conv2D({a}, {b}, {k}, padding={k // 2}), nn.ReLU()" for a, b in zip(c, c[1:]))
    return (f"{HEADER}class Net(nn.Layer):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.body = nn.Sequential({convs})\n        self.pool = nn.AdaptiveAvgPool2D(1)\n"
            f"        self.head = nn.Linear({c[-1]}, 10)\n\n    def forward(self, x):\n"
            "        x = self.pool(self.body(x))\n        return self.head(paddle.flatten(x, 1))\n\n"
            "model = Net()\nopt = paddle.optimizer.Adam(parameters=model.parameters())\n"
            f"x = paddle.randn([{draw(st.integers(1, 512))}, {c[0]}, {size}, {size}])\n")


def script_text() -> st.SearchStrategy[str]:
    return weighted(
        (20, mlp_script()), (10, cnn_script()), (15, class_script()), (10, linear_script().map(lambda t: t[0])),
        (15, expression_chain()), (10, st.sampled_from(NOT_COMPILING)), (5, st.sampled_from(VALID_ODDITIES)),
        (5, st.tuples(class_script(), st.sampled_from(NOT_COMPILING + VALID_ODDITIES)).map("\n".join)),
        (5, st.tuples(st.sampled_from(VALID_ODDITIES), expression_chain()).map("".join)),
        (5, st.text(max_size=200)),
    )


def script_bytes() -> st.SearchStrategy[bytes]:
    text = script_text().map(lambda s: s.encode("utf-8", "surrogatepass"))
    return weighted((88, text), (6, st.binary(max_size=200)),
                    (5, script_text().map(lambda s: s.encode("utf-8", "surrogatepass") + b"\x00\xff")),
                    (1, st.just("s = 'caf\xe9'\n".encode("latin-1"))))
