#!/usr/bin/env bash
# Create .venv (if missing) and install nsqpy with its dev dependencies into it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
