"""Helpers of the hostile-script tests: run code in the real sandbox, find processes that outlived it."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil

from autodl.sandbox import SandboxLimits, run_sandboxed


def survivors(marker: str) -> list[psutil.Process]:
    """Host processes (the sandbox's included: the host sees every PID namespace) whose command line holds ``marker``."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def run_code(code: str, workdir: Path, *, timeout_s: float = 60, memory_bytes: int = 1 << 30,
             max_processes: int = 64, max_output_bytes: int = 16 << 20, env: dict | None = None,
             argv: list[str] | None = None, **kw):
    """Run ``python -c code`` in the sandbox."""
    return run_sandboxed([sys.executable, "-c", code, *(argv or [])], workdir=workdir,
                         limits=SandboxLimits(timeout_s=timeout_s, memory_bytes=memory_bytes,
                                              max_processes=max_processes, max_output_bytes=max_output_bytes),
                         env=env or {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, **kw)
