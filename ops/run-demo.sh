#!/usr/bin/env bash
# `make run`: the fake providers (demo/fakes), one worker and the demo producer (demo).
# Everything here was set up by `make setup`. Ctrl-C stops what this started.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${VENV:-.venv}/bin"
LOGS=".cache/run"
mkdir -p "$LOGS"
WEB_BIND="${WEB_BIND:-127.0.0.1}"
WEB_PORT="${WEB_PORT:-6066}"
FAKES_PORT="${FAKES_PORT:-8900}"
# What sends every effect to the fakes, whichever provider it picks (EFFECTS__WAYBILL__PROVIDER=express
# make run), from the fakes' registry as the tests get it; a setting you export yourself wins.
while IFS= read -r setting; do export "$setting"; done \
  < <("$BIN/python" -m demo.fakes --worker-settings "http://127.0.0.1:$FAKES_PORT")
# The demo's deployment secret (docs, "Idempotency tokens"): fixed, so a restarted demo
# derives the tokens its last run did. A real deployment sets a random one of its own.
export IDEM_TOKEN_SECRET="${IDEM_TOKEN_SECRET:-demo-only-not-a-production-secret}"
# The console's actions need a bearer token: one for this run unless you bring your own.
export WEB_TOKEN="${WEB_TOKEN:-$("${VENV:-.venv}/bin/python" -c 'import secrets; print(secrets.token_urlsafe(18))')}"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

wait_http() {  # wait_http <url> <what> <log>
  for _ in $(seq 1 150); do
    if "$BIN/python" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$1" 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "[run] $2 did not answer at $1; read $3" >&2
  exit 1
}

"$BIN/python" -m demo.fakes --port "$FAKES_PORT" >"$LOGS/fakes.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$FAKES_PORT/__health" "the fake services" "$LOGS/fakes.log"

"$BIN/faust" -A app worker -l info >"$LOGS/worker.log" 2>&1 &
pids+=($!)
wait_http "http://$WEB_BIND:$WEB_PORT/health" "the worker" "$LOGS/worker.log"

"$BIN/python" -m demo --orders "${DEMO_ORDERS:-100}"
cat <<MSG

[run] worker up.
      console:               http://$WEB_BIND:$WEB_PORT/console/   (token, to read and to act: $WEB_TOKEN)
      compensation queue:    http://$WEB_BIND:$WEB_PORT/compensation/
      health, readiness:     http://$WEB_BIND:$WEB_PORT/healthz  http://$WEB_BIND:$WEB_PORT/readyz
      metrics:               http://$WEB_BIND:$WEB_PORT/metrics
      fake services ledger:  http://127.0.0.1:$FAKES_PORT/__ledger
      logs:                  $LOGS/worker.log, $LOGS/fakes.log
      Ctrl-C stops the worker and the fake services.

MSG
tail -n +1 -f "$LOGS/worker.log" &
pids+=($!)
wait "${pids[1]}"
