"""Reading what a user hands autodl: files, YAML documents and Python scripts, each bounded and refused clearly.

Details: docs/reference/task-spec.md#autodlinputs.
"""

from __future__ import annotations

import ast
import errno
import io
import math
import os
import re
import reprlib
import stat
import tokenize
from pathlib import Path
from typing import Any

MAX_YAML_BYTES = 2 << 20
"""Largest YAML file read (2 MiB): a declared pool of 10,000 devices is ~1 MiB (read in 0.5 s, measured here);
specs and the catalog are a few KiB."""

MAX_YAML_DEPTH = 64
"""Deepest nesting of YAML collections: autodl's deepest document (a spec's ``launcher.mounts[i]``) is 4."""

MAX_YAML_NODES = 200_000
"""Most values a YAML document may hold once its aliases are expanded: twice a 10,000-device declared pool
(~9 values per device; ~2 s to read, measured here), far below what makes the expansion, or anything walking it, slow ("billion laughs":
nine levels of nine aliases are 9**9 = 387 million values)."""

INT_LIMIT = 1 << 63
"""Integers in YAML files must lie in (-2**63, 2**63): every count, size and index autodl reads fits a
signed 64-bit integer (the store's BIGINT); anything longer is refused before it is converted."""

MAX_SCRIPT_BYTES = 4 << 20
"""Largest training script profiled (4 MiB); the largest single-file model definitions in PaddleNLP /
PaddleClas are under 200 KiB."""

MAX_SCRIPT_TOKENS = 500_000
"""Most tokens (Python's words, numbers, strings and symbols) of a script compiled or analysed in the calling
process. Python's parser holds its whole syntax tree in memory, ~480 bytes per token (measured here: a 4 MB
script of 2,000,000 list elements, 4 million tokens, took ``compile`` + ``ast.parse`` to 1.9 GB of resident
memory), so the byte limit alone does not bound the caller's memory: 500,000 tokens keep it near 250 MB. The
largest single-file model definitions in PaddleNLP / PaddleClas (~200 KiB) have under 60,000 tokens; one string
literal is one token, whatever its length. Counted with :mod:`tokenize`, which holds one line at a time."""

MAX_NAME_BYTES = 255
"""Longest file name component (Linux ``NAME_MAX``)."""

MAX_PATH_BYTES = 4095
"""Longest path (Linux ``PATH_MAX`` 4096 including the terminating NUL)."""

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4
_repr.maxlevel = 2


def clip(text: str | os.PathLike[str], limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters (with "..."), for paths and messages quoted in messages."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, never walking a whole (possibly huge) structure."""
    try:
        text = _repr.repr(value)
    except Exception:  # noqa: BLE001 - a message must never fail
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------- files
def _fs_len(text: str) -> int:
    return len(os.fsencode(text))


def resolve_file(path: str | Path, error: type[Exception], what: str = "file", *,
                 missing: str | None = None, fix: str | None = None) -> Path:
    """The absolute, symlink-free path of a regular file, checked without following loops forever.

    :param path: as the user gave it (relative to the current folder).
    :param error: the :class:`~autodl.errors.AutoDLError` subclass to raise.
    :param what: what the file is, for messages ("spec file", "training script").
    :param missing: the message after the path when the file does not exist; default ``"<what> not found"``.
    :param fix: what to do, ending every other message; default ``"pass the path of a <what>"``.
    :returns: the resolved path.
    :raises error: name too long, symlink loop, missing, not a regular file, unreadable.
    """
    text = os.fspath(path)
    fix = fix or f"pass the path of a {what}"
    if not text or "\x00" in text:
        raise error(f"{what} path {short(text)} is not a valid path; {fix}.")
    shown = clip(text)
    if _fs_len(text) > MAX_PATH_BYTES or any(_fs_len(part) > MAX_NAME_BYTES for part in text.split("/")):
        raise error(f"{shown}: the {what} path is too long (a name over {MAX_NAME_BYTES} bytes or a path over "
                    f"{MAX_PATH_BYTES}); {fix}.")
    try:
        st = os.stat(text)  # follows symlinks; a loop is ELOOP, never a hang
    except FileNotFoundError:
        raise error(f"{shown}: {missing or what + ' not found; ' + fix + '.'}") from None
    except OSError as exc:
        reasons: dict[int | None, str] = {errno.ELOOP: "is a symlink loop (or a chain of more than 40 links)",
                                          errno.ENAMETOOLONG: "has a name that is too long",
                                          errno.EACCES: "cannot be read (permission denied)",
                                          errno.ENOTDIR: "has a part that is not a folder"}
        reason = reasons.get(exc.errno, f"cannot be read ({exc.strerror})")  # errno is None for a bare OSError
        raise error(f"{shown}: the {what} path {reason}; {fix}.") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{shown}: is a folder, not a {what}; {fix}.")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{shown}: is not a regular file (a FIFO, socket or device); {fix}.")
    try:
        return Path(os.path.realpath(text))
    except (OSError, ValueError) as exc:  # pragma: no cover - stat succeeded, so this is a race
        raise error(f"{shown}: cannot resolve the {what} path ({exc}).") from None


def _read_bytes(path: str | Path, error: type[Exception], what: str, *, max_bytes: int,
                missing: str | None = None) -> tuple[Path, bytes]:
    """The bytes of a regular text file of at most ``max_bytes`` (no NUL byte); see :func:`read_text`."""
    resolved = resolve_file(path, error, what, missing=missing)
    shown = clip(os.fspath(path))
    try:
        # O_NONBLOCK and a second check on the open file: a file swapped for a FIFO after the check above
        # still cannot block the reader
        fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise error(f"{shown}: is not a regular file (a FIFO, socket or device); pass the path of a {what}.")
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{shown}: cannot read the {what} ({exc.strerror}).") from None
    if len(data) > max_bytes:
        raise error(f"{shown}: the {what} is larger than {max_bytes >> 20} MiB; autodl reads at most that.")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise error(f"{shown}: the {what} is binary (a NUL byte at offset {nul}), not text; pass a text {what}.")
    return resolved, data


def read_text(path: str | Path, error: type[Exception], what: str = "file", *, max_bytes: int = MAX_YAML_BYTES,
              missing: str | None = None) -> tuple[Path, str]:
    """Read a UTF-8 text file of at most ``max_bytes``.

    :returns: ``(resolved path, text)``; a UTF-8 byte order mark is dropped.
    :raises error: see :func:`resolve_file`; also too large, binary (a NUL byte) or not UTF-8.
    """
    resolved, data = _read_bytes(path, error, what, max_bytes=max_bytes, missing=missing)
    shown = clip(os.fspath(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{shown}: the {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                    "save it as UTF-8.") from None
    return resolved, text.removeprefix("\ufeff")


# ------------------------------------------------------------------------------------------ YAML
class YAMLRefused(Exception):
    """Raised inside the loader; :func:`read_yaml` turns it into the caller's error."""

    def __init__(self, message: str, node: Any = None, mark: Any = None):
        super().__init__(message)
        self.message = message
        self.mark = mark if mark is not None else getattr(node, "start_mark", None)
        self.path = getattr(node, "autodl_path", None)


def _join(path: list[str]) -> str | None:
    out = ""
    for part in path:
        out += part if part.startswith("[") or not out else "." + part
    return out or None


_TAG = "tag:yaml.org,2002:"
"""YAML's own tags' prefix (``!!str`` is ``tag:yaml.org,2002:str``)."""
_ALLOWED_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")}
"""The tags autodl's files may hold: plain values, lists and mappings (merge keys included)."""


def _make_loader():
    """The bounded YAML loader class (libyaml's parser when PyYAML has it, the Python composer that bounds depth,
    size and tags, the plain constructor and resolver) and the errors it raises; PyYAML is imported here."""
    import yaml
    from yaml.constructor import ConstructorError

    Parser, init_parser = _yaml_parser()
    PlainResolver = _plain_resolver()
    BoundedComposer = _bounded_composer()
    PlainConstructor = _plain_constructor()

    class BoundedLoader(Parser, BoundedComposer, PlainConstructor, PlainResolver):
        def __init__(self, stream):
            init_parser(self, stream)
            BoundedComposer.__init__(self)
            PlainConstructor.__init__(self)
            PlainResolver.__init__(self)

    # the Python composer, not the C one: it is where depth, size and tags are bounded
    for name in ("check_node", "get_node", "get_single_node", "compose_document"):
        setattr(BoundedLoader, name, getattr(BoundedComposer, name))
    return BoundedLoader, (yaml.YAMLError, ConstructorError)


def _yaml_parser():
    """(the parser class, how to initialise it): libyaml's CParser, else PyYAML's Python reader+scanner+parser."""
    import yaml

    try:
        from yaml._yaml import CParser as Parser  # libyaml: fast, and bounds flow nesting itself

        def init_parser(self, stream):
            Parser.__init__(self, stream)
    except ImportError:  # pragma: no cover - PyYAML built without libyaml
        from yaml.parser import Parser
        from yaml.reader import Reader
        from yaml.scanner import Scanner

        class Parser(Reader, Scanner, Parser):  # type: ignore[no-redef]
            pass

        def init_parser(self, stream):
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)

    return Parser, init_parser


def _plain_resolver():
    """YAML 1.1's implicit resolvers without timestamps and base-60 numbers."""
    from yaml.resolver import Resolver

    tag = _TAG
    class PlainResolver(Resolver):
        """YAML 1.1's implicit types minus timestamps: an unquoted date stays the string it was written as."""

    PlainResolver.yaml_implicit_resolvers = {
        first: [(t, regexp) for t, regexp in resolvers if t not in (tag + "timestamp", tag + "int", tag + "float")]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    }
    # YAML 1.1's numbers minus base 60 (``1000:1000`` is a uid:gid string, not the integer 61000)
    PlainResolver.add_implicit_resolver(tag + "int", re.compile(
        r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"), list("-+0123456789"))
    PlainResolver.add_implicit_resolver(tag + "float", re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))

    return PlainResolver


def _bounded_composer():
    """PyYAML's Python composer bounded in depth (:data:`MAX_YAML_DEPTH`), in values after aliases
    (:data:`MAX_YAML_NODES`) and in tags (:data:`_ALLOWED_TAGS`); each node knows its path (``a.b[0]``)."""
    from yaml.composer import ComposerError
    from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, SequenceStartEvent

    class BoundedComposer(_counting_composer()):  # the node builders, built when PyYAML is imported
        def compose_node(self, parent, index):
            if self.check_event(AliasEvent):
                event = self.get_event()
                if event.anchor not in self.anchors:
                    raise ComposerError(None, None, f"found undefined alias {short(event.anchor)}", event.start_mark)
                node = self.anchors[event.anchor]
                self._count(self._weight.get(id(node), 1), event.start_mark)
                return node
            event = self.peek_event()
            if event.anchor is not None and event.anchor in self.anchors:
                raise ComposerError(f"found duplicate anchor {short(event.anchor)}", self.anchors[event.anchor].start_mark,
                                    "second occurrence", event.start_mark)
            self._depth += 1
            if self._depth > MAX_YAML_DEPTH:
                raise YAMLRefused(f"nested deeper than {MAX_YAML_DEPTH} levels; autodl's files need at most a few",
                                  mark=event.start_mark)
            try:
                self.descend_resolver(parent, index)
                if self.check_event(ScalarEvent):
                    node = self.compose_scalar_node(event.anchor)
                elif self.check_event(SequenceStartEvent):
                    node = self.compose_sequence_node(event.anchor)
                elif self.check_event(MappingStartEvent):
                    node = self.compose_mapping_node(event.anchor)
                else:  # pragma: no cover - the parser emits only these here
                    raise ComposerError(None, None, "unexpected YAML event", event.start_mark)
                self.ascend_resolver()
            finally:
                self._depth -= 1
            return node

    return BoundedComposer


def _counting_composer():
    """The composer's node builders: each scalar, sequence and mapping counted (:data:`MAX_YAML_NODES`, aliases
    by the values they repeat), its tag checked and its path kept."""
    from yaml.composer import Composer

    tag, allowed = _TAG, _ALLOWED_TAGS

    class CountingComposer(Composer):
        def __init__(self):
            Composer.__init__(self)
            self._depth = 0
            self._total = 0
            self._weight: dict[int, int] = {}
            self._path: list[str] = []

        def _count(self, n: int, mark) -> None:
            self._total += n
            if self._total > MAX_YAML_NODES:
                raise YAMLRefused(f"the document expands to more than {MAX_YAML_NODES:,} values (aliases repeating "
                                  "aliases, or simply too large); write it out without nested aliases", mark=mark)

        def compose_scalar_node(self, anchor):
            node = Composer.compose_scalar_node(self, anchor)
            self._weight[id(node)] = 1
            node.autodl_path = _join(self._path)
            self._count(1, node.start_mark)
            self._check_tag(node)
            return node

        compose_sequence_node, compose_mapping_node = _collection_builders()

        def _check_tag(self, node):
            if node.tag not in allowed:
                raise YAMLRefused(f"the tag {short(node.tag.replace(tag, '!!'))} is not allowed; autodl files use plain "
                                  "YAML values (strings, numbers, true/false, null, lists, mappings)", node=node)

    return CountingComposer


def _collection_builders():
    """(``compose_sequence_node``, ``compose_mapping_node``): the composer's list and mapping builders."""
    import yaml
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode

    def opened(self, anchor, node_class):
        """A list or mapping node begun: counted, its path kept, its tag checked, its anchor registered."""
        start = self.peek_event()
        self._count(1, start.start_mark)
        node = node_class(start.tag or self.resolve(node_class, None, start.implicit), [], start.start_mark,
                          None, flow_style=start.flow_style)
        node.autodl_path = _join(self._path)
        self._check_tag(node)
        self.get_event()
        if anchor is not None:
            self.anchors[anchor] = node
        return node

    def compose_sequence_node(self, anchor):
        node = opened(self, anchor, SequenceNode)
        weight = 1
        index = 0
        while not self.check_event(yaml.SequenceEndEvent):
            self._path.append(f"[{index}]")
            try:
                child = self.compose_node(node, index)
            finally:
                self._path.pop()
            node.value.append(child)
            weight += self._weight.get(id(child), 1)
            index += 1
        node.end_mark = self.get_event().end_mark
        self._weight[id(node)] = weight
        return node

    def compose_mapping_node(self, anchor):
        node = opened(self, anchor, MappingNode)
        weight = 1
        while not self.check_event(yaml.MappingEndEvent):
            key = self.compose_node(node, None)
            name = key.value if isinstance(key, ScalarNode) else "?"
            self._path.append(str(name)[:40])
            try:
                value = self.compose_node(node, key)
            finally:
                self._path.pop()
            node.value.append((key, value))
            weight += self._weight.get(id(key), 1) + self._weight.get(id(value), 1)
        node.end_mark = self.get_event().end_mark
        self._weight[id(node)] = weight
        return node

    return compose_sequence_node, compose_mapping_node


def _plain_constructor():
    """PyYAML's safe constructor that refuses, with the value's line, what autodl's files cannot mean: numbers past
    64 bits, leading-zero octals, non-finite floats, duplicate keys and unhashable keys."""
    from yaml.constructor import SafeConstructor
    from yaml.nodes import MappingNode, ScalarNode

    tag = _TAG

    class PlainConstructor(SafeConstructor):
        def construct_object(self, node, deep=False):
            try:
                return SafeConstructor.construct_object(self, node, deep)
            except (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError):
                what = {"int": "an integer", "float": "a number", "bool": "true or false", "null": "null"}.get(
                    node.tag.replace(tag, ""), node.tag.replace(tag, "!!"))
                raise YAMLRefused(f"{short(node.value) if isinstance(node, ScalarNode) else 'the value'} is not "
                                  f"{what}", node=node) from None

        def construct_yaml_int(self, node):
            text = str(node.value).replace("_", "").lstrip("+-")
            if len(text) > 40:
                raise YAMLRefused(f"an integer of {len(text):,} digits is too large (autodl's numbers fit 64 bits)",
                                  node=node)
            if len(text) > 1 and text[0] == "0" and text[1] in "01234567":
                # YAML 1.1 reads 0777 as octal 511, YAML 1.2 (and most other tools) as 777: never guess
                raise YAMLRefused(f"{short(node.value, 30)} starts with 0: YAML 1.1 reads it as the octal number "
                                  f"{SafeConstructor.construct_yaml_int(self, node)}, YAML 1.2 as "
                                  f"{int(text) if text.isdigit() else '?'}; write the number without the leading 0 "
                                  "(or quote it if it is text)", node=node)
            value = SafeConstructor.construct_yaml_int(self, node)
            if not -INT_LIMIT < value < INT_LIMIT:
                raise YAMLRefused(f"the integer {short(value, 30)} is too large (autodl's numbers fit 64 bits)",
                                  node=node)
            return value

        def construct_yaml_float(self, node):
            value = SafeConstructor.construct_yaml_float(self, node)
            if not math.isfinite(value):
                raise YAMLRefused(f"{short(node.value, 30)} is not a finite number; write a number", node=node)
            return value

        def construct_mapping(self, node, deep=False):
            if isinstance(node, MappingNode):
                _refuse_duplicate_keys(self, node)
            return SafeConstructor.construct_mapping(self, node, deep)

    PlainConstructor.add_constructor(tag + "int", PlainConstructor.construct_yaml_int)
    PlainConstructor.add_constructor(tag + "float", PlainConstructor.construct_yaml_float)

    return PlainConstructor


def _refuse_duplicate_keys(constructor, node) -> None:
    """Refuse a mapping node holding a key twice, or a key that is not a plain value; merge keys (``<<``) pass."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _TAG + "merge":
            continue
        key = constructor.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:
            raise YAMLRefused(f"a key must be a plain value, not {type(key).__name__}",
                              node=key_node) from None
        line = key_node.start_mark.line + 1
        if first is not None:
            refused = YAMLRefused(f"duplicate key {short(key, 40)} (first on line {first}); YAML keeps only "
                                  "the last one: remove one of them", node=key_node)
            refused.path = _join([p for p in [getattr(node, "autodl_path", None), clip(key, 40)] if p])
            raise refused
        seen[key] = line


_LOADER = None


def _loader():
    global _LOADER
    if _LOADER is None:
        _LOADER = _make_loader()
    return _LOADER


def _where(shown: str, mark: Any, path: str | None) -> str:
    out = shown
    if mark is not None and getattr(mark, "line", None) is not None:
        out += f":{mark.line + 1}"
    if path:
        out += f": {clip(path, 100)}"
    return out


def parse_yaml(text: str, error: type[Exception], shown: str = "<yaml>") -> Any:
    """Parse YAML text with autodl's bounded loader (see the module docstring).

    :param shown: the file name used in messages.
    :raises error: ``"<file>:<line>: <field>: <problem>"``.
    """
    loader_cls, yaml_errors = _loader()
    loader = loader_cls(text)
    try:
        return loader.get_single_data()
    except YAMLRefused as exc:
        raise error(f"{_where(shown, exc.mark, exc.path)}: {exc.message}.") from None
    except yaml_errors as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        reason = f"{context} {problem}" if context and problem and context not in problem else problem
        raise error(f"{_where(shown, mark, None)}: not valid YAML: {clip(reason, 160)}; fix the "
                    "file (a YAML linter points at the line).") from None
    except RecursionError:  # pragma: no cover - depth is bounded long before Python's limit
        raise error(f"{shown}: nested too deeply to read.") from None
    finally:
        try:
            loader.dispose()
        except Exception:  # noqa: BLE001
            pass


def read_yaml(path: str | Path, error: type[Exception], missing: str) -> Any:
    """Read a YAML file (spec, pool, catalog) with autodl's bounded loader.

    :param error: the :class:`~autodl.errors.AutoDLError` subclass to raise.
    :param missing: what to say (after the path) when the file does not exist.
    :returns: the document as plain Python values (dict, list, str, int, float, bool, None).
    :raises error: ``"<path>: <missing>"``, a bad path or file (see :func:`read_text`), or
        ``"<path>:<line>: <field>: <problem>"`` for YAML autodl refuses.
    """
    _, text = read_text(path, error, "YAML file", max_bytes=MAX_YAML_BYTES, missing=missing)
    return parse_yaml(text, error, clip(os.fspath(path)))


# ---------------------------------------------------------------------------------------- scripts
def compile_script(source: str, error: type[Exception], shown: str) -> ast.Module | None:
    """Compile ``source`` as Python would, then parse it into the syntax tree the static analysis reads.

    ``compile`` runs the checks ``ast.parse`` skips (``return``/``yield`` outside a function, duplicate
    argument names, bad ``nonlocal``/``global``, ``break`` outside a loop), so a script autodl accepts
    is one Python would run.

    :returns: the tree, or ``None`` when Python compiles the script but its syntax tree is nested too deeply to
        build as Python objects (the tool's limit, not the script's fault: the caller says so in a warning).
    :raises error: ``"<script>:<line>: syntax error: ..."``; also for expressions nested or chained too
        deeply for Python's own compiler (``python script.py`` fails the same way).
    """
    try:
        compile(source, shown, "exec", dont_inherit=True)
    except SyntaxError as exc:
        near = f" near {short(exc.text.strip(), 60)}" if exc.text and exc.text.strip() else ""
        raise error(f"{shown}:{exc.lineno or '?'}: syntax error: {clip(exc.msg)}{near}; fix the "
                    "script (`python -m py_compile` shows the same) and try again.") from None
    except (RecursionError, MemoryError):
        raise error(f"{shown}: an expression is nested or chained too deeply for Python to compile (`python "
                    "-m py_compile` fails the same way); split it into several statements.") from None
    except ValueError as exc:  # e.g. a NUL byte in the source (3.11 raises ValueError, not SyntaxError)
        raise error(f"{shown}: not a valid Python source file ({short(str(exc), 80)}).") from None
    try:
        return ast.parse(source, filename=shown)
    except (RecursionError, MemoryError):
        return None


def decode_script(data: bytes, error: type[Exception], shown: str, what: str = "training script") -> str:
    """The text of a Python source file, decoded as Python decodes it (PEP 263, PEP 3120).

    UTF-8 unless the file starts with a UTF-8 byte order mark or declares another encoding in a ``coding:``
    comment on its first two lines (``# -*- coding: latin-1 -*-``), as :func:`tokenize.detect_encoding`
    (Python's own rule) reads it. A declared encoding Python does not know, or one that is not a text encoding
    (``rot13``), is an error, as it is for ``python script.py``.

    :raises error: naming the encoding and the first byte it cannot decode.
    """
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # unknown codec, BOM with another declared encoding, undecodable first lines
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:  # no (readable) declaration: Python reads UTF-8, and this is not
            raise error(f"{shown}: the {what} is not UTF-8 text (byte 0x{data[bad.start]:02x} at offset {bad.start}); "
                        "save it as UTF-8, or declare its encoding in a '# -*- coding: ... -*-' comment on its "
                        "first line.") from None
        raise error(f"{shown}: {clip(exc.msg or str(exc), 100)}; Python cannot read the {what} (`python -m "
                    "py_compile` says the same): save it as UTF-8 or declare an encoding Python knows.") from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        if encoding == "utf-8":
            raise error(f"{shown}: the {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                        "save it as UTF-8, or declare its encoding in a '# -*- coding: ... -*-' comment on its "
                        "first line.") from None
        raise error(f"{shown}: the {what} declares the encoding {encoding} but is not {encoding} text (byte "
                    f"0x{data[exc.start]:02x} at offset {exc.start}); fix the coding comment or save it as "
                    "UTF-8.") from None
    except (LookupError, TypeError, ValueError) as exc:  # not a text codec (rot13), or a codec that failed
        raise error(f"{shown}: the {what} declares the encoding {clip(encoding, 40)}, which is not a text encoding "
                    f"Python reads source in ({clip(str(exc), 80)}); save it as UTF-8.") from None
    return text.removeprefix("\ufeff")


def count_tokens(source: str, limit: int) -> int:
    """Tokens of ``source`` as Python's tokenizer splits it, counted up to ``limit + 1`` (then it stops).

    Comments, line breaks and indentation count too (an upper bound on what the parser builds). A tokenizer
    error ends the count early: :func:`compile_script` reports the script's syntax error itself.
    """
    n = 0
    try:
        for _tok in tokenize.generate_tokens(io.StringIO(source).readline):
            n += 1
            if n > limit:
                break
    except (tokenize.TokenError, SyntaxError, ValueError):  # IndentationError is a SyntaxError
        pass
    return n


def read_script(path: str | Path, error: type[Exception],
                what: str = "training script") -> tuple[Path, str, ast.Module | None]:
    """Read a Python script (bounded in bytes and tokens, decoded as Python decodes it) and compile it as
    Python would.

    :returns: ``(resolved path, source, syntax tree or None)``; see :func:`compile_script`.
    :raises error: see :func:`read_text` and :func:`compile_script`; also a script that Python could not decode
        (:func:`decode_script`) or with more than :data:`MAX_SCRIPT_TOKENS` tokens (its syntax tree alone would
        take gigabytes of the caller's memory).
    """
    resolved, data = _read_bytes(path, error, what, max_bytes=MAX_SCRIPT_BYTES,
                                 missing=f"{what} not found; check task.script in the spec or the script argument.")
    shown = clip(os.fspath(path))
    source = decode_script(data, error, shown, what)
    if count_tokens(source, MAX_SCRIPT_TOKENS) > MAX_SCRIPT_TOKENS:
        raise error(f"{shown}: the {what} has more than {MAX_SCRIPT_TOKENS:,} tokens (Python's words, numbers and "
                    "symbols); autodl analyses at most that (model code needs far fewer: load large data literals "
                    "from a file the script reads).")
    return resolved, source, compile_script(source, error, str(resolved))


__all__ = ["MAX_SCRIPT_TOKENS", "MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "compile_script", "count_tokens",
           "decode_script", "parse_yaml", "read_script",
           "read_text", "read_yaml", "resolve_file", "short"]
