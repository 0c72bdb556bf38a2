#!/usr/bin/env bash
# Install (into .venv) and run a local cluster in the foreground: nsqlookupd on 127.0.0.1:4160
# (TCP) / 4161 (HTTP), nsqd on 127.0.0.1:4150 (TCP) / 4151 (HTTP) registered with it (data in
# ./data/nsqd), and nsqadmin on http://127.0.0.1:4171. Ctrl-C (or SIGTERM) stops them all
# cleanly and returns once all have finished their shutdown; the exit status is nsqd's.
# Extra args go to nsqd, e.g. `bash scripts/run.sh --mem-queue-size=100`. The addresses and
# the data path may be changed with NSQLOOKUPD_TCP_ADDRESS, NSQLOOKUPD_HTTP_ADDRESS,
# NSQD_TCP_ADDRESS, NSQD_HTTP_ADDRESS, NSQADMIN_HTTP_ADDRESS and NSQD_DATA_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
LOOKUPD_TCP=${NSQLOOKUPD_TCP_ADDRESS:-127.0.0.1:4160}
LOOKUPD_HTTP=${NSQLOOKUPD_HTTP_ADDRESS:-127.0.0.1:4161}
NSQD_TCP=${NSQD_TCP_ADDRESS:-127.0.0.1:4150}
NSQD_HTTP=${NSQD_HTTP_ADDRESS:-127.0.0.1:4151}
ADMIN_HTTP=${NSQADMIN_HTTP_ADDRESS:-127.0.0.1:4171}
DATA=${NSQD_DATA_PATH:-data/nsqd}
mkdir -p "$DATA"

lookupd= nsqd= admin=
stop() {
  # Ctrl-C reaches the daemons from the terminal too; SIGTERM covers `kill <this script>`
  if [ -n "$admin" ]; then kill -TERM "$admin" 2>/dev/null || true; fi
  if [ -n "$nsqd" ]; then kill -TERM "$nsqd" 2>/dev/null || true; fi
  if [ -n "$lookupd" ]; then kill -TERM "$lookupd" 2>/dev/null || true; fi
}
trap stop INT TERM

# reap: wait until process $1 has exited, across the signals trapped meanwhile; its status
reap() {
  local rc=0
  while :; do
    wait "$1" && rc=0 || rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$1" 2>/dev/null; then
      continue  # `wait` was interrupted by a trapped signal: the daemon is still shutting down
    fi
    if [ "$rc" -gt 128 ]; then
      wait "$1" && rc=0 || rc=$?  # it exited meanwhile: its own status
    fi
    return "$rc"
  done
}

.venv/bin/nsqlookupd --tcp-address="$LOOKUPD_TCP" --http-address="$LOOKUPD_HTTP" \
  --broadcast-address=127.0.0.1 &
lookupd=$!

# nsqd connects to nsqlookupd at once: start it only when nsqlookupd answers
if ! .venv/bin/python - "$lookupd" "$LOOKUPD_HTTP" <<'EOF'
import os, sys, time, urllib.request
pid, addr = int(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + 15
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(1)
    try:
        with urllib.request.urlopen(f"http://{addr}/ping", timeout=1) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.05)
print(f"run.sh: nsqlookupd did not answer on {addr} within 15s", file=sys.stderr)
sys.exit(1)
EOF
then
  stop
  rc=0; reap "$lookupd" || rc=$?
  echo "run.sh: nsqlookupd failed to start (exit status $rc)" >&2
  exit 1
fi

.venv/bin/nsqd --tcp-address="$NSQD_TCP" --http-address="$NSQD_HTTP" \
  --data-path="$DATA" --broadcast-address=127.0.0.1 \
  --lookupd-tcp-address="$LOOKUPD_TCP" "$@" &
nsqd=$!

.venv/bin/nsqadmin --http-address="$ADMIN_HTTP" --lookupd-http-address="$LOOKUPD_HTTP" &
admin=$!

status=0
reap "$nsqd" || status=$?
kill -TERM "$admin" "$lookupd" 2>/dev/null || true
reap "$admin" || true
reap "$lookupd" || true
exit "$status"
