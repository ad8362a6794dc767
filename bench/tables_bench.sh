#!/bin/sh
# Embedding tables (bench/run.sh part "tables"): the store alone
# (build/bench/table_bench), rows through one server (build/bench/sparse_bench),
# ps_worker's click-through model through the servers against PyTorch on
# the same data, and the id space grown from 1e5 to 1e9.  Markdown on
# stdout, GOAL lines in bench/run.sh's format; progress on stderr.
#
#   TABLES_ROUNDS=3        rounds of the CTR comparison (alternating, medians)
#   TABLES_SAMPLES=200000  synthetic-ctr:N, one epoch, every run
#   TABLES_SCALE="100000 1000000 10000000 100000000 1000000000"  id spaces
#   TABLES_SKIP_TORCH=1    leave the PyTorch rows out (they take minutes)
#
# The CTR model, the same in ps_worker and bench/torch_ctr_ref.py:
# ctr:fields=8,rows=4000000,dim=16 (8 tables of 4e6 ids x 16, Zipf 1.05;
# the spec's top MLP 512-256-1 on the 13 dense features and the 8 rows side
# by side; adagrad lr 0.05 on the tables, sgd lr 0.05 on the dense layers),
# batch 128 per process, one thread each.
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
bench_init
BUILD=${BUILD:-build}
ROUNDS=${TABLES_ROUNDS:-3}
N=${TABLES_SAMPLES:-200000}
SCALE=${TABLES_SCALE:-"100000 1000000 10000000 100000000 1000000000"}
ROWS=4000000
SPEC="ctr:fields=8,rows=$ROWS,dim=16"
DATA="synthetic-ctr:$N"
PY=/usr/bin/python3
TORCH=1
if [ "${TABLES_SKIP_TORCH:-0}" = 1 ] || ! $PY -c 'import torch' 2>/dev/null; then TORCH=0; fi
for b in table_bench sparse_bench; do
    if [ ! -x "$BUILD/bench/$b" ]; then
        echo "$0: $BUILD/bench/$b is missing; run make bench" >&2
        exit 1
    fi
done
load() { cut -d' ' -f1-3 /proc/loadavg; }
say() { echo "tables_bench: $*" >&2; }

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# peak RSS in MB of a running process (VmHWM), before it is stopped; under
# BENCH_TIMEOUT the pid is timeout's, and the server its child
hwm_mb() {
    _p=$1
    if [ "$(cat "/proc/$_p/comm" 2>/dev/null)" = timeout ]; then
        _p=$(cat "/proc/$_p/task/$_p/children" 2>/dev/null)
        _p=${_p%% *}
    fi
    awk '/^VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$_p/status" 2>/dev/null
}

# ps_run MODE TAG SPEC: one ps_server (1 update thread) and 2 ps_workers
# (1 thread each) through it, one epoch of $DATA; writes TAG.sps (samples/s of
# both workers together), TAG.auc (rank 0's test AUC), TAG.rss (peak RSS MB:
# server, worker 0, worker 1), TAG.srv (the server's closing table line).
ps_run() {
    _m=$1 _tag=$2 _spec=$3
    start_servers 1 2 "$_m" --threads 1 --optimizer sgd --lr 0.05 || return 1
    WORKER_PIDS=""
    for _r in 0 1; do
        $BENCH_LIMIT /usr/bin/time -f %M -o "$WORK/$_tag.w$_r.kb" "$BIN/ps_worker" \
            --servers "$PS_SERVERS" --rank $_r --num-workers 2 --mode "$_m" --model "$_spec" \
            --data "$DATA" --batch 128 --threads 1 --log-every 100000 \
            >"$WORK/$_tag.w$_r.log" 2>&1 &
        WORKER_PIDS="$WORKER_PIDS $!"
    done
    _bad=0
    for p in $WORKER_PIDS; do wait "$p" || _bad=1; done
    WORKER_PIDS=""
    _srss=$(hwm_mb $SERVER_PIDS)
    stop_servers
    _s0=$(summary_sps "$WORK/$_tag.w0.log") _s1=$(summary_sps "$WORK/$_tag.w1.log")
    if [ "$_bad" = 1 ] || [ -z "$_s0" ] || [ -z "$_s1" ]; then
        say "$_tag failed; worker 0's log ends:"
        tail -n 5 "$WORK/$_tag.w0.log" >&2
        return 1
    fi
    echo "$_s0 $_s1" | awk '{ printf "%.0f\n", $1 + $2 }' >"$WORK/$_tag.sps"
    sed -n 's/.*summary:.*test auc \([0-9.]*\).*/\1/p' "$WORK/$_tag.w0.log" >"$WORK/$_tag.auc"
    echo "$_srss $(awk '{ printf "%.0f", $1 / 1024 }' "$WORK/$_tag.w0.kb") $(awk '{ printf "%.0f", $1 / 1024 }' "$WORK/$_tag.w1.kb")" \
        >"$WORK/$_tag.rss"
    sed -n 's/.*stopped:.*, \([0-9]* tables: [0-9]* rows ([0-9]* MiB)\).*/\1/p' "$WORK/server0.log" \
        >"$WORK/$_tag.srv"
}

# torch_run BACKEND TAG: bench/torch_ctr_ref.py, the same model and data;
# TAG.sps, TAG.auc, TAG.rss (every process's peak RSS MB)
torch_run() {
    _tag=$2
    $BENCH_LIMIT $PY bench/torch_ctr_ref.py --backend "$1" --world 2 --model "$SPEC" \
        --data "$DATA" --batch 128 --threads 1 --log-every 100000 >"$WORK/$_tag.log" 2>&1
    _line=$(grep '^torch_ctr_ref:' "$WORK/$_tag.log")
    if [ -z "$_line" ]; then
        say "$_tag failed; its log ends:"
        tail -n 5 "$WORK/$_tag.log" >&2
        return 1
    fi
    echo "$_line" | sed 's/.*samples\/s \([0-9.]*\).*/\1/' >"$WORK/$_tag.sps"
    echo "$_line" | sed 's/.*test auc \([0-9.]*\).*/\1/' >"$WORK/$_tag.auc"
    echo "$_line" | sed 's/.*peak rss MB //' >"$WORK/$_tag.rss"
}

echo "### The store alone"
echo
echo "\`build/bench/table_bench\`: \`server/table.h\` in this process, 4096 distinct ids a"
echo "call (Zipf 1.05 over 2^20 ids), against copies of the same rows from a dense array;"
echo "rows per second of the thread's CPU time, best of 5 rounds.  Load before: $(load)."
echo
say "the store alone"
"$BUILD/bench/table_bench" --rounds 5 2>/dev/null || exit 1
echo
echo "### Through one server"
echo
echo "\`build/bench/sparse_bench\` (its header says how): one \`ps_server\` (one update"
echo "thread) on tcp 127.0.0.1 and one libps client, 4096 distinct ids a request, 8"
echo "requests in flight, against a gather/scatter of the same rows in this process;"
echo "wall-clock rows/s, medians of 5 rounds alternating; rows per second of the"
echo "server's CPU beside them.  Then a table of 4 million rows: the server's memory"
echo "per row, its checkpoint written at stop and restored.  Load before: $(load)."
echo
say "through one server"
"$BUILD/bench/sparse_bench" 2>/dev/null || exit 1

echo
echo "### ps_worker's click-through model against PyTorch"
echo
echo "Model \`$SPEC\` (8 tables of 4e6 ids x 16, Zipf 1.05, the spec's top MLP"
echo "512-256-1, adagrad lr 0.05 on the tables, sgd lr 0.05 on the dense layers), one"
echo "epoch of \`$DATA\`, batch 128 per process, one thread each.  ps_worker: 1"
echo "\`ps_server\` (1 update thread) x 2 workers, the tables on the server.  PyTorch"
echo "(\`bench/torch_ctr_ref.py\`, the same model and data, nn.EmbeddingBag(sparse=True),"
echo "torch.optim.Adagrad on the tables): one process, and DistributedDataParallel over"
echo "gloo with 2 processes.  $ROUNDS rounds, the four alternating; medians of samples/s"
echo "(all processes together, training time); test AUC and peak RSS of the last round."
echo "Load before: $(load)."
echo
i=1
while [ "$i" -le "$ROUNDS" ]; do
    say "CTR round $i of $ROUNDS"
    ps_run async "async.$i" "$SPEC" || exit 1
    ps_run sync "sync.$i" "$SPEC" || exit 1
    if [ "$TORCH" = 1 ]; then
        torch_run single "single.$i" || exit 1
        torch_run ddp "ddp.$i" || exit 1
    fi
    i=$((i + 1))
done
med() { cat "$WORK"/"$1".*.sps | median; }
last() { cat "$WORK/$1.$ROUNDS.$2"; }
A=$(med async) S=$(med sync)
echo "| run | samples/s | test AUC | peak RSS MB (each process) |"
echo "| --- | ---: | ---: | --- |"
echo "| ps_worker async, 1 server x 2 workers | $A | $(last async auc) | server, workers: $(last async rss) |"
echo "| ps_worker sync, 1 server x 2 workers | $S | $(last sync auc) | server, workers: $(last sync rss) |"
if [ "$TORCH" = 1 ]; then
    T1=$(med single) TD=$(med ddp)
    echo "| PyTorch, one process | $T1 | $(last single auc) | $(last single rss) |"
    echo "| PyTorch DDP gloo, 2 processes | $TD | $(last ddp auc) | $(last ddp rss) |"
fi
echo
echo "Server tables at the end (async): $(last async srv).  Load after: $(load)."
echo
if [ "$TORCH" = 1 ]; then
    awk -v a="$A" -v s="$S" -v t="$T1" -v d="$TD" 'BEGIN {
        printf "GOAL CTR async >= 3x PyTorch DDP gloo (%.2fx): %s\n", a / d, (a >= 3 * d) ? "met" : "MISSED"
        printf "GOAL CTR async >= 1.3x one PyTorch process (%.2fx): %s\n", a / t, (a >= 1.3 * t) ? "met" : "MISSED"
        printf "GOAL CTR sync >= 2x PyTorch DDP gloo (%.2fx): %s\n", s / d, (s >= 2 * d) ? "met" : "MISSED" }'
    awk -v a="$(last async auc)" -v t="$(last single auc)" 'BEGIN {
        e = a - t; if (e < 0) e = -e
        printf "GOAL CTR async test AUC within 0.005 of one PyTorch process after the same samples (%.4f vs %.4f): %s\n", a, t, (e <= 0.005) ? "met" : "MISSED" }'
else
    echo "(PyTorch not run: TABLES_SKIP_TORCH=1 or no torch; its goals are not measured)"
fi
WMAX=$(cat "$WORK"/async.*.rss "$WORK"/sync.*.rss | awk '{ for (i = 2; i <= NF; i++) if ($i > m) m = $i } END { print m + 0 }')

echo
echo "### Scale: the id space from 1e5 to 1e9"
echo
echo "The same model and runs (async, 1 server x 2 workers) with \`rows=\` each id space"
echo "(Zipf 1.05 over it: the larger the space, the more distinct ids the same samples"
echo "touch), $ROUNDS rounds over the spaces; median samples/s against the smallest"
echo "space's; the rows the server made, its memory for them and the peak RSS of the"
echo "last round.  Load before: $(load)."
echo
i=1
while [ "$i" -le "$ROUNDS" ]; do
    for r in $SCALE; do
        say "scale round $i of $ROUNDS: $r ids"
        ps_run async "scale$r.$i" "ctr:fields=8,rows=$r,dim=16" || exit 1
    done
    i=$((i + 1))
done
echo "| ids per table | samples/s | vs 1e5 | server rows (all tables) | table MiB | bytes a row | server peak RSS MB | worker peak RSS MB |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
base="" lo=1 hi=1
for r in $SCALE; do
    sps=$(med "scale$r")
    [ -n "$base" ] || base=$sps
    set -- $(last "scale$r" rss)
    srss=$1 w=$(fmax "$2" "$3")
    WMAX=$(fmax "$WMAX" "$w")
    set -- $(last "scale$r" srv | sed 's/[^0-9 ]//g')
    awk -v r="$r" -v s="$sps" -v b="$base" -v rows="$2" -v mib="$3" -v srss="$srss" -v w="$w" 'BEGIN {
        printf "| %s | %s | %.2f | %s | %s | %.0f | %s | %s |\n", r, s, s / b, rows, mib, mib * 1048576 / rows, srss, w }'
    lo=$(awk -v a="$lo" -v s="$sps" -v b="$base" 'BEGIN { x = s / b; print ((x < a) ? x : a) }')
    hi=$(awk -v a="$hi" -v s="$sps" -v b="$base" 'BEGIN { x = s / b; print ((x > a) ? x : a) }')
done
echo
echo "Load after: $(load)."
echo
awk -v lo="$lo" -v hi="$hi" 'BEGIN {
    printf "GOAL scale: samples/s within 20%% of those with 1e5 ids, up to 1e9 ids (%.2fx .. %.2fx): %s\n", lo, hi, (lo >= 0.8 && hi <= 1.2) ? "met" : "MISSED" }'
awk -v w="$WMAX" 'BEGIN {
    printf "GOAL ps_worker CTR peak RSS <= 300 MB whatever the row count (largest: %s MB): %s\n", w, (w <= 300) ? "met" : "MISSED" }'
