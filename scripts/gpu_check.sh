#!/usr/bin/env bash
# The GPU check in one command (docs/gpu-check.md): installs the wheels carried in .whl/ (pydantic, SQLAlchemy,
# Alembic and their dependencies, for a host that lacks them) into a target folder, puts it and plugins/ on the
# path, and runs benchmarks/gpu_check.py, which writes gpu_check.json and gpu_check.txt into $OUT
# (default ./gpu_check_out). Exit 0: every step passed or could not run here (said why); 1: a step failed.
# Environment: PYTHON (default python3), GPU_CHECK_TARGET (default a fresh temporary folder, removed at exit). It never changes the card's settings.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  # a fresh folder outside $OUT (what is under $OUT comes back), removed at exit; or GPU_CHECK_TARGET, kept
  target="${GPU_CHECK_TARGET:-$(mktemp -d "${TMPDIR:-/tmp}/autodl_gpu_check_site.XXXXXX")}"
  [ -n "${GPU_CHECK_TARGET:-}" ] || trap 'rm -rf "$target"' EXIT
  # offline: only the carried wheels, never an index (the device machine has no network)
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --find-links .whl \
    --target "$target" --upgrade .whl/*.whl
  echo "installed $(ls .whl/*.whl | wc -l) carried wheel(s) into $target"
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "no .whl/ here: using the packages $PYTHON already has"
fi
export PYTHONPATH="$PWD/plugins${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -u benchmarks/gpu_check.py --out "$OUT" "$@"
