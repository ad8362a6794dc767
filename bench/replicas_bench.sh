#!/bin/sh
# replicas_bench: replicas and failover (docs/DESIGN.md "Replicas and
# failover"), with real etcds.
#  1. build/bench/repl_bench: the failover pause over REPL_KILLS (10) kills,
#     acknowledged updates lost over REPL_LOSS_KILLS (20) kills (async and
#     sync, a table and a dense key), and the catch-up of a replacement on a
#     table of REPL_ROWS (4e6) rows while 2 workers train (its header says
#     how).
#  2. What replication costs: ps_launch --servers 2 --workers 2 with
#     --replicas 1 (--coord auto: its own etcd) against --replicas 0, for the
#     MLP (mlp:784-256-128-10) and ps_worker's DLRM (ctr:interact=dot), in
#     async and in sync mode; REPL_PAIRS (3) pairs alternating, samples/s
#     from ps_launch's closing line (all workers), the ratio per pair, the
#     median set against the goal (>= 0.8).
#   REPL_PAIRS (3)  REPL_STEPS (3000)  REPL_KILLS  REPL_LOSS_KILLS  REPL_ROWS
#   REPL_ONLY="failover overhead"  PS_BIN_DIR (bin)
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
bench_init
PAIRS=${REPL_PAIRS:-3}
STEPS=${REPL_STEPS:-3000}
ONLY=${REPL_ONLY:-"failover overhead"}
BUILD=${BUILD:-build}
rc=0

case " $ONLY " in *" failover "*)
    PS_BIN_DIR=$BIN "$BUILD/bench/repl_bench" --kills "${REPL_KILLS:-10}" \
        --loss-kills "${REPL_LOSS_KILLS:-20}" --rows "${REPL_ROWS:-4000000}" 2>"$WORK/repl.err" || {
        rc=1
        tail -n 20 "$WORK/repl.err" >&2
    }
    echo
    ;;
esac

MLP="--model mlp:784-256-128-10 --data synthetic:4096 --batch 64 --epochs 100000 --steps $STEPS"
DLRM="--model ctr:fields=8,rows=100000,dim=16,interact=dot,bot=64-16,mlp=64-1 --data synthetic-ctr:100000 --batch 128 --epochs 100000 --steps $STEPS"

# one MODE REPLICAS WORKER-FLAGS: samples/s over all workers (nothing when it failed)
one() {
    _mode=$1 _r=$2
    shift 2
    _extra=""
    [ "$_r" -gt 0 ] && _extra="--replicas $_r --coord auto"
    # shellcheck disable=SC2086
    $BENCH_LIMIT "$BIN/ps_launch" --servers 2 --workers 2 --gpus none --mode "$_mode" \
        --metrics-port off $_extra -- $* --log-every 100000 >"$WORK/launch.out" 2>"$WORK/launch.err" ||
        return 0
    sed -n 's/.*; \([0-9.]*\) samples\/s over all workers.*/\1/p' "$WORK/launch.err" | tail -n 1
}

case " $ONLY " in *" overhead "*)
    echo "## What replication costs (ps_launch --servers 2 --workers 2, one host)"
    echo
    echo "| model | mode | --replicas 0 samples/s | --replicas 1 samples/s | ratio (median of $PAIRS pairs) |"
    echo "|---|---|---:|---:|---:|"
    ok=1
    for model in MLP DLRM; do
        eval "flags=\$$model"
        for mode in async sync; do
            ratios="" a="" b=""
            p=0
            while [ $p -lt "$PAIRS" ]; do
                # shellcheck disable=SC2086
                x=$(one $mode 0 $flags)
                # shellcheck disable=SC2086
                y=$(one $mode 1 $flags)
                if [ -n "$x" ] && [ -n "$y" ]; then
                    ratios="$ratios $(awk "BEGIN{printf \"%.3f\", $y / $x}")"
                    a="$a $x" b="$b $y"
                fi
                p=$((p + 1))
            done
            med() { echo "$1" | tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]}'; }
            r=$(med "$ratios")
            echo "| $model | $mode | $(med "$a") | $(med "$b") | ${r:-failed} |"
            if [ -z "$r" ] || awk "BEGIN{exit !($r < 0.8)}"; then ok=0; fi
        done
    done
    echo
    echo "Every member applies every update: here the replicas' work shares the host's"
    echo "$(nproc) cores with the primaries and the workers, where a deployment gives it other hosts."
    echo
    [ $ok = 1 ] && v=MET || v=MISSED
    echo "GOAL replication overhead: samples/s with --replicas 1 >= 0.8x --replicas 0, async and sync, MLP and DLRM: $v"
    ;;
esac
exit $rc
