#!/bin/sh
# cluster_bench: training throughput on one host, as a new user would measure
# it, against PyTorch in the same run.  1 server x 2 CPU workers x 1 thread
# (ps_launch), batch 64, lr 0.1: samples/s of all workers from ps_launch's
# summary line (the sum of the workers' training-loop figures), async and
# sync, through shared memory (--shm auto, the default) and over the network
# (--shm off); beside them Debian's python3-torch (bench/torch_ref.py): one
# process with 1 thread, and DistributedDataParallel over gloo with 2
# processes x 1 thread.  Every configuration runs ROUNDS times, the
# configurations alternating; medians are reported.  Prints markdown tables
# and GOAL lines (issue "same-host data plane"):
#   MLP (784-256-128-10 and 784-1024-512-10): async >= 1.5x one PyTorch
#     process and >= 2.5x DDP; sync >= 2.0x DDP and >= 1.0x one process;
#   CNN: async >= 1.1x DDP, sync >= 1.0x DDP;
#   and MLP 784-256-128-10 sync >= 1.4x one process (issue "sync that keeps
#   the GPU busy", its CPU goal: the per-layer sync pipeline).
#
#   CLUSTER_ROUNDS (3)  CLUSTER_MLP_EPOCHS (2)  CLUSTER_CNN_STEPS (100)
#   CLUSTER_MODELS ("mlp:784-256-128-10 mlp:784-1024-512-10 cnn")
#   PS_BIN_DIR (bin)  PYTHON (/usr/bin/python3)
cd "$(dirname "$0")/.." || exit 1
BIN=${PS_BIN_DIR:-bin}
PY=${PYTHON:-/usr/bin/python3}
ROUNDS=${CLUSTER_ROUNDS:-3}
EPOCHS=${CLUSTER_MLP_EPOCHS:-2}
CNN_STEPS=${CLUSTER_CNN_STEPS:-100}
MODELS=${CLUSTER_MODELS:-"mlp:784-256-128-10 mlp:784-1024-512-10 cnn"}
DATA=/usr/share/datasets/fashion-mnist
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ps_cluster_bench.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || DATA=synthetic:60000

have_torch=1
"$PY" -c 'import torch' 2>/dev/null || have_torch=0

# ours MODEL MODE SHM: samples/s over all workers, or nothing on failure
ours() {
    if [ "$1" = cnn ]; then
        # 100 steps after a warm-up of 10: the loop's figure covers them all;
        # a small test split keeps the evaluation at the end short
        _len="--steps $((CNN_STEPS + 10)) --data synthetic:16384"
    else
        _len="--epochs $EPOCHS --data $DATA"
    fi
    "$BIN/ps_launch" --servers 1 --workers 2 --gpus none --mode "$2" --server-threads 1 -- \
        --model "$1" --batch 64 --lr 0.1 --threads 1 --log-every 1000000 --shm "$3" \
        $_len >"$WORK/launch.log" 2>&1 || { tail -n 5 "$WORK/launch.log" >&2; return 1; }
    sed -n 's/.*; \([0-9]*\) samples\/s over all workers.*/\1/p' "$WORK/launch.log" | tail -n 1
}

# torch MODEL WORLD: samples/s over all processes
torch() {
    if [ "$1" = cnn ]; then
        _steps="--steps $CNN_STEPS --warmup 10 --synthetic 16384"
    else
        _steps="--steps 400 --warmup 20"
    fi
    "$PY" bench/torch_ref.py --model "$1" --world "$2" --threads 1 --batch 64 --lr 0.1 \
        $_steps 2>"$WORK/torch.err" | sed -n 's/.*samples\/s \([0-9]*\).*/\1/p'
}

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print 0 }'; }

CONFIGS="async_auto async_off sync_auto sync_off"
echo "cluster_bench: 1 server x 2 workers x 1 thread, batch 64, lr 0.1, $ROUNDS rounds, medians;" \
     "MLP $EPOCHS epochs ($DATA), CNN $CNN_STEPS steps; torch: $([ $have_torch = 1 ] &&
     "$PY" -c 'import torch; print(torch.__version__)' || echo 'skipped: no torch')" >&2
goals=0 met=0 missed=""
goal() { # goal LABEL VALUE MIN
    goals=$((goals + 1))
    if awk -v v="$2" -v m="$3" 'BEGIN { exit !(v >= m) }'; then
        met=$((met + 1))
    else
        missed="${missed:+$missed; }$1 $2 (>= $3)"
    fi
}
for model in $MODELS; do
    for c in $CONFIGS single ddp; do eval "V_$c=''"; done
    r=0
    while [ "$r" -lt "$ROUNDS" ]; do
        for c in $CONFIGS; do
            v=$(ours "$model" "${c%_*}" "${c#*_}")
            eval "V_$c=\"\$V_$c $v\""
        done
        if [ "$have_torch" = 1 ]; then
            V_single="$V_single $(torch "$model" 1)"
            V_ddp="$V_ddp $(torch "$model" 2)"
        fi
        r=$((r + 1))
    done
    for c in $CONFIGS single ddp; do
        eval "M_$c=\$(echo \"\$V_$c\" | median)"
        eval "echo \"  $model $c: \$V_$c -> \$M_$c\"" >&2
    done
    echo
    echo "### $model"
    echo
    echo "| run | samples/s (median) | / one PyTorch process | / PyTorch DDP gloo 2x1 |"
    echo "| --- | ---: | ---: | ---: |"
    for c in $CONFIGS single ddp; do
        eval "v=\$M_$c"
        case $c in
            single) label="one PyTorch process, 1 thread" ;;
            ddp) label="PyTorch DDP gloo, 2 processes x 1 thread" ;;
            *_auto) label="ours ${c%_*}, shared memory" ;;
            *_off) label="ours ${c%_*}, --shm off (tcp)" ;;
        esac
        awk -v l="$label" -v v="$v" -v s="$M_single" -v d="$M_ddp" 'BEGIN {
            printf "| %s | %.0f | %s | %s |\n", l, v, (s > 0 ? sprintf("%.2f", v / s) : "-"),
                (d > 0 ? sprintf("%.2f", v / d) : "-") }'
    done
    if [ "$have_torch" = 1 ]; then
        ra_s=$(awk -v a="$M_async_auto" -v b="$M_single" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
        ra_d=$(awk -v a="$M_async_auto" -v b="$M_ddp" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
        rs_s=$(awk -v a="$M_sync_auto" -v b="$M_single" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
        rs_d=$(awk -v a="$M_sync_auto" -v b="$M_ddp" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
        if [ "$model" = cnn ]; then
            goal "cnn async/ddp" "$ra_d" 1.1
            goal "cnn sync/ddp" "$rs_d" 1.0
        else
            goal "$model async/single" "$ra_s" 1.5
            goal "$model async/ddp" "$ra_d" 2.5
            goal "$model sync/ddp" "$rs_d" 2.0
            goal "$model sync/single" "$rs_s" 1.0
            [ "$model" = mlp:784-256-128-10 ] && goal "$model sync/single (pipeline)" "$rs_s" 1.4
        fi
    fi
done
echo
if [ "$have_torch" != 1 ]; then
    echo "GOAL cluster: skipped: no torch (Debian: apt-get install python3-torch)"
elif [ "$met" -eq "$goals" ]; then
    echo "GOAL cluster: ours vs PyTorch on one host (MLP async >= 1.5x single and >= 2.5x DDP, sync >= 2.0x DDP and >= 1.0x single, 784-256-128-10 sync >= 1.4x single; CNN async >= 1.1x DDP, sync >= 1.0x DDP): MET ($met of $goals)"
else
    echo "GOAL cluster: ours vs PyTorch on one host: MISSED ($met of $goals met; missed: $missed)"
fi
