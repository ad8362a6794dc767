#!/bin/sh
# PyTorch's DLRM with its tables on the servers (bench/run.sh part "dlrm"):
# examples/torch_dlrm.py through ps.torch (1 ps_server x 2 workers, async
# and sync) against the same script as one PyTorch process and as
# DistributedDataParallel over gloo with 2 ranks: the same data, model,
# initialisation and seed; rounds alternating, medians of samples/s; every
# process's peak RSS; then the id space grown to 1e9 per table through the
# servers alone.  Markdown on stdout, GOAL lines in bench/run.sh's format,
# progress on stderr.
#
#   DLRM_ROUNDS=3         rounds of the comparison
#   DLRM_ROWS=4000000     rows per table (DDP then holds 4.2 GB per rank)
#   DLRM_STEPS=300        steps per worker (one process: 2 x that many, the
#                         same samples)
#   DLRM_SCALE="1000000000"  id spaces of the servers-only rows
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
bench_init
ROUNDS=${DLRM_ROUNDS:-3}
ROWS=${DLRM_ROWS:-4000000}
STEPS=${DLRM_STEPS:-300}
SCALE=${DLRM_SCALE:-"1000000000"}
PY=/usr/bin/python3
if ! $PY -c 'import torch' 2>/dev/null; then
    echo "SKIP dlrm: skipped: $PY cannot import torch (python3-torch)"
    exit 0
fi
ARGS="--tables 8 --dim 16 --batch 128 --threads 1 --zipf 1.05 --seed 1"
load() { cut -d' ' -f1-3 /proc/loadavg; }
say() { echo "dlrm_bench: $*" >&2; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# the script's lines: TAG.sps (all processes' samples/s together), TAG.auc
# (rank 0's), TAG.rss (each process's peak RSS MB, rank order)
collect() {
    _tag=$1
    grep 'torch_dlrm: backend' "$WORK/$_tag.log" | sed 's/^\[worker [0-9]*\] //' | sort -k5n \
        >"$WORK/$_tag.lines"
    if [ ! -s "$WORK/$_tag.lines" ]; then
        say "$_tag failed; its log ends:"
        tail -n 5 "$WORK/$_tag.log" >&2
        return 1
    fi
    awk '{ for (i = 1; i < NF; i++) if ($i == "samples/s") s += $(i + 1) } END { printf "%.0f\n", s }' \
        "$WORK/$_tag.lines" >"$WORK/$_tag.sps"
    head -n 1 "$WORK/$_tag.lines" | sed 's/.*test auc \([0-9.]*\).*/\1/' >"$WORK/$_tag.auc"
    sed 's/.*peak rss MB //' "$WORK/$_tag.lines" | tr '\n' ' ' >"$WORK/$_tag.rss"
}

# ps_run MODE TAG ROWS: one server, 2 workers; TAG.srv: the server's peak RSS MB
ps_run() {
    _m=$1 _tag=$2 _rows=$3
    start_servers 1 2 "$_m" --threads 1 --optimizer sgd --lr 0.1 || return 1
    _pids=""
    for _r in 0 1; do
        PS_SERVERS=$PS_SERVERS PS_RANK=$_r PS_NUM_WORKERS=2 PS_MODE=$_m $BENCH_LIMIT \
            $PY examples/torch_dlrm.py --backend ps --rows "$_rows" --steps "$STEPS" $ARGS \
            >"$WORK/$_tag.w$_r.log" 2>&1 &
        _pids="$_pids $!"
    done
    for p in $_pids; do wait "$p"; done
    _p=${SERVER_PIDS# }
    awk '/^VmHWM/ { printf "%.0f\n", $2 / 1024 }' "/proc/$_p/status" >"$WORK/$_tag.srv" 2>/dev/null
    stop_servers
    cat "$WORK/$_tag.w0.log" "$WORK/$_tag.w1.log" >"$WORK/$_tag.log"
    collect "$_tag"
}

torch_run() {
    _tag=$2
    if [ "$1" = ddp ]; then
        $BENCH_LIMIT $PY examples/torch_dlrm.py --backend ddp --world 2 --rows "$ROWS" \
            --steps "$STEPS" $ARGS >"$WORK/$_tag.log" 2>&1
    else
        $BENCH_LIMIT $PY examples/torch_dlrm.py --backend none --rows "$ROWS" \
            --steps $((2 * STEPS)) $ARGS >"$WORK/$_tag.log" 2>&1
    fi
    collect "$_tag"
}

echo "### PyTorch's DLRM: tables on the servers against DDP"
echo
echo "\`examples/torch_dlrm.py\`: bottom MLP 13-64-16, 8 \`nn.EmbeddingBag\` tables of"
echo "$ROWS ids x 16 (sum), pairwise dot interaction, top MLP 52-64-1; synthetic-ctr"
echo "(Zipf 1.05, one field per table), batch 128 per process, one thread each, SGD lr"
echo "0.1 on the dense layers, Adagrad lr 0.05 on the tables.  ps.torch: 1 \`ps_server\`"
echo "(1 update thread) x 2 workers, the tables made on the meta device and held by the"
echo "server, the next batch's rows prefetched.  PyTorch: DDP over gloo with 2 ranks"
echo "(\`sparse=True\`), and one process on the same samples ($((2 * STEPS)) steps)."
echo "$STEPS steps per worker, $ROUNDS rounds alternating, medians of samples/s (all"
echo "processes together); test AUC (10000 held-out samples) and peak RSS of the last round."
echo "Load before: $(load)."
echo
i=1
while [ "$i" -le "$ROUNDS" ]; do
    say "round $i of $ROUNDS"
    ps_run async "a$i" "$ROWS" || exit 1
    ps_run sync "s$i" "$ROWS" || exit 1
    torch_run ddp "d$i" || exit 1
    torch_run none "t$i" || exit 1
    i=$((i + 1))
done
med() { for k in $(seq 1 "$ROUNDS"); do cat "$WORK/$1$k.sps"; done | median; }
A=$(med a) S=$(med s) D=$(med d) T=$(med t)
echo "| run | samples/s (median) | x DDP | test AUC | peak RSS MB (server; workers) |"
echo "|---|---:|---:|---:|---|"
row() {
    _srv=$( [ -s "$WORK/$2$ROUNDS.srv" ] && echo "$(cat "$WORK/$2$ROUNDS.srv"); " )
    echo "$1 $3 $D $(cat "$WORK/$2$ROUNDS.auc") $_srv$(cat "$WORK/$2$ROUNDS.rss")" |
        awk '{ name = $1; gsub(/_/, " ", name); rss = ""; for (i = 5; i <= NF; i++) rss = rss " " $i
               printf "| %s | %.0f | %.2f | %s |%s |\n", name, $2, $2 / $3, $4, rss }'
}
row "ps.torch_async_1x2" a "$A"
row "ps.torch_sync_1x2" s "$S"
row "DDP_gloo_2_ranks" d "$D"
row "one_process" t "$T"
echo
for s in $SCALE; do
    say "id space $s"
    ps_run async "big$s" "$s" || exit 1
    echo "Id space $s per table (8 x $s x 16 floats: $(echo "$s" | awk '{ printf "%.0f", $1 * 8 * 16 * 4 / 2^30 }') GiB as dense tables), async through"
    echo "the server: $(cat "$WORK/big$s.sps") samples/s, test AUC $(cat "$WORK/big$s.auc"), peak RSS MB: server"
    echo "$(cat "$WORK/big$s.srv"), workers $(cat "$WORK/big$s.rss")(the server holds the rows touched only)."
    echo
done
AW=$(cat "$WORK/a$ROUNDS.rss" | tr ' ' '\n' | sort -g | tail -n 1)
echo "$A $D $T $S" | awk '{
    printf "GOAL DLRM async >= 2.5x PyTorch DDP gloo (%.2fx): %s\n", $1 / $2, ($1 >= 2.5 * $2) ? "met" : "MISSED"
    printf "GOAL DLRM async >= 1.2x one PyTorch process (%.2fx): %s\n", $1 / $3, ($1 >= 1.2 * $3) ? "met" : "MISSED"
    printf "GOAL DLRM sync >= 1.5x PyTorch DDP gloo (%.2fx): %s\n", $4 / $2, ($4 >= 1.5 * $2) ? "met" : "MISSED" }'
echo "$AW" | awk '{ printf "GOAL DLRM worker peak RSS <= 400 MB (%s MB): %s\n", $1, ($1 <= 400) ? "met" : "MISSED" }'
echo "$(cat "$WORK/a$ROUNDS.auc") $(cat "$WORK/t$ROUNDS.auc")" | awk '{ e = $1 - $2; if (e < 0) e = -e
    printf "GOAL DLRM async test AUC within 0.005 of one PyTorch process after the same samples (%.4f vs %.4f): %s\n", $1, $2, (e <= 0.005) ? "met" : "MISSED" }'
