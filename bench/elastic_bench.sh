#!/bin/sh
# elastic_bench: a worker joining a running async job (docs/OPERATIONS.md
# "Elastic jobs", issue 33's goal).  Each round: 1 ps_server (async,
# --num-workers 2:3) and 2 ps_worker processes (the MLP on synthetic data,
# --threads 1, a log line every ELASTIC_LOG_EVERY steps) train for
# ELASTIC_WARM s; then a 3rd worker (rank 2) starts and the round goes on
# for ELASTIC_AFTER s after that.  From the workers' log timestamps:
#   S  the joiner's "model built; rank 2 joins" line (its start, after the
#      model is built: the goal's clock), J its "joined the job at step"
#      line, F its "step N done, this worker's first" line;
#   the total samples/s of all workers in windows around S, from every
#   worker's iter lines (steps between two lines spread evenly over the time
#   between them; the joiner's steps count from J).
# Goals (medians over ELASTIC_ROUNDS rounds): F - S <= 2 s; the total
# samples/s in [S+2, S+5] >= 1.05x the total in [S-3, S] (a rise beyond the
# run-to-run noise of a 2-worker job).
#   ELASTIC_ROUNDS (3)  ELASTIC_WARM (5)  ELASTIC_AFTER (6)
#   ELASTIC_LOG_EVERY (50)  PS_BIN_DIR (bin)
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
bench_init
PY=/usr/bin/python3
ROUNDS=${ELASTIC_ROUNDS:-3}
WARM=${ELASTIC_WARM:-5}
AFTER=${ELASTIC_AFTER:-6}
LOG_EVERY=${ELASTIC_LOG_EVERY:-50}
BATCH=64
FLAGS="--model mlp:784-256-128-10 --data synthetic:4096 --batch $BATCH --threads 1 --epochs 100000
 --steps 100000000 --log-every $LOG_EVERY --mode async --num-workers 2:3"

# wait_line FILE PATTERN SECONDS: until FILE has a line matching PATTERN
wait_line() {
    _t=0
    while ! grep -q "$2" "$1" 2>/dev/null; do
        [ "$_t" -ge $(($3 * 20)) ] && return 1
        sleep 0.05
        _t=$((_t + 1))
    done
}

# one_round N: prints "first_step_s join_s before_sps after_sps" and the
# total samples/s of each second from S-3 to S+5; non-zero when a process
# failed
one_round() {
    start_servers 1 2:3 async || return 1
    WORKER_PIDS=""
    for r in 0 1; do
        # shellcheck disable=SC2086
        $BENCH_LIMIT "$BIN/ps_worker" --servers "$PS_SERVERS" --rank "$r" $FLAGS \
            >"$WORK/r$1.worker$r.log" 2>&1 &
        WORKER_PIDS="$WORKER_PIDS $!"
    done
    for r in 0 1; do
        wait_line "$WORK/r$1.worker$r.log" " iter " 60 ||
            { echo "$0: round $1: worker $r did not train" >&2; return 1; }
    done
    sleep "$WARM"
    # shellcheck disable=SC2086
    $BENCH_LIMIT "$BIN/ps_worker" --servers "$PS_SERVERS" --rank 2 $FLAGS \
        >"$WORK/r$1.worker2.log" 2>&1 &
    WORKER_PIDS="$WORKER_PIDS $!"
    wait_line "$WORK/r$1.worker2.log" "model built" 60 ||
        { echo "$0: round $1: the joiner did not start" >&2; return 1; }
    sleep "$AFTER"
    for p in $WORKER_PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $WORKER_PIDS; do wait "$p" 2>/dev/null; done
    WORKER_PIDS=""
    stop_servers
    "$PY" - "$BATCH" "$WORK/r$1.worker0.log" "$WORK/r$1.worker1.log" "$WORK/r$1.worker2.log" <<'PY'
import re, sys
batch = int(sys.argv[1])
ts = re.compile(r" (\d\d):(\d\d):(\d\d)\.(\d{3}): ")
def sec(line):
    m = ts.search(line)
    return None if not m else int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) + int(m[4]) / 1000
points, marks = [], {}
for i, path in enumerate(sys.argv[2:]):
    pts = []
    for line in open(path, errors="replace"):
        t = sec(line)
        if t is None:
            continue
        m = re.search(r" iter (\d+)/", line)
        if m:
            pts.append((t, int(m[1])))
        elif i == 2 and "model built" in line:
            marks["S"] = t
        elif i == 2 and (m := re.search(r"joined the job at step (\d+)", line)):
            marks["J"] = t
            pts.append((t, int(m[1])))
        elif i == 2 and "this worker's first" in line:
            marks["F"] = t
    points.append(pts)
if not all(k in marks for k in "SJF"):
    sys.exit("elastic_bench: the joiner's log lacks its start, join or first step: %s" % marks)
def steps(pts, t):  # steps done by time t, even between two log lines
    if not pts or t <= pts[0][0]:
        return pts[0][1] if pts else 0
    for (t0, s0), (t1, s1) in zip(pts, pts[1:]):
        if t <= t1:
            return s0 + (s1 - s0) * (t - t0) / (t1 - t0) if t1 > t0 else s1
    return pts[-1][1]
def total(a, b):
    return sum(steps(p, b) - steps(p, a) for p in points) * batch / (b - a)
S = marks["S"]
per_s = " ".join("%+d:%.0f" % (k, total(S + k, S + k + 1)) for k in range(-3, 5))
print("%.3f %.3f %.0f %.0f %s" % (marks["F"] - S, marks["J"] - S, total(S - 3, S), total(S + 2, S + 5),
                              per_s))
PY
}

echo "elastic_bench: 1 server, 2 async workers and a 3rd joining, on $(nproc) cores (load $(cut -d' ' -f1 /proc/loadavg) at the start)" >&2
echo "### A worker joining an async job of 2"
echo
echo "1 ps_server (async, \`--num-workers 2:3\`), 2 ps_worker (mlp:784-256-128-10,"
echo "synthetic:4096, batch $BATCH, \`--threads 1\`) training ${WARM} s, then a 3rd joins;"
echo "times from the joiner's start S (its \"model built\" log line)."
echo
echo "| round | join (J - S) s | first step (F - S) s | total samples/s [S-3, S] | total samples/s [S+2, S+5] | after / before | total samples/s of each second from S (second:samples/s) |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"
firsts="" ratios="" fail=0
n=1
while [ "$n" -le "$ROUNDS" ]; do
    if ! res=$(one_round "$n" 2>"$WORK/round$n.err"); then
        cat "$WORK/round$n.err" >&2
        echo "$0: round $n failed" >&2
        fail=1
        break
    fi
    cat "$WORK/round$n.err" >&2
    # shellcheck disable=SC2086
    set -- $res
    ratio=$(awk -v a="$4" -v b="$3" 'BEGIN { printf "%.3f", a / b }')
    f=$1 j=$2 before=$3 after=$4
    shift 4
    echo "| $n | $j | $f | $before | $after | $ratio | $* |"
    firsts="$firsts $f" ratios="$ratios $ratio"
    n=$((n + 1))
done
median() { echo $* | tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
mf=$(median $firsts) mr=$(median $ratios)
echo
if [ -n "$mf" ] && awk -v f="$mf" 'BEGIN { exit !(f <= 2.0) }'; then
    echo "GOAL a worker joining an async job of 2: its first step within 2 s of its start: MET (median $mf s)"
else
    echo "GOAL a worker joining an async job of 2: its first step within 2 s of its start: MISSED (median ${mf:-none} s)"
fi
if [ -n "$mr" ] && awk -v r="$mr" 'BEGIN { exit !(r >= 1.05) }'; then
    echo "GOAL a worker joining an async job of 2: total samples/s rises within 5 s (>= 1.05x): MET (median $mr)"
else
    echo "GOAL a worker joining an async job of 2: total samples/s rises within 5 s (>= 1.05x): MISSED (median ${mr:-none})"
fi
exit $fail
