#!/usr/bin/env bash
# Install (into .venv) and run a local node in the foreground: nsqd on 127.0.0.1:4150 (TCP)
# and 127.0.0.1:4151 (HTTP), data in ./data/nsqd. Ctrl-C stops it cleanly.
# Extra args go to nsqd, e.g. `bash scripts/run.sh --mem-queue-size=100`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p data/nsqd
exec .venv/bin/nsqd --tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 \
  --data-path=data/nsqd --broadcast-address=127.0.0.1 "$@"
