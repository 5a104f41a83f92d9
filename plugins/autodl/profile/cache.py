"""The profile cache: a profile reused while nothing it rests on changed, kept in autodl's store (issue 18, item 8).

Details: docs/reference/estimator.md#autodlprofilecache.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import JSON, DateTime, String, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from autodl.store import Base, session_factory
from autodl.types import Finding, ResourceProfile

FOLDER_MAX_FILES = 256
"""Files of the script's folder fingerprinted (:data:`autodl.profile.dryrun.MAX_STAGED_FILES`: what the dry run
is shown)."""

FOLDER_HASH_BYTES = 64 << 20
"""Bytes of the folder's files read for the fingerprint, together; past it a file counts by its size only (a data
file's values rarely change what a step allocates; its shape, and so its size, does)."""

FOLDER_DEPTH = 3
"""Deepest sub-folder fingerprinted (:data:`autodl.profile.dryrun.MIRROR_DEPTH`)."""

ENV_PREFIXES = ("AUTODL_DRYRUN_", "AUTODL_PROBE_")
"""Environment variables that bound the dry run and the probe (time, memory, disk): part of the key."""

PADDLE_DISTRIBUTIONS = ("paddlepaddle", "paddlepaddle-gpu")


class ProfileKey(BaseModel):
    """What a profile rests on, each part a SHA-256 (hex) or a version; ``key`` is the SHA-256 of them all."""

    model_config = ConfigDict(frozen=True)

    key: str
    parts: dict[str, str]


class ProfileCacheRow(Base):
    """One cached profile (migration ``0006``)."""

    __tablename__ = "autodl_profile_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    script: Mapped[str] = mapped_column(String(1024), index=True)
    spec_sha256: Mapped[str] = mapped_column(String(64))
    profile: Mapped[dict] = mapped_column(JSON)
    parts: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_on: Mapped[str | None] = mapped_column(String(250), nullable=True)


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def folder_fingerprint(script: Path) -> str:
    """SHA-256 of the files beside ``script`` that the dry run is shown: relative path, size and content of each
    regular file (hidden entries, ``__pycache__`` and autodl's or Airflow's state left out, as the dry run leaves
    them out), at most :data:`FOLDER_MAX_FILES` files and :data:`FOLDER_DEPTH` folders deep; content read up to
    :data:`FOLDER_HASH_BYTES` together, past it the size stands for a file."""
    from autodl.sandbox import protected_paths, why_protected

    root = script.resolve().parent
    guard = protected_paths(root)
    rows: list[str] = []
    budget = FOLDER_HASH_BYTES
    for dirpath, dirs, files in os.walk(root):
        here = Path(dirpath)
        depth = len(here.relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if depth < FOLDER_DEPTH and not why_protected(here / d, guard))
        for name in sorted(files):
            p = here / name
            if p == script.resolve() or why_protected(p, guard) or not p.is_file() or p.is_symlink():
                continue
            if len(rows) >= FOLDER_MAX_FILES:
                return _sha("\n".join(rows) + "\n(more files)")
            size = p.stat().st_size
            digest = "size-only"
            if size <= budget:
                try:
                    digest = _sha(p.read_bytes())
                    budget -= size
                except OSError:
                    digest = "unreadable"
            rows.append(f"{p.relative_to(root)}\t{size}\t{digest}")
    return _sha("\n".join(rows))


def _paddle_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in PADDLE_DISTRIBUTIONS:
        try:
            return f"{dist}=={version(dist)}"
        except PackageNotFoundError:
            continue
    return "not installed"


def estimator_files() -> list[Path]:
    """autodl's estimator code: every module of ``autodl/profile/`` and its packages (the dry-run child's too)."""
    return sorted(Path(__file__).resolve().parent.rglob("*.py"))


def _estimator_code() -> str:
    """SHA-256 of :func:`estimator_files` (path below ``autodl/profile/`` and content of each): a fixed estimator,
    the dry-run child included, never serves old figures."""
    here = Path(__file__).resolve().parent
    return _sha(b"".join(p.relative_to(here).as_posix().encode() + p.read_bytes() for p in estimator_files()))


def profile_key(script: Path, spec: Any, *, probe: bool | None, dry_run: bool | None = None,
                environ: dict[str, str] | None = None) -> ProfileKey:
    """The :class:`ProfileKey` of profiling ``script`` with ``spec`` (a :class:`autodl.spec.TaskSpec` or None).

    :param probe: the caller's ``probe`` (None: Paddle decides); a static-only profile is not a dry run's.
    :param environ: the environment to read the dry run's bounds from; default ``os.environ``.
    """
    import autodl

    env = os.environ if environ is None else environ
    spec_json = spec.model_dump_json(include={"task", "resource_policy", "launcher"}) if spec is not None else "{}"
    parts = {
        "script": _sha(script.read_bytes()),
        "path": str(script.resolve()),
        "folder": folder_fingerprint(script),
        "spec": _sha(spec_json),
        "environment": _sha(json.dumps(sorted((k, v) for k, v in env.items() if k.startswith(ENV_PREFIXES)))),
        "paddle": _paddle_version(),
        "autodl": f"{autodl.__version__} {_estimator_code()[:16]}",
        "mode": f"probe={probe} dry_run={dry_run}",
    }
    return ProfileKey(key=_sha(json.dumps(parts, sort_keys=True)), parts=parts)


def cacheable(profile: ResourceProfile, probe: bool | None) -> bool:
    """Whether ``profile`` is worth keeping: a dry run measured it, Paddle named the script's own error, or the
    script was not to be run (static only, by choice). A dry run that timed out or broke on a loaded machine, or a
    probe fallback, is not kept: the next profile tries again."""
    if profile.method == "dry_run" or probe is False:
        return True
    return any(f.code == "script-error" for f in profile.errors)


class ProfileCache:
    """Profiles in autodl's store, by :class:`ProfileKey`.

    :param url: SQLAlchemy URL; default :func:`autodl.config.store_url`.
    """

    def __init__(self, url: str | None = None):
        self._session = session_factory(url)

    def get(self, key: ProfileKey) -> tuple[ResourceProfile, datetime, str | None] | None:
        """The profile stored under ``key``, when it was made and on which host; None when there is none (or it no
        longer reads as a profile: an older autodl's)."""
        with self._session() as s:
            row = s.get(ProfileCacheRow, key.key)
            if row is None:
                return None
            try:
                return ResourceProfile.model_validate(row.profile), row.created_at, row.created_on
            except ValueError:
                return None

    def put(self, key: ProfileKey, profile: ResourceProfile) -> None:
        """Keep ``profile`` under ``key``; the same script's profiles with the same spec but another key (its code,
        folder, environment or versions changed since) are dropped."""
        with self._session() as s:
            s.execute(delete(ProfileCacheRow).where(ProfileCacheRow.script == key.parts["path"],
                                                    ProfileCacheRow.spec_sha256 == key.parts["spec"],
                                                    ProfileCacheRow.key != key.key))
            row = s.get(ProfileCacheRow, key.key)
            if row is None:
                row = ProfileCacheRow(key=key.key)
                s.add(row)
            row.script, row.spec_sha256, row.parts = key.parts["path"], key.parts["spec"], dict(key.parts)
            row.profile = json.loads(profile.model_dump_json())
            row.created_at = datetime.now(timezone.utc)
            row.created_on = socket.gethostname()[:250]
            s.commit()

    def scripts(self) -> list[str]:
        """The scripts with a cached profile (for ``autodl`` listings)."""
        with self._session() as s:
            return sorted(set(s.execute(select(ProfileCacheRow.script)).scalars()))

    def clear(self, script: str | None = None) -> int:
        """Forget the cached profiles of ``script`` (its resolved path), or all; :returns: how many."""
        with self._session() as s:
            q = delete(ProfileCacheRow)
            if script is not None:
                q = q.where(ProfileCacheRow.script == str(Path(script).resolve()))
            n = s.execute(q).rowcount or 0
            s.commit()
            return int(n)


def cached(profile_fn: Callable[..., ResourceProfile], *, url: str | None = None) -> Callable[..., ResourceProfile]:
    """``profile_fn`` (:func:`autodl.profile.profile_script`'s signature) reusing the profile cache.

    A hit is the stored profile with a ``profile-cache`` finding saying when and where it was made and its largest
    batch per device worked out again from ``catalog``; a miss profiles and keeps a :func:`cacheable` result. The
    profile's ``profile_key`` is set either way (run records carry it; measured-peak calibration matches on it).
    ``use_cache=False`` profiles again and replaces the stored one. A store that cannot be used never stops a
    profile: it is made afresh, with a warning.
    """
    def run(script, spec=None, *, catalog=None, probe=None, threshold=None, dry_run=None, use_cache=True, **kw):
        path = Path(script)
        try:
            key = profile_key(path, spec, probe=probe, dry_run=dry_run)
            store = ProfileCache(url)
            hit = store.get(key) if use_cache else None
        except Exception as exc:  # noqa: BLE001 - the cache is an optimisation; a fresh profile is always right
            prof = profile_fn(script, spec, catalog=catalog, probe=probe, threshold=threshold, dry_run=dry_run, **kw)
            return prof.model_copy(update={"findings": [*prof.findings, Finding(
                severity="warning", code="profile-cache", message=(
                    f"the profile cache in autodl's store could not be used ({type(exc).__name__}: "
                    f"{str(exc)[:200]}); the script was profiled afresh."))]})
        if hit is not None:
            return _reused(hit, key, spec, catalog, threshold)
        prof = profile_fn(script, spec, catalog=catalog, probe=probe, threshold=threshold, dry_run=dry_run, **kw)
        prof = prof.model_copy(update={"profile_key": key.key})
        if cacheable(prof, probe):
            try:
                store.put(key, prof)
            except Exception as exc:  # noqa: BLE001
                prof = prof.model_copy(update={"findings": [*prof.findings, Finding(
                    severity="warning", code="profile-cache", message=(
                        f"the profile could not be kept in autodl's store ({type(exc).__name__}); the next "
                        "profile of this script runs it again."))]})
        return prof
    return run


def _autodl_part(key: ProfileKey) -> str:
    """The key's autodl part as said: its version and its estimator code's hash (an upgrade that changes the
    estimator profiles again though the version may be the same)."""
    version, _, code = key.parts["autodl"].partition(" ")
    return f"{version}, estimator code {code[:12]}" if code else version


def _reused(hit: tuple[ResourceProfile, datetime, str | None], key: ProfileKey, spec: Any, catalog: Any,
            threshold: float | None) -> ResourceProfile:
    from autodl.catalog import load_catalog
    from autodl.spec import DEFAULT_MEMORY_THRESHOLD

    prof, made, host = hit
    catalog = catalog or load_catalog()
    if threshold is None:
        threshold = spec.resource_policy.memory_threshold if spec is not None else DEFAULT_MEMORY_THRESHOLD
    by_device = {name: b for name, m in catalog.models.items()
                 if (b := prof.max_batch_size(m.memory_bytes, threshold)) is not None}
    note = Finding(severity="info", code="profile-cache", message=(
        f"this profile was made at {made:%Y-%m-%d %H:%M} UTC" + (f" on {host}" if host else "") + " and is reused: "
        f"the script, the files beside it, the spec, the dry run's environment, Paddle ({key.parts['paddle']}) and "
        f"autodl ({_autodl_part(key)}) are unchanged (key {key.key[:12]}); a change to any of them "
        "profiles again (`autodl profile --no-cache` forces it)."))
    return prof.model_copy(update={"findings": [*prof.findings, note], "max_batch_size_by_device": by_device,
                                   "profile_key": key.key})


__all__ = ["ProfileCache", "ProfileKey", "cached", "cacheable", "estimator_files", "folder_fingerprint", "profile_key"]
