#!/usr/bin/env bash
# Creates .venv (Python 3.11) with the pinned requirements and autodl installed editable. Idempotent:
# re-running only installs what changed (a stamp file records the requirements' hash).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.autodl-requirements.sha
want=$(cat requirements.txt pyproject.toml sim/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  .venv/bin/python -m pip install -q --no-deps -e .
  # the scheduling simulator (`autodl simulate`, benchmarks/scheduling.py) is its own distribution: sim/
  .venv/bin/python -m pip install -q --no-deps -e sim
  echo "$want" > "$stamp"
fi
# setuptools leaves plugins/airflow_provider_autodl.egg-info behind; Airflow puts plugins/ on sys.path, sees the entry point
# there and in the installed package, and reports "Plugin 'autodl' already registered". The installed
# metadata is all that is needed.
rm -rf plugins/*.egg-info sim/src/*.egg-info
# the sandbox user code runs in (autodl.sandbox) is bubblewrap: install it when missing, where this user may
if ! command -v bwrap >/dev/null 2>&1; then
  bash .ci/bubblewrap.sh || echo "setup.sh: without bubblewrap autodl does not run user code (the probe falls back to the static estimate)" >&2
fi
