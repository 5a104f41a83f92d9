"""A security review's hostile runs (issue 13, helper sectest) through the real sandbox.

Seen before the fixes: a probe wrote 2.5 GiB into its working folder (a host folder under /tmp) in 15 s, with no
bound but the 120 s timeout and the 8 GiB per-file ``RLIMIT_FSIZE``; many small files or deep folders were not
bounded at all; and a caller reading a file the child left there would follow a symlink the child planted (to the
caller's own ``/proc/self/environ``) or block for good on a named pipe. Now the working folder is measured while the
command runs (bytes, entries, depth: over a bound the tree is killed, ``disk_exceeded`` and a note say so), each file
is bounded by the kernel (``RLIMIT_FSIZE`` = ``disk_bytes``), the tmpfs ``/tmp`` is bounded without a cgroup too, and
:func:`autodl.sandbox.read_output` reads the child's files without trusting them.
"""

from __future__ import annotations

import os
import sys

import pytest

from autodl.sandbox import SandboxLimits, read_output, run_sandboxed, workdir_usage

pytestmark = [pytest.mark.sandbox]

MiB = 1 << 20


def run(code: str, workdir, **limits):
    base = dict(timeout_s=60, memory_bytes=1 << 30, max_processes=64)
    base.update(limits)
    return run_sandboxed([sys.executable, "-c", code], workdir=workdir, limits=SandboxLimits(**base),
                         env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


def used(folder) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(folder) for f in fs)


def test_many_files_each_under_the_file_limit_are_bounded_in_total(sandbox_level, workdir):
    code = ("import time\n"
            "for i in range(64):\n"
            "    open(f'part{i}', 'wb').write(b'1' * (8 << 20))\n"
            "    time.sleep(0.1)\n"
            "print('wrote all', flush=True)\n"
            "time.sleep(50)\n")
    r = run(code, workdir, disk_bytes=32 * MiB)
    assert r.disk_exceeded and not r.timed_out and "wrote all" not in r.stdout
    assert any("working folder" in n and "killed" in n for n in r.notes), r.notes
    assert used(workdir) < 64 * 8 * MiB  # before, all 512 MiB were written (and 2.5 GiB by a probe in 15 s)


def test_one_file_is_bounded_by_the_kernel(sandbox_level, workdir):
    code = ("import errno\n"
            "try:\n"
            "    with open('big', 'wb') as f:\n"
            "        for _ in range(8):\n"
            "            f.write(b'1' * (4 << 20)); f.flush()\n"
            "except OSError as e:\n"
            "    print('refused', errno.errorcode[e.errno])\n")
    r = run(code, workdir, disk_bytes=16 * MiB)
    assert "refused EFBIG" in r.stdout, (r.stdout, r.stderr)
    assert os.path.getsize(workdir / "big") <= 16 * MiB


def test_countless_empty_files_are_bounded(sandbox_level, workdir):
    code = ("import time\n"
            "for i in range(5000):\n"
            "    open(f'f{i}', 'w').close()\n"
            "time.sleep(50)\n")
    r = run(code, workdir, max_files=200)
    assert r.disk_exceeded and not r.timed_out and any("200 files" in n for n in r.notes), r.notes


def test_deep_folders_cannot_hide_bytes_from_the_measurement(sandbox_level, workdir):
    code = ("import os, time\n"
            "for _ in range(60):\n"
            "    os.mkdir('d'); os.chdir('d')\n"
            "time.sleep(50)\n")
    r = run(code, workdir)
    assert r.disk_exceeded and not r.timed_out and any("nested" in n for n in r.notes), r.notes


def test_without_a_cgroup_the_tmpfs_is_bounded_too(sandbox_level, workdir, monkeypatch):
    """/tmp and /dev/shm are host memory that no rlimit counts: without a cgroup they are at most disk_bytes."""
    import autodl.sandbox as sandbox

    def no_cgroup(*_a, **_k):
        raise OSError("no cgroup in this test")

    monkeypatch.setattr(sandbox, "_Cgroup", no_cgroup)
    code = ("import errno\n"
            "for d in ('/tmp', '/dev/shm'):\n"
            "    try:\n"
            "        for i in range(6):\n"
            "            open(f'{d}/x{i}', 'wb').write(b'1' * (6 << 20))\n"
            "        print(d, 'unbounded')\n"
            "    except OSError as e:\n"
            "        print(d, errno.errorcode[e.errno])\n")
    r = run(code, workdir, disk_bytes=16 * MiB, max_processes=64)
    assert "/tmp ENOSPC" in r.stdout and "/dev/shm ENOSPC" in r.stdout, (r.stdout, r.stderr)


def test_a_well_behaved_run_is_not_stopped(sandbox_level, workdir):
    r = run("open('result.json', 'w').write('{\"ok\": true}')", workdir, disk_bytes=1 * MiB, max_files=10)
    assert r.returncode == 0 and not r.disk_exceeded
    assert read_output(workdir, "result.json", max_bytes=1000) == b'{"ok": true}'


def test_read_output_never_trusts_what_the_child_left(sandbox_level, workdir, tmp_path):
    """The child plants a symlink to a host file, a symlinked folder, a named pipe, a sparse giant and a normal
    file; only the normal file is read, and nothing blocks."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET")
    code = ("import os\n"
            f"os.symlink({str(secret)!r}, 'link.json')\n"
            "os.symlink('/proc/self/environ', 'environ.json')\n"
            "os.mkdir('real'); open('real/result.json', 'w').write('{}')\n"
            "os.symlink('real', 'out')\n"
            "os.mkfifo('fifo.json')\n"
            "f = open('sparse.json', 'wb'); f.truncate(1 << 30); f.close()\n"
            "open('ok.json', 'w').write('[1]')\n")
    r = run(code, workdir)
    assert r.returncode == 0, r.stderr
    assert read_output(workdir, "link.json", max_bytes=1 << 20) is None
    assert read_output(workdir, "environ.json", max_bytes=1 << 20) is None
    assert read_output(workdir, "out/result.json", max_bytes=1 << 20) is None  # a folder that is a symlink
    assert read_output(workdir, "fifo.json", max_bytes=1 << 20) is None
    assert read_output(workdir, "sparse.json", max_bytes=1 << 20) is None
    assert read_output(workdir, "../host-secret.txt", max_bytes=1 << 20) is None
    assert read_output(workdir, "real/result.json", max_bytes=1 << 20) == b"{}"
    assert read_output(workdir, "ok.json", max_bytes=1 << 20) == b"[1]"
    # the sparse file holds almost no disk, so it did not trip the working folder's bound either
    assert workdir_usage(workdir, max_bytes=1 << 20, max_files=100) is None
