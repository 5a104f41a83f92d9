"""The SQLite store file's permissions: its owner's only (issue 19).

The store holds every tenant's run keys, leases and records. :func:`secure_sqlite_file` runs before SQLite opens
the file: it creates a missing file mode 0600 (autodl's home, the default store's folder, is made 0700 by
:func:`autodl.config.autodl_home`), so SQLite's ``-wal`` and ``-shm`` files, which
SQLite creates with the database file's own permissions ("findCreateFileMode" in SQLite's ``os_unix.c``), are
0600 too; an existing file (or side file) readable or writable by group or others is tightened to its owner's bits
and a warning names it and its old mode; a folder others may write into (without the sticky bit, so they could
replace the file) is warned about, not changed.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

FILE_MODE = 0o600
"""Mode of the store's files: read and write for their owner only."""

SIDE_SUFFIXES = ("-wal", "-shm", "-journal", ".migrate.lock")
"""Files SQLite (write-ahead log, shared memory index, rollback journal) and autodl (the migration lock) keep
beside the database file."""

log = logging.getLogger(__name__)


def _tighten(path: Path) -> str | None:
    """Remove group and other bits from an existing ``path``; the warning said, or None when it was owner-only."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    try:
        os.chmod(path, mode & 0o700)
    except OSError as exc:
        return (f"autodl's store file {path} has mode {mode:04o} (others may read other tenants' runs) and cannot "
                f"be tightened ({exc.strerror}); run chmod 600 {path} as its owner")
    return f"autodl's store file {path} had mode {mode:04o}; tightened to {mode & 0o700:04o} (owner only)"


def _folder_warning(folder: Path) -> str | None:
    try:
        mode = stat.S_IMODE(folder.stat().st_mode)
    except OSError:
        return None
    if mode & 0o022 and not mode & stat.S_ISVTX:
        return (f"autodl's store folder {folder} has mode {mode:04o}: others may replace the store file; "
                f"run chmod 700 {folder} (or chmod go-w)")
    return None


def create_private(path: Path) -> None:
    """Create ``path`` (an empty file) mode :data:`FILE_MODE` if it does not exist, whatever the umask."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def secure_sqlite_file(database: str | None) -> list[str]:
    """Make the SQLite store at ``database`` (a file path; None or ``:memory:`` do nothing) owner-only before it is
    opened (see the module docstring).

    :returns: the warnings it logged (each names the path and what to do).
    """
    if not database or database == ":memory:" or database.startswith("file:"):
        return []
    path = Path(database)
    if not path.parent.is_dir():
        return []  # SQLite's own error names the store (a folder is never made for a URL's path)
    warnings = [w for w in (_folder_warning(path.parent),) if w]
    if path.exists():
        warnings += [w for p in (path, *(path.with_name(path.name + s) for s in SIDE_SUFFIXES)) if (w := _tighten(p))]
    else:
        create_private(path)
    for w in warnings:
        log.warning("%s", w)
    return warnings


__all__ = ["FILE_MODE", "create_private", "secure_sqlite_file"]
