#!/bin/sh
# Watching a live job (docs/OPERATIONS.md "Metrics" and "ps_top"): ps_launch
# runs 1 server and 2 workers of ps_worker's click-through model (a table per
# field) with its metrics on, and then
#   - promtool check metrics passes on every process' /metrics;
#   - Debian's Prometheus, started with examples/prometheus/ (its scrape
#     config and rules, rewritten to this job's targets file, a 1 s interval
#     and a scratch storage directory), answers on its HTTP API with series
#     of samples/s, updates, rows per table and comm-wait, and a rate() of
#     updates above 0 while the job trains;
#   - ps_top --once prints a line for the server and for each worker;
#   - ps_top under tmux refreshes its view and quits on q;
#   - ps_top over CURVE reads a server with a key it accepts, and says "no
#     answer" with one it does not.
# One PASS/FAIL/SKIP line per case.  Everything started here is stopped by
# its PID (tmux by its own socket) when the test ends.
#
#   PS_BIN_DIR   where the programs are (default bin)
#   PS_TEST_KEEP keep the temp dir

ROOT=$(pwd -P)
BIN=$(cd "${PS_BIN_DIR:-bin}" 2>/dev/null && pwd -P) || BIN=$ROOT/bin
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_monitoring.XXXXXX") || exit 1
PY=/usr/bin/python3
TMUX_SOCK=ps_test_monitoring_$$
CASES="promtool_check_metrics_passes_on_every_process prometheus_scrapes_samples_updates_rows_and_comm_wait ps_top_once_prints_every_server_and_worker ps_top_live_view_refreshes_under_tmux_and_quits_on_q ps_top_reads_a_curve_server_with_an_accepted_key"
PIDS=""

stop_pid() { # PID: SIGTERM, then SIGKILL after 5 s
    kill "$1" 2>/dev/null || return 0
    i=0
    while kill -0 "$1" 2>/dev/null && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}
cleanup() {
    command -v tmux >/dev/null 2>&1 && tmux -L "$TMUX_SOCK" kill-server 2>/dev/null
    for p in $PIDS; do stop_pid "$p"; done
    [ -n "${PS_TEST_KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# pass, fail, skip_all (the job runs on between the cases: no leftover check)
. "$ROOT/tests/engine_lib.sh"
end_case() { if [ -z "$why" ]; then pass "$1"; else fail "$1" "${why#; }" "${2:-}"; fi; }
# free_port: a free TCP port on 127.0.0.1
free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# get URL: the body on stdout (urllib: curl need not be installed); 0 when it came
get() {
    "$PY" -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1" 2>/dev/null
}
# query EXPR: the number of series Prometheus' instant query returns, and
# their values, "N v1 v2 ..." ("0" on an error)
query() {
    "$PY" - "$PROM_PORT" "$1" <<'PY' 2>/dev/null || echo 0
import json, sys, urllib.parse, urllib.request
url = "http://127.0.0.1:%s/api/v1/query?query=%s" % (sys.argv[1], urllib.parse.quote(sys.argv[2]))
r = json.load(urllib.request.urlopen(url, timeout=5))
res = r["data"]["result"] if r.get("status") == "success" else []
print(len(res), " ".join(s["value"][1] for s in res))
PY
}
# wait_query EXPR SECONDS: until the query returns a series with a value > 0
wait_query() {
    i=0
    while [ "$i" -lt "$2" ]; do
        set -- "$1" "$2" $(query "$1")
        if [ "${3:-0}" -gt 0 ]; then
            shift 3
            for v in "$@"; do
                "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$v" && return 0
            done
        fi
        sleep 1
        i=$((i + 1))
        set -- "$1" "$2"
    done
    return 1
}

for p in "$PY" prometheus promtool; do
    command -v "$p" >/dev/null 2>&1 || skip_all "no $p (Debian: python3 prometheus; make deps)"
done

# ---------------------------------------------------------------- the job
JOB=$T/job.txt TARGETS=$T/ps_targets.json LOG=$T/launch.log
"$BIN/ps_launch" --servers 1 --workers 2 --mode async --gpus none --job-file "$JOB" \
    --metrics-targets "$TARGETS" -- --model ctr:fields=4,rows=20000,mlp=32-1 \
    --data synthetic-ctr:50000 --batch 64 --epochs 100000 --log-every 1000 >"$LOG" 2>&1 &
LAUNCH_PID=$!
PIDS="$LAUNCH_PID"
# the job file and three pages: the launcher's, the server's and the workers'
i=0
while [ "$i" -lt 300 ]; do
    [ -s "$JOB" ] && [ "$(grep -c 'ps_worker\[[01]\] info .*metrics: ' "$LOG")" -eq 2 ] && break
    kill -0 "$LAUNCH_PID" 2>/dev/null || break
    sleep 0.1
    i=$((i + 1))
done
TARGETS_OF=$(awk '$1 != "servers" && $1 != "curve-keys" && $1 !~ /^#/ { print $1 ":" $4 }' "$JOB")
W0=$(awk '$1 == "worker" && $2 == 0 { print $4 }' "$JOB")
# training has begun: worker 0 counted a step
i=0
while [ "$i" -lt 300 ]; do
    get "http://$W0/metrics" | grep -Eq '^ps_worker_steps_total\{[^}]*\} [1-9]' && break
    sleep 0.1
    i=$((i + 1))
done
if [ "$i" -ge 300 ]; then
    for c in $CASES; do fail "$c" "the job did not start training" "$LOG"; done
    exit 1
fi

# ---------------------------------------------------------------- promtool
case=promtool_check_metrics_passes_on_every_process
why=""
n=0
for t in $TARGETS_OF; do
    role=${t%%:*} addr=${t#*:}
    if ! get "http://$addr/metrics" >"$T/page.$role" || ! promtool check metrics <"$T/page.$role" \
        >"$T/promtool.out" 2>&1; then
        why="$why; $role at $addr: $(head -c 300 "$T/promtool.out")"
    fi
    n=$((n + 1))
done
[ "$n" -eq 4 ] || why="$why; $n processes in the job file, expected launch, 1 server, 2 workers"
end_case $case "$T/promtool.out"

# ---------------------------------------------------------------- Prometheus
case=prometheus_scrapes_samples_updates_rows_and_comm_wait
why=""
PROM_PORT=$(free_port)
mkdir -p "$T/prom/data"
cp "$ROOT/examples/prometheus/ps_rules.yml" "$T/prom/"
# the example's config for this job: its targets file, 1 s intervals
sed -e 's/scrape_interval: 5s/scrape_interval: 1s/' \
    -e 's/evaluation_interval: 5s/evaluation_interval: 1s/' \
    -e 's/refresh_interval: 5s/refresh_interval: 1s/' \
    -e "s#- ps_targets.json#- $TARGETS#" -e '/- ps_targets_\*.json/d' \
    "$ROOT/examples/prometheus/prometheus.yml" >"$T/prom/prometheus.yml"
promtool check config "$T/prom/prometheus.yml" >"$T/prom/check.out" 2>&1 ||
    why="$why; promtool check config: $(tail -n 3 "$T/prom/check.out" | paste -sd' ' -)"
prometheus --config.file="$T/prom/prometheus.yml" --storage.tsdb.path="$T/prom/data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$T/prom/prometheus.log" 2>&1 &
PROM_PID=$!
PIDS="$PIDS $PROM_PID"
for q in 'ps_worker_samples_total' 'ps_server_updates_total' \
    'ps_server_table_rows' 'ps_worker_comm_wait_seconds_total' \
    'rate(ps_server_updates_total[20s])' 'ps_job:samples_per_second:rate1m' \
    'ps_job:table_rows:sum'; do
    wait_query "$q" 60 || why="$why; no series > 0 for $q"
done
set -- $(query 'ps_server_table_rows')
[ "${1:-0}" -eq 4 ] || why="$why; ${1:-0} series of ps_server_table_rows, expected one per field (4)"
set -- $(query 'ps_worker_samples_total')
[ "${1:-0}" -eq 2 ] || why="$why; ${1:-0} series of ps_worker_samples_total, expected 2"
set -- $(query 'up{job="ps"} == 1')
[ "${1:-0}" -eq 4 ] || why="$why; ${1:-0} targets up, expected 4 (launch, server, 2 workers)"
end_case $case "$T/prom/prometheus.log"

# ---------------------------------------------------------------- ps_top --once
case=ps_top_once_prints_every_server_and_worker
why=""
timeout 30 "$BIN/ps_top" --job "$JOB" --once >"$T/top.out" 2>&1 || why="ps_top --once exited $?"
for l in "server 0 " "worker 0 " "worker 1 "; do
    grep -q "^$l" "$T/top.out" || why="$why; no '$l' line"
done
grep -q "no answer" "$T/top.out" && why="$why; a process did not answer"
# the workers train: their samples/s (the third column) are numbers above 0
awk '$1 == "worker" { if ($4 + 0 <= 0) bad = 1 } END { exit bad }' "$T/top.out" ||
    why="$why; a worker's samples/s is not above 0"
end_case $case "$T/top.out"

# ---------------------------------------------------------------- ps_top live
case=ps_top_live_view_refreshes_under_tmux_and_quits_on_q
why=""
if ! command -v tmux >/dev/null 2>&1; then
    echo "SKIP $case: skipped: no tmux (Debian: tmux; make deps)"
else
    tmux -L "$TMUX_SOCK" -f /dev/null new-session -d -s top -x 160 -y 40 \
        "$BIN/ps_top --job $JOB --interval 0.5; echo ps_top-exited-\$?; sleep 30" ||
        why="tmux did not start"
    # refresh N in the title goes up
    r1="" r2=""
    i=0
    while [ "$i" -lt 100 ] && [ -z "$why" ]; do
        r=$(tmux -L "$TMUX_SOCK" capture-pane -p -t top 2>/dev/null | sed -n 's/.* refresh \([0-9]*\) every.*/\1/p')
        if [ -n "$r" ]; then
            [ -z "$r1" ] && r1=$r
            [ "$r" -gt "$r1" ] && { r2=$r; break; }
        fi
        sleep 0.1
        i=$((i + 1))
    done
    [ -n "$r2" ] || why="$why; the view did not refresh (refresh ${r1:-none})"
    tmux -L "$TMUX_SOCK" capture-pane -p -t top >"$T/tmux.screen" 2>/dev/null
    for l in "server 0 " "worker 0 " "worker 1 "; do
        grep -q "^$l" "$T/tmux.screen" || why="$why; no '$l' line on the screen"
    done
    tmux -L "$TMUX_SOCK" send-keys -t top q
    i=0
    until tmux -L "$TMUX_SOCK" capture-pane -p -t top 2>/dev/null | grep -q 'ps_top-exited-0'; do
        i=$((i + 1))
        [ "$i" -ge 50 ] && { why="$why; ps_top did not exit 0 within 5 s of q"; break; }
        sleep 0.1
    done
    tmux -L "$TMUX_SOCK" kill-server 2>/dev/null
    end_case $case "$T/tmux.screen"
fi

# the job is done with: stop it as an operator would
kill -INT "$LAUNCH_PID" 2>/dev/null
stop_pid "$PROM_PID"

# ---------------------------------------------------------------- CURVE
case=ps_top_reads_a_curve_server_with_an_accepted_key
why=""
KEYS=$T/keys
"$BIN/ps_keygen" --dir "$KEYS" --servers 1 --workers 2 >/dev/null 2>&1 || why="ps_keygen failed"
rm -f "$KEYS/authorized/worker-1.pub" # worker-1's key is not accepted
SP=$(free_port)
"$BIN/ps_server" --bind "tcp://127.0.0.1:$SP" --curve-keys "$KEYS" --num-workers 1 \
    >"$T/curve-server.log" 2>&1 &
SRV_PID=$!
PIDS="$PIDS $SRV_PID"
timeout 30 "$BIN/ps_top" --servers "tcp://127.0.0.1:$SP" --curve-keys "$KEYS" --key worker-0 \
    --once --interval 0.2 >"$T/top-curve.out" 2>&1 || why="$why; ps_top with worker-0 exited $?"
grep -q "^server 0 .*tcp://127.0.0.1:$SP " "$T/top-curve.out" &&
    ! grep -q "no answer" "$T/top-curve.out" || why="$why; worker-0's key did not read the server"
timeout 30 "$BIN/ps_top" --servers "tcp://127.0.0.1:$SP" --curve-keys "$KEYS" --key worker-1 \
    --once --interval 0.2 --timeout 0.5 >"$T/top-refused.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || why="$why; ps_top with a refused key exited $rc, expected 1 (nothing answered)"
grep -q "^server 0 .*no answer: no answer from tcp://127.0.0.1:$SP" "$T/top-refused.out" ||
    why="$why; with a refused key, no 'no answer' line"
stop_pid "$SRV_PID"
end_case $case "$T/top-curve.out"

stop_pid "$LAUNCH_PID"
exit $failed
