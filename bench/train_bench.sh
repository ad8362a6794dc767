#!/bin/sh
# train_bench: the worker's step time through the servers against compute only
# (ps_worker --servers none: same binary, model, batch and data, in the same
# run), async and sync with 1 server and 1 worker; and the MLP's samples/s
# per worker with W=1 and W=2 workers (1 server).  Prints markdown tables and
# GOAL lines.  Each configuration runs REPS times, alternating, best kept.
#
#   TRAIN_MLP_STEPS (900)  TRAIN_CNN_STEPS (30)  TRAIN_REPS (3)  TRAIN_CNN_REPS (2)
#   TRAIN_DATA (Fashion-MNIST dir; MLP)  PS_BIN_DIR (bin)
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
bench_init

MLP=mlp:784-256-128-10
MLP_STEPS=${TRAIN_MLP_STEPS:-900}
CNN_STEPS=${TRAIN_CNN_STEPS:-30}
REPS=${TRAIN_REPS:-3}
CNN_REPS=${TRAIN_CNN_REPS:-2}
DATA=${TRAIN_DATA:-/usr/share/datasets/fashion-mnist}
LR=0.05
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -f "$DATA/train-images-idx3-ubyte" ]; then
    echo "train_bench: $DATA has no Fashion-MNIST; using synthetic:60000" >&2
    DATA=synthetic:60000
fi
# the CNN's test pass (outside the timed loop) is long: a small synthetic set
# keeps it short; --steps below one epoch keeps evaluation out of the timing
CNN_DATA=synthetic:$((64 * (CNN_STEPS + 2) * 2))
COMMON="--batch 64 --threads 1 --lr $LR --log-every 1000000"

# measure KIND MODEL DATA STEPS W: "samples/s-per-worker comm-wait%" (the
# comm-wait of worker 0 over the whole run); KIND none|async|sync
measure() {
    _kind=$1 _model=$2 _data=$3 _steps=$4 _w=$5
    if [ "$_kind" = none ]; then
        _v=$(run_workers 1 none --model "$_model" --data "$_data" --steps "$_steps" $COMMON) ||
            return 1
    else
        start_servers 1 "$_w" "$_kind" --lr "$LR" || return 1
        _v=$(run_workers "$_w" "$_kind" --model "$_model" --data "$_data" --steps "$_steps" $COMMON)
        _rc=$?
        stop_servers
        [ "$_rc" -eq 0 ] || return 1
    fi
    _cw=$(sed -n 's/.* iter [0-9]*\/[0-9]* .*comm-wait \([0-9.]*\)%.*/\1/p' "$WORK/worker0.log" |
        tail -n 1)
    echo "$_v ${_cw:-0}"
}

fail=0
# best samples/s per configuration in R_<label>, that run's comm-wait in CW_<label>
best() { eval "echo \${R_$1:-0}"; }
cwait() { eval "echo \${CW_$1:-0}"; }
record() {
    set -- "$1" $2
    if [ -z "$2" ]; then
        fail=1
        return
    fi
    if awk -v a="$2" -v b="$(best "$1")" 'BEGIN { exit !(a > b) }'; then
        eval "R_$1=$2 CW_$1=$3"
    fi
}

echo "train_bench: MLP $MLP ($MLP_STEPS steps, $DATA), CNN ($CNN_STEPS steps, $CNN_DATA)," \
     "batch 64, --threads 1, best of $REPS (CNN $CNN_REPS)" >&2
r=0
while [ "$r" -lt "$REPS" ]; do
    record mlp_none "$(measure none $MLP "$DATA" "$MLP_STEPS" 1)"
    record mlp_async "$(measure async $MLP "$DATA" "$MLP_STEPS" 1)"
    record mlp_sync "$(measure sync $MLP "$DATA" "$MLP_STEPS" 1)"
    record mlp_async2 "$(measure async $MLP "$DATA" "$MLP_STEPS" 2)"
    record mlp_sync2 "$(measure sync $MLP "$DATA" "$MLP_STEPS" 2)"
    r=$((r + 1))
done
r=0
while [ "$r" -lt "$CNN_REPS" ]; do
    record cnn_none "$(measure none cnn "$CNN_DATA" "$CNN_STEPS" 1)"
    record cnn_async "$(measure async cnn "$CNN_DATA" "$CNN_STEPS" 1)"
    record cnn_sync "$(measure sync cnn "$CNN_DATA" "$CNN_STEPS" 1)"
    r=$((r + 1))
done

# row MODEL MODE LABEL GOAL: one line of the step-time table
goals_met=0 goals=0 missed=""
row() {
    _c=$(best "$1_none") _s=$(best "$1_$2")
    _line=$(awk -v c="$_c" -v s="$_s" -v g="$3" -v m="$1" -v mode="$2" -v cw="$(cwait "$1_$2")" 'BEGIN {
        if (c <= 0 || s <= 0) { printf "| %s | %s | - | - | - | - | - | - | no result |\n", m, mode; exit 1 }
        r = c / s
        printf "| %s | %s (1 server, 1 worker) | %.0f | %.0f | %.2f | %.2f | %.1f%% | %.3f | <= %.2f: %s |\n",
            m, mode, c, s, 64000 / c, 64000 / s, cw, r, g, (r <= g ? "met" : "**missed**")
        exit (r <= g ? 0 : 1) }')
    _ok=$?
    echo "$_line"
    goals=$((goals + 1))
    if [ "$_ok" -eq 0 ]; then
        goals_met=$((goals_met + 1))
    else
        missed="${missed:+$missed, }$1 $2 $(echo "$_line" | awk -F'|' '{ gsub(/ /, "", $9); print $9 }')x"
    fi
}

echo "| model | mode | compute-only samples/s | through servers samples/s | step ms compute-only | step ms through servers | comm-wait | ratio servers/compute | goal |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
row mlp async 1.05
row mlp sync 1.3
row cnn async 1.05
row cnn sync 1.3
# async comm-wait <= 5%: the worker never waits for a round trip
cw_met=0 cw_missed=""
for m in mlp cnn; do
    if awk -v cw="$(cwait "${m}_async")" 'BEGIN { exit !(cw <= 5) }'; then
        cw_met=$((cw_met + 1))
    else
        cw_missed="${cw_missed:+$cw_missed, }$m $(cwait "${m}_async")%"
    fi
done
echo
echo "MLP $MLP, batch 64, 1 server; samples/s per worker (compute-only: one worker alone, no server)."
echo "With W=2 the two workers and the server share this machine's $(nproc) cores (oversubscribed)."
echo "comm-wait: share of the worker's run spent blocked on communication (its last log line)."
echo
echo "| workers | mode | samples/s per worker | aggregate samples/s | per worker / compute-only | comm-wait (worker 0) |"
echo "| ---: | --- | ---: | ---: | ---: | ---: |"
c=$(best mlp_none)
for cfg in "1 none mlp_none" "1 async mlp_async" "1 sync mlp_sync" "2 async mlp_async2" "2 sync mlp_sync2"; do
    set -- $cfg
    v=$(best "$3")
    awk -v w="$1" -v m="$2" -v v="$v" -v c="$c" -v cw="$(cwait "$3")" 'BEGIN {
        printf "| %d | %s | %.0f | %.0f | %.2f | %.1f%% |\n", w, (m == "none" ? "compute-only" : m),
            v, v * w, (c > 0 ? v / c : 0), cw }'
done
echo
if [ "$fail" -ne 0 ]; then
    echo "GOAL train: some runs failed (see the messages above)"
    exit 1
fi
if [ "$cw_met" -eq 2 ]; then
    echo "GOAL comm-wait: async, 1 server x 1 worker, comm-wait <= 5% (MLP $(cwait mlp_async)%, CNN $(cwait cnn_async)%): MET (2 of 2)"
else
    echo "GOAL comm-wait: async, 1 server x 1 worker, comm-wait <= 5%: MISSED ($cw_met of 2 met; missed: $cw_missed)"
fi
if [ "$goals_met" -eq "$goals" ]; then
    echo "GOAL train: step time through servers (async <= 1.05x, sync <= 1.3x): MET ($goals_met of $goals)"
else
    echo "GOAL train: step time through servers (async <= 1.05x, sync <= 1.3x): MISSED ($goals_met of $goals met; missed: $missed)"
fi
