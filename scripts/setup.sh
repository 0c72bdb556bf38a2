#!/usr/bin/env bash
# Create .venv (if missing) and install nsqpy with its dev and spark dependencies into it.
# Skips the install when pyproject.toml has not changed since the last one, and neither
# setup.py nor the C source of the compiled hot paths (src/nsqpy/_speedups/_hot.c, built in
# place by the editable install) is newer than it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.nsqpy-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
stale=
for f in setup.py src/nsqpy/_speedups/_hot.c; do
  if [ -f "$f" ] && [ "$f" -nt "$stamp" ]; then stale=1; fi
done
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ -n "$stale" ]; then
  # unlink the old build rather than let the build overwrite it in place: a process that
  # has it loaded (a test run meanwhile) keeps its copy
  rm -f src/nsqpy/_speedups/_hot.*.so
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,spark]'
  echo "$want" > "$stamp"
fi
# the package's bytecode, written now: an environment with PYTHONDONTWRITEBYTECODE set would
# otherwise compile every module again in each process that imports it (Spark starts several
# Python processes per query)
.venv/bin/python -m compileall -q src/nsqpy > /dev/null
