"""Reading files that a training (or another step) wrote, as untrusted input: regular files only, no links,
never blocking, never more than a bound; and writing autodl's own state files atomically.

A training runs as code autodl does not control: its report may be a FIFO (a plain ``open`` hangs the
release step), a symbolic link to a host file (whose content would enter the run record), or a sparse
file of gigabytes (issue 23). Every read here refuses those with :class:`UntrustedFile`, whose message
says what was found, so the caller records the file as missing and says why.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autodl.redact import REPORT_MAX_BYTES, TrainingReport, sanitize_report
from autodl.sandbox import read_output

REPORT_LIMIT_BYTES = 1 << 20
"""Largest training report read, bytes (1 MiB): a report is a small JSON object of figures and names."""

STEPS_LIMIT_BYTES = 16 << 20
"""Largest per-step metrics file read, bytes (16 MiB: about 100,000 step lines of ~150 bytes)."""

LOG_CHUNK_BYTES = 4 << 20
"""Most log bytes read in one poll (4 MiB); the follower reads on from the returned offset at the next poll."""


class UntrustedFile(OSError):
    """A file that is not read: not a regular file, a link, or over its size bound."""


def _open(path: str | os.PathLike) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedFile(f"{path} is a symbolic link; autodl does not follow links a training left") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UntrustedFile(f"{path} is not a regular file (a FIFO, socket or device); it was not read")
    return fd


def read_bytes(path: str | os.PathLike, limit: int, offset: int = 0) -> bytes:
    """At most ``limit`` bytes of ``path`` from ``offset``, refusing links and non-regular files.

    :raises FileNotFoundError: when it is absent.
    :raises UntrustedFile: a link, not a regular file.
    """
    fd = _open(path)
    try:
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        chunks, left = [], limit
        while left > 0:
            data = os.read(fd, min(left, 1 << 20))
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_whole(path: str | os.PathLike, limit: int) -> bytes:
    """The whole of ``path`` when it is at most ``limit`` bytes.

    :raises UntrustedFile: a link, not a regular file, or larger than ``limit`` (its size said).
    """
    data = read_bytes(path, limit + 1)
    if len(data) > limit:
        raise UntrustedFile(f"{path} is larger than {limit} bytes; it was not read")
    return data


def read_json_object(path: str | os.PathLike, limit: int = REPORT_LIMIT_BYTES) -> dict[str, Any]:
    """The JSON object in ``path`` (at most ``limit`` bytes).

    :raises FileNotFoundError: absent. :raises UntrustedFile: refused (see :func:`read_whole`).
    :raises ValueError: not a JSON object.
    """
    data = json.loads(read_whole(path, limit).decode("utf-8", errors="replace"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def read_json_lines(path: str | os.PathLike, limit: int = STEPS_LIMIT_BYTES) -> tuple[list[dict[str, Any]], bool]:
    """The JSON objects of ``path``'s lines in its first ``limit`` bytes (torn or non-object lines skipped),
    and whether the file went on past the bound (the rest not read)."""
    data = read_bytes(path, limit + 1)
    cut = len(data) > limit
    rows = []
    for line in data[:limit].splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, cut


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a torn one
    (a temporary file in the same folder, flushed to disk, then renamed over ``path``).

    :raises OSError: the disk is full or not writable (the old file is then left as it was).
    """
    folder = Path(path).parent
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{Path(path).name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_report(folder: str | os.PathLike, name: str = "report.json",
                environ: Mapping[str, str] | None = None) -> TrainingReport | None:
    """The report a training left in its run folder, read without trusting the file and sanitised.

    Read with :func:`autodl.sandbox.read_output` (no symlink followed: a training cannot point it at another run's
    report or at ``/proc/<pid>/environ``; a regular file of at most :data:`autodl.redact.REPORT_MAX_BYTES` only),
    then :func:`autodl.redact.sanitize_report`.

    :param folder: the run's folder.
    :param name: the report's file name in it.
    :param environ: the environment whose secrets are hidden; default this process's.
    :returns: the report, or None when there is no file.
    :raises ValueError: when the file is not a regular file of at most that size, or not a JSON object.
    """
    path = os.path.join(folder, name)
    if not os.path.lexists(path):
        return None
    raw = read_output(os.fspath(folder), name, max_bytes=REPORT_MAX_BYTES)
    if raw is None:
        raise ValueError(f"{path} is not a regular file of at most {REPORT_MAX_BYTES} bytes (a link, a pipe or "
                         "too large): refused")
    return sanitize_report(raw, environ)


__all__ = ["LOG_CHUNK_BYTES", "REPORT_LIMIT_BYTES", "STEPS_LIMIT_BYTES", "UntrustedFile", "atomic_write_text",
           "read_bytes", "read_json_lines", "read_json_object", "read_report", "read_whole"]
