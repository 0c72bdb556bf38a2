#!/usr/bin/env bash
# Install (into .venv) and run a local cluster in the foreground: nsqlookupd on 127.0.0.1:4160
# (TCP) / 4161 (HTTP) and nsqd on 127.0.0.1:4150 (TCP) / 4151 (HTTP), registered with it,
# data in ./data/nsqd. Ctrl-C (or SIGTERM) stops both cleanly.
# Extra args go to nsqd, e.g. `bash scripts/run.sh --mem-queue-size=100`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p data/nsqd
.venv/bin/nsqlookupd --tcp-address=127.0.0.1:4160 --http-address=127.0.0.1:4161 \
  --broadcast-address=127.0.0.1 &
lookupd=$!
.venv/bin/nsqd --tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 \
  --data-path=data/nsqd --broadcast-address=127.0.0.1 \
  --lookupd-tcp-address=127.0.0.1:4160 "$@" &
nsqd=$!
trap 'kill -TERM $nsqd $lookupd 2>/dev/null || true' INT TERM
wait $nsqd || true
kill -TERM $lookupd 2>/dev/null || true
wait $lookupd || true
