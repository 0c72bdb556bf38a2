#!/usr/bin/env bash
# Install everything (into .venv) and run the whole test suite. Extra args go to pytest.
# Then tests/protocol and tests/nsqd run a second time on the pure-Python hot paths
# (NSQPY_PURE_PYTHON=1), the reference implementations of nsqpy._speedups' compiled ones,
# with the same pytest options (paths given in the args are left out of that second run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
status=0
.venv/bin/python -m pytest "$@" || status=$?
opts=()
for a in "$@"; do
  if [ -e "${a%%::*}" ]; then continue; fi  # a test path: the second run has its own
  opts+=("$a")
done
echo "== tests/protocol and tests/nsqd again on the pure-Python hot paths (NSQPY_PURE_PYTHON=1)"
NSQPY_PURE_PYTHON=1 .venv/bin/python -m pytest "${opts[@]+"${opts[@]}"}" tests/protocol tests/nsqd || status=$?
exit $status
