"""autodl's first process of a dry run in a container or pod: copy the code in, run the dry-run child, hand back its
report in the log.

Details: docs/reference/estimator.md#autodlprofile_container_entry.
"""

import base64
import hashlib
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
import zlib

CHUNK = 8000
"""Characters of base64 per report line (well under the 16 KiB at which Docker's log drivers split a line)."""

FILES = ("result.json", "alloc_events.json")


def copy_code(src, dest, max_files, max_bytes, max_depth):
    """Copy the regular files and folders of ``src`` into ``dest``; :returns: what was left out, one line each."""
    left, files, size = [], 0, 0
    stack = [(src, dest, 0)]
    while stack:
        folder, target, depth = stack.pop()
        try:
            names = sorted(os.listdir(folder))
        except OSError as exc:
            left.append(f"{folder} (cannot be listed: {exc.strerror})")
            continue
        for name in names:
            path, to = os.path.join(folder, name), os.path.join(target, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth >= max_depth:
                    left.append(f"{name}/ (folders nested more than {max_depth} deep)")
                    continue
                os.makedirs(to, exist_ok=True)
                stack.append((path, to, depth + 1))
            elif not stat.S_ISREG(st.st_mode):
                left.append(f"{name} (not a regular file)")
            elif files >= max_files or size + st.st_size > max_bytes:
                left.append(f"{name} (more than {max_files} files or {max_bytes} bytes)")
            elif not os.path.lexists(to):
                shutil.copyfile(path, to, follow_symlinks=False)
                files, size = files + 1, size + st.st_size
    return left


def read_file(path, limit):
    """``(base64 text, None)`` of a regular file of at most ``limit`` bytes, else ``(None, why)``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"not readable ({exc.strerror}): a link or worse"
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_size > limit:
            return None, f"larger than {limit} bytes"
        data = fh.read(limit + 1)
    if len(data) > limit:
        return None, f"larger than {limit} bytes"
    return base64.b64encode(data).decode(), None


def emit(report):
    text = base64.b64encode(zlib.compress(json.dumps(report).encode(), 6)).decode()
    chunks = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]
    out = sys.stdout
    for i, chunk in enumerate(chunks):
        out.write(f"@autodl-dryrun {i} {chunk}\n")
    out.write(f"@autodl-dryrun-end {len(chunks)} {hashlib.sha256(text.encode()).hexdigest()}\n")
    out.flush()


def run_child(cfg_path, box):
    """Run the dry-run child in ``work``; :returns: ``(exit status or None, timed out)``."""
    def bounds():
        for res, value in ((resource.RLIMIT_AS, box["memory_bytes"]), (resource.RLIMIT_CORE, 0),
                           (resource.RLIMIT_FSIZE, box["fsize_bytes"])):
            resource.setrlimit(res, (value, value))

    proc = subprocess.Popen([sys.executable, box["child"], cfg_path], cwd=box["work"], stdin=subprocess.DEVNULL,
                            stdout=2, stderr=2, preexec_fn=bounds, start_new_session=True)
    try:
        code, timed_out = proc.wait(timeout=box["timeout_s"]), False
    except subprocess.TimeoutExpired:
        code, timed_out = None, True
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its whole session: DataLoader workers, anything it started
    except OSError:
        pass
    if timed_out:
        proc.wait()
    return code, timed_out


def main(cfg_path):
    t0 = time.monotonic()
    with open(cfg_path) as fh:
        box = json.load(fh)["container"]
    left = copy_code(box["code"], box["work"], box["max_files"], box["max_bytes"], box["max_depth"])
    os.makedirs(os.path.join(box["work"], ".autodl-output"), exist_ok=True)
    code, timed_out = run_child(cfg_path, box)
    report = {"returncode": code, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 3),
              "left_out": left[:64], "files": {}}
    for name in FILES:
        data, why = read_file(os.path.join(box["out"], name), box["max_report_bytes"])
        report["files"][name] = {"data": data, "why": why}
    emit(report)


if __name__ == "__main__":
    main(sys.argv[1])
