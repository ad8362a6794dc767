# Helpers shared by the shell benchmarks; source it (POSIX sh).
#   BIN    where ps_server / ps_worker are (PS_BIN_DIR, default bin)
#   WORK   a scratch directory for logs (made by bench_init, removed at exit
#          unless BENCH_KEEP=1)
#   BENCH_TIMEOUT  seconds each server and worker may run (timeout -k 5), so
#          a hung run ends as a failed one; unset: no limit

BIN=${PS_BIN_DIR:-bin}
# the command prefix of every server and worker run
BENCH_LIMIT=${BENCH_TIMEOUT:+timeout -k 5 $BENCH_TIMEOUT}
SERVER_PIDS=""
WORKER_PIDS=""

bench_init() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/ps_bench.XXXXXX") || exit 1
    trap 'bench_cleanup' EXIT
    trap 'bench_cleanup; exit 130' INT TERM
    for p in ps_server ps_worker; do
        if [ ! -x "$BIN/$p" ]; then
            echo "$0: $BIN/$p not found; run make first (or set PS_BIN_DIR)" >&2
            exit 1
        fi
    done
}

bench_cleanup() {
    for p in $WORKER_PIDS $SERVER_PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $WORKER_PIDS $SERVER_PIDS; do wait "$p" 2>/dev/null; done
    WORKER_PIDS="" SERVER_PIDS=""
    if [ -n "$WORK" ] && [ "${BENCH_KEEP:-0}" != 1 ]; then rm -rf "$WORK"; fi
}

# start_servers N W MODE [server flags...]: N ps_server processes on free
# loopback ports (tcp://127.0.0.1:*, read back from the "listening on" line);
# sets PS_SERVERS (comma list in rank order) and SERVER_PIDS.
start_servers() {
    _n=$1 _w=$2 _mode=$3
    shift 3
    PS_SERVERS="" SERVER_PIDS=""
    _i=0
    while [ "$_i" -lt "$_n" ]; do
        _log=$WORK/server$_i.log
        # an old log would hand us the last server's port before this one writes
        rm -f "$_log"
        $BENCH_LIMIT "$BIN/ps_server" --bind 'tcp://127.0.0.1:*' --rank "$_i" --num-servers "$_n" \
            --num-workers "$_w" --mode "$_mode" "$@" >"$_log" 2>&1 &
        SERVER_PIDS="$SERVER_PIDS $!"
        _ep="" _t=0
        while [ -z "$_ep" ] && [ "$_t" -lt 200 ]; do
            [ -f "$_log" ] && _ep=$(sed -n 's/.*listening on \(.*\)$/\1/p' "$_log")
            [ -n "$_ep" ] || { sleep 0.05; _t=$((_t + 1)); }
        done
        if [ -z "$_ep" ]; then
            echo "$0: server $_i did not start:" >&2
            cat "$_log" >&2
            return 1
        fi
        PS_SERVERS="${PS_SERVERS:+$PS_SERVERS,}$_ep"
        _i=$((_i + 1))
    done
}

stop_servers() {
    for p in $SERVER_PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $SERVER_PIDS; do wait "$p" 2>/dev/null; done
    SERVER_PIDS=""
}

# summary_sps LOG: the samples/s of the worker's "summary:" line
summary_sps() {
    sed -n 's/.*summary: time [0-9.]* s, \([0-9.]*\) samples\/s per worker.*/\1/p' "$1" | tail -n 1
}

# run_workers W MODE [worker flags...]: W ps_worker processes against
# PS_SERVERS (or alone with --servers none when MODE is "none"), waited for;
# prints the mean samples/s per worker.  Non-zero (and prints nothing) when
# one failed.
run_workers() {
    _w=$1 _mode=$2
    shift 2
    WORKER_PIDS=""
    _r=0
    while [ "$_r" -lt "$_w" ]; do
        if [ "$_mode" = none ]; then
            $BENCH_LIMIT "$BIN/ps_worker" --servers none --rank 0 --num-workers 1 "$@" \
                >"$WORK/worker$_r.log" 2>&1 &
        else
            $BENCH_LIMIT "$BIN/ps_worker" --servers "$PS_SERVERS" --rank "$_r" --num-workers "$_w" \
                --mode "$_mode" "$@" >"$WORK/worker$_r.log" 2>&1 &
        fi
        WORKER_PIDS="$WORKER_PIDS $!"
        _r=$((_r + 1))
    done
    wait_summaries "$_w" worker "$_mode"
}

# wait_summaries W PREFIX WHAT: wait for WORKER_PIDS, then print the mean of
# the samples/s of the summary lines in $WORK/PREFIX0.log ... PREFIX<W-1>.log.
# Non-zero (and prints nothing) when a worker failed or printed no summary.
wait_summaries() {
    _bad=0
    for p in $WORKER_PIDS; do wait "$p" || _bad=1; done
    WORKER_PIDS=""
    _sum=0 _r=0
    while [ "$_r" -lt "$1" ]; do
        _s=$(summary_sps "$WORK/$2$_r.log")
        if [ -z "$_s" ]; then
            _bad=1
            echo "$0: worker $_r ($3) printed no summary; its log ends:" >&2
            tail -n 5 "$WORK/$2$_r.log" >&2
        else
            _sum=$(awk -v a="$_sum" -v b="$_s" 'BEGIN { print a + b }')
        fi
        _r=$((_r + 1))
    done
    # nothing on stdout when a worker failed, so callers see an empty result
    [ "$_bad" -eq 0 ] && awk -v a="$_sum" -v w="$1" 'BEGIN { printf "%.0f\n", a / w }'
    return $_bad
}

# max A B
fmax() { awk -v a="$1" -v b="$2" 'BEGIN { print (a > b ? a : b) }'; }

# machine: one line about this host
machine_line() {
    _m=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
    echo "${_m:-unknown CPU}, $(nproc) cores"
}
