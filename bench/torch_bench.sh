#!/bin/sh
# torch_bench: ps_worker's CNN in PyTorch on Fashion-MNIST
# (examples/torch_fashion_mnist.py, torch.set_num_threads(1), batch 64 per
# worker), the same loop three ways in the same run:
#   ps.torch through 1 ps_server, 2 workers, async and sync, with the update
#   on the server (its optimizer) and on the workers (the server averages in
#   sync mode, adds the workers' deltas in async; each worker steps
#   torch.optim.SGD);
#   PyTorch DistributedDataParallel, gloo on 127.0.0.1, 2 processes;
#   ps.torch with 1 worker and 1 server (async) against the loop alone
#   (--backend none: the torch optimizer steps locally) for the wrapper's cost.
# Every configuration runs REPS times, the configurations alternating; the
# tables give medians of the workers' samples/s (summary lines, warm-up
# steps left out), and each ratio is the median over the repetitions of the
# ratio between runs of the same repetition (next to each other in time:
# the machine may be shared and its load drifts).  Prints markdown and GOAL lines; with a missed goal, a
# perf profile of one ps.torch async run (where the CPU goes, by process and
# library).  BENCH_ACCURACY=1 also trains 3 epochs of each 2-worker variant
# and compares test accuracy (long: about 10 minutes here), written to
# TORCH_ACCURACY_OUT (default: stdout).
#
#   TORCH_STEPS (60)  TORCH_WARMUP (10)  TORCH_REPS (4)  TORCH_PROFILE (1)
#   TORCH_ASYNC_OPT: the async accuracy run's optimizer flags (default
#   adam, lr 0.0005: momentum 0.9 with lr 0.05 diverges on stale gradients)
#   PS_BIN_DIR (bin)  TORCH_DATA (/usr/share/datasets/fashion-mnist)
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
PY=/usr/bin/python3
EX=examples/torch_fashion_mnist.py
STEPS=${TORCH_STEPS:-60}
WARMUP=${TORCH_WARMUP:-10}
REPS=${TORCH_REPS:-4}
DATA=${TORCH_DATA:-/usr/share/datasets/fashion-mnist}
OPT="--optimizer momentum --lr 0.05 --momentum 0.9"
ASYNC_OPT=${TORCH_ASYNC_OPT:-"--optimizer adam --lr 0.0005"}

if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "torch_bench: skipped: no torch ($PY cannot import torch; make deps installs python3-torch)" >&2
    echo "(skipped: no torch)"
    echo
    echo "GOAL torch: skipped: no torch"
    exit 0
fi
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -f "$DATA/train-images-idx3-ubyte" ]; then
    echo "(skipped: no Fashion-MNIST in $DATA)"
    echo
    echo "GOAL torch: skipped: no Fashion-MNIST in $DATA"
    exit 0
fi
bench_init
export PS_LIBRARY="$(pwd -P)/lib/libps.so"
unset PS_SERVERS PS_RANK PS_NUM_WORKERS PS_MODE

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_py W KIND [args...]: W example processes (KIND ps|ddp|none), waited
# for; prints the mean of their samples/s, or nothing when one failed
run_py() {
    _w=$1 _kind=$2
    shift 2
    WORKER_PIDS="" _r=0
    _port=$(free_port)
    while [ "$_r" -lt "$_w" ]; do
        "$PY" "$EX" --backend "$_kind" --rank "$_r" --num-workers "$_w" \
            --ddp-port "$_port" --data "$DATA" --threads 1 --batch 64 $OPT "$@" \
            >"$WORK/py$_r.log" 2>&1 &
        WORKER_PIDS="$WORKER_PIDS $!"
        _r=$((_r + 1))
    done
    wait_summaries "$_w" py "$_kind $*"
}

# cpu_of W: the workers' mean training-thread CPU ms per step of the last run
cpu_of() {
    cat "$WORK"/py*.log 2>/dev/null |
        sed -n 's/.*training thread \([0-9.]*\) ms CPU per step.*/\1/p' |
        awk -v w="$1" '{ s += $1; n++ } END { if (n == w) printf "%.1f\n", s / n; else print "x" }'
}

# one configuration: samples/s per worker (mean over the workers of a run)
measure() {
    rm -f "$WORK"/py*.log
    case $1 in
    ps_async | ps_sync | ps1 | psw_async | psw_sync | psb_async | psb_sync)
        _mode=${1#ps*_} _bw=""
        case $1 in psb_*) _bw=--push-in-backward ;; esac
        _w=2 _sopt=$OPT
        [ "$1" = ps1 ] && _mode=async _w=1
        [ "$1" = psw_sync ] && _sopt="--optimizer average"
        [ "$1" = psw_async ] && _sopt="--optimizer add"
        start_servers 1 "$_w" "$_mode" $_sopt || return 1
        _v=$(run_py "$_w" ps --servers "$PS_SERVERS" --mode "$_mode" --steps "$STEPS" \
            --warmup "$WARMUP" --test-samples 1 --log-every 1000000 $_bw)
        stop_servers
        ;;
    ddp) _w=2 _v=$(run_py 2 ddp --steps "$STEPS" --warmup "$WARMUP" --test-samples 1 --log-every 1000000) ;;
    none) _w=1 _v=$(run_py 1 none --steps "$STEPS" --warmup "$WARMUP" --test-samples 1 --log-every 1000000) ;;
    esac
    [ -n "$_v" ] && echo "$_v $(cpu_of "$_w")"
}

CONFIGS="ddp ps_async ps_sync psw_async psw_sync psb_async psb_sync none ps1"
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
echo "torch_bench: $STEPS steps ($WARMUP warm-up) x $REPS, alternating; $(machine_line)" >&2
r=0
while [ "$r" -lt "$REPS" ]; do
    for c in $CONFIGS; do
        set -- $(measure "$c")
        echo "torch_bench: rep $r $c: ${1:-failed} samples/s, ${2:-?} ms CPU per step" >&2
        eval "V_$c=\"\${V_$c:-} ${1:-x}\" C_$c=\"\${C_$c:-} ${2:-x}\""
    done
    r=$((r + 1))
done

# median of a configuration's runs ("x" = failed); C_: its CPU ms per step
median() {
    eval "echo \$${2:-V}_$1" | tr ' ' '\n' | grep -v '^$' | awk '
        $1 == "x" { bad = 1 } $1 != "x" { v[n++] = $1 }
        END { if (bad || n == 0) { print "0"; exit }
              for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
              print (n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2) }'
}
runs() { eval "echo \$V_$1" | sed 's/^ //; s/ /, /g'; }
# paired CONFIG BASELINE: the median over the repetitions of CONFIG's run
# divided by BASELINE's run of the same repetition (0 when one failed)
paired() {
    { eval "echo \$V_$1"; eval "echo \$V_$2"; } | awk '
        NR == 1 { n = split($0, a) } NR == 2 { split($0, b) }
        END { for (i = 1; i <= n; i++) { if (a[i] == "x" || b[i] == "x" || b[i] <= 0) { print 0; exit }
                                         r[i] = a[i] / b[i] }
              for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
              print (n % 2 ? r[int(n / 2) + 1] : (r[n / 2] + r[n / 2 + 1]) / 2) }'
}

ddp=$(median ddp)
none=$(median none)
goals=0 met=0 missed=""
row() { # label config baseline-config baseline-name goal
    _line=$(awk -v l="$1" -v m="$(median "$2")" -v r="$(paired "$2" "$3")" -v bn="$4" -v g="$5" \
        -v runs="$(runs "$2")" -v cpu="$(median "$2" C)" 'BEGIN {
        if (m <= 0 || r <= 0) { printf "| %s | - | - | - | - | >= %.1fx %s: **no result** |", l, g, bn; exit 1 }
        printf "| %s | %.0f | %s | %.1f | %.2f | >= %.1fx %s: %s |", l, m, runs, cpu, r, g, bn, (r >= g ? "met" : "**missed**")
        exit (r >= g ? 0 : 1) }')
    _ok=$?
    echo "$_line"
    goals=$((goals + 1))
    if [ "$_ok" -eq 0 ]; then met=$((met + 1)); else missed="${missed:+$missed, }$1"; fi
}
# info label config baseline-config baseline-name: a row with its ratio and no goal
info() {
    awk -v l="$1" -v m="$(median "$2")" -v r="$(paired "$2" "$3")" -v bn="$4" \
        -v runs="$(runs "$2")" -v cpu="$(median "$2" C)" 'BEGIN {
        if (m <= 0 || r <= 0) { printf "| %s | - | - | - | - | against %s: **no result** |\n", l, bn; exit }
        printf "| %s | %.0f | %s | %.1f | %.2f | against %s (no goal) |\n", l, m, runs, cpu, r, bn }'
}
echo "| configuration | samples/s per worker (median) | runs | training thread CPU ms/step | ratio (paired, median) | goal |"
echo "| --- | ---: | --- | ---: | ---: | --- |"
echo "| PyTorch DDP gloo, 2 processes x 1 thread | $(printf '%.0f' "$ddp") | $(runs ddp) | $(median ddp C) | 1.00 | baseline |"
row "ps.torch async, 1 server x 2 workers" ps_async ddp DDP 1.3
row "ps.torch sync, 1 server x 2 workers" ps_sync ddp DDP 1.0
row "ps.torch async, the update on the workers" psw_async ps_async "on the server" 0.9
row "ps.torch sync, the update on the workers" psw_sync ps_sync "on the server" 0.9
info "ps.torch async, gradients pushed during backward (grad_edits=False)" psb_async ps_async "pushed at step()"
info "ps.torch sync, gradients pushed during backward (grad_edits=False)" psb_sync ps_sync "pushed at step()"
echo "| PyTorch alone (--backend none), 1 process x 1 thread | $(printf '%.0f' "$none") | $(runs none) | $(median none C) | 1.00 | baseline |"
row "ps.torch async, 1 server x 1 worker" ps1 none "the loop alone" 0.9
echo
echo "Batch 64 per worker, $STEPS steps of which $WARMUP warm-up, $REPS runs each, alternating"
echo "(runs listed in order; a ratio is the median of the ratios of runs of the same repetition);"
echo "optimizer momentum 0.9, lr 0.05 (on the servers for ps.torch, torch.optim.SGD otherwise;"
echo "\"the update on the workers\": the server runs --optimizer add (async) or average (sync)"
echo "and every worker steps torch.optim.SGD).  \"Pushed during backward\": --push-in-backward,"
echo "DistributedOptimizer(grad_edits=False), each gradient leaves as autograd produces it;"
echo "the default pushes .grad at step() (safe with edits, accumulation and late clipping)."
echo "Training thread CPU ms/step: time.thread_time() of each worker's training thread over the"
echo "timed steps (median of the runs): against the wall time per step (64000 / samples/s) it"
echo "tells how long that thread waited, for the servers or for a core.  Load average (1 min)"
echo "of this machine at the start and the end: $LOAD0 / $(cut -d' ' -f1 /proc/loadavg)."
# the ceiling of the 2-worker ratios: a worker that shares the cores with
# another and a server does not step faster than the loop alone on a core
# of its own, so async can reach at most alone / DDP of DDP
ceil=$(paired none ddp)
echo
printf "Ceiling: the loop alone runs at %.2fx a DDP rank (paired, median).  Two async workers\n" "$ceil"
echo "and a server on $(nproc) cores cannot each step faster than one process alone on a core of"
echo "its own, so no ratio of async to DDP above that is reachable on this machine: ps.torch"
echo "async reaches $(awk -v a="$(median ps_async)" -v n="$none" 'BEGIN { printf "%.2f", (n > 0 ? a / n : 0) }') of the loop alone per worker."


# where the time goes, when a goal was missed: one ps.torch async run under perf
if [ "$met" -lt "$goals" ] && [ "${TORCH_PROFILE:-1}" = 1 ]; then
    echo
    sh bench/profile_torch.sh
fi
echo
if [ "$met" -eq "$goals" ]; then
    echo "GOAL torch: ps.torch async >= 1.3x DDP, sync >= 1.0x DDP, the update on the workers >= 0.9x on the server, 1 worker >= 0.9x alone: MET ($met of $goals)"
else
    echo "GOAL torch: ps.torch async >= 1.3x DDP, sync >= 1.0x DDP, the update on the workers >= 0.9x on the server, 1 worker >= 0.9x alone: MISSED ($met of $goals met; missed: $missed)"
fi

# ---- accuracy after 3 epochs (BENCH_ACCURACY=1): ps.torch async and sync against DDP
if [ "${BENCH_ACCURACY:-0}" = 1 ]; then
    acc_of() { sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p' "$WORK/py0.log" | tail -n 1; }
    sync_opt=$OPT
    OPT=$ASYNC_OPT
    start_servers 1 2 async $OPT &&
        run_py 2 ps --servers "$PS_SERVERS" --mode async --epochs 3 --log-every 1000000 >/dev/null
    a_async=$(acc_of); stop_servers
    OPT=$sync_opt
    start_servers 1 2 sync $OPT &&
        run_py 2 ps --servers "$PS_SERVERS" --mode sync --epochs 3 --log-every 1000000 >/dev/null
    a_sync=$(acc_of); stop_servers
    run_py 2 ddp --epochs 3 --log-every 1000000 >/dev/null
    a_ddp=$(acc_of)
    {
    echo "| 3 epochs, 2 workers x batch 64 | optimizer | test accuracy | against DDP | goal |"
    echo "| --- | --- | ---: | ---: | --- |"
    echo "| PyTorch DDP gloo | $OPT | ${a_ddp:-failed} | - | baseline |"
    for v in "async ${a_async:-0}" "sync ${a_sync:-0}"; do
        set -- $v
        o=$OPT
        [ "$1" = async ] && o=$ASYNC_OPT
        awk -v m="$1" -v a="$2" -v d="${a_ddp:-0}" -v o="$o" 'BEGIN {
            printf "| ps.torch %s | %s | %.4f | %+.4f | within 0.005 of DDP or better: %s |\n", m, o, a,
                a - d, (a > 0 && d > 0 && a >= d - 0.005 ? "met" : "**missed**") }'
    done
    echo
    awk -v a="${a_async:-0}" -v s="${a_sync:-0}" -v d="${a_ddp:-0}" 'BEGIN {
        ok = a > 0 && s > 0 && d > 0 && a >= d - 0.005 && s >= d - 0.005
        printf "GOAL torch accuracy: 3 epochs within 0.5 point of DDP (%.4f): %s (async %.4f, sync %.4f)\n",
            d, ok ? "MET" : "MISSED", a, s }'
    } >"${TORCH_ACCURACY_OUT:-/dev/stdout}"
fi
