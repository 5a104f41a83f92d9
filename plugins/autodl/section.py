"""The base of the spec's sections and the launchers' options: frozen, unknown keys refused, no true/false for a
number, no NUL in a string; and sizes written as Docker takes them (``8g``).
"""

from __future__ import annotations

import math
import re
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from autodl.fields import MAX_HOST_BYTES
from autodl.inputs import short


def kind_of(annotation: Any) -> str:
    """What a field takes, in words (``a number``, ``a string``, ``one of 'exclusive', 'packed'``), from its
    annotation."""
    seen: set[type] = set()
    choices: list[str] = []

    def walk(a: Any) -> None:
        if isinstance(a, type):
            seen.add(a)
        if typing.get_origin(a) is typing.Literal:
            choices.extend(repr(v) for v in typing.get_args(a))
            return
        for arg in typing.get_args(a):
            walk(arg)

    walk(annotation)
    if choices and not seen - {type(None)}:
        return "one of " + ", ".join(choices)
    number, text = bool(seen & {int, float}), str in seen
    return "a number" if number and not text else "a string" if text and not number else "a number or a string"


class Section(BaseModel):
    """A section of a spec (or of its launcher's options): frozen, unknown keys refused, a number never given as
    true/false, a string never holding a NUL."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML's `true` must not pass as 1 (a batch of one) or 1.0 (a threshold of 100%)
        if isinstance(value, bool):
            annotation = cls.model_fields[str(info.field_name)].annotation
            if "bool" not in str(annotation):
                raise ValueError(f"expected {kind_of(annotation)}, not true/false")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _no_nul(cls, value: Any, info: ValidationInfo) -> Any:
        # a NUL byte cannot cross exec(2), a Docker API call or a pod manifest: refuse it here, naming the
        # field, instead of failing the launch with a traceback (reliability test, issue 23). A nested section
        # checks its own fields, so the error names the innermost one.
        if holds_section(cls.model_fields[str(info.field_name)].annotation):
            return value
        if has_nul(value):
            raise ValueError("contains a NUL character (\\x00), which no launcher can pass on; remove it")
        return value


def holds_section(annotation: Any) -> bool:
    """Whether a field's type is (or contains) a pydantic model, which validates its own strings."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(holds_section(arg) for arg in typing.get_args(annotation))


def has_nul(value: Any, depth: int = 0) -> bool:
    """Whether a string anywhere in ``value`` (strings, lists, dicts, nested up to 16 levels) holds a NUL."""
    if isinstance(value, str):
        return "\x00" in value
    if depth > 16:
        return False
    if isinstance(value, dict):
        return any(has_nul(k, depth + 1) or has_nul(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_nul(v, depth + 1) for v in value)
    return False


_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_FACTOR = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: int | str | None) -> int | None:
    """Bytes for a size written as ``docker run --shm-size`` accepts it.

    ``8g``, ``8G``, ``8GB``, ``8Gi`` and ``8GiB`` all mean 8 GiB (8 * 2**30 bytes): Docker's
    ``units.RAMInBytes`` reads every unit as binary, and so does Kubernetes' ``Gi``. A bare integer
    is bytes.

    :param value: the size, an integer (bytes) or a string with an optional unit (b, k, m, g, t).
    :returns: bytes, or ``None`` for ``None``.
    :raises ValueError: for a negative, infinite or absurd (over 1 PiB) size or an unknown unit (pydantic turns
        it into a SpecError).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("a size is a number of bytes or a string like '8g'")
    number: float
    if isinstance(value, (int, float)):
        number = value
    else:
        match = _SIZE_RE.match(value) if len(value) <= 40 else None
        if not match:
            raise ValueError(f"{short(value, 40)} is not a size; write bytes or a number with k, m, g or t (binary), "
                             "e.g. '8g'")
        number = float(match.group(1)) * _SIZE_FACTOR[match.group(2).lower()]
    if not math.isfinite(number) or number <= 0:
        raise ValueError("a size must be a positive, finite number of bytes")
    if number > MAX_HOST_BYTES:
        raise ValueError(f"a size of {number:.3g} bytes is more than {MAX_HOST_BYTES >> 50} PiB; check the unit")
    return int(number)


__all__ = ["Section", "has_nul", "holds_section", "kind_of", "parse_size"]
