#!/bin/sh
# PyTorch's DLRM with its tables on the servers (bench/run.sh part "dlrm"):
# examples/torch_dlrm.py through ps.torch (1 ps_server x 2 workers, async
# and sync) against the same script as one PyTorch process and as
# DistributedDataParallel over gloo with 2 ranks: the same data, model,
# initialisation and seed; rounds alternating, medians of samples/s; every
# process's peak RSS; the tables with Adagrad and with row-wise Adagrad;
# then the plain port (--plain: the script as a PyTorch user writes it, one
# SGD, materialised tables, no prefetch, no tables=); then the id space grown
# to 1e9 per table through the servers alone.  Markdown on stdout, GOAL
# lines in bench/run.sh's format, progress on stderr.
#
#   DLRM_ROUNDS=3         rounds of the comparison
#   DLRM_ROWS=4000000     rows per table (DDP then holds 4.2 GB per rank)
#   DLRM_STEPS=300        steps per worker (one process: 2 x that many, the
#                         same samples)
#   DLRM_OPTIMIZERS="adagrad rowwise-adagrad"  the tables' optimizers compared
#   DLRM_PORT="12 2000000 32"  the plain port's tables, rows each and dim
#                         ("" skips it: 3 GB a process, 9 GB at once for DDP)
#   DLRM_PORT_ROUNDS=1    its rounds
#   DLRM_SCALE="1000000000"  id spaces of the servers-only rows ("" none)
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
bench_init
ROUNDS=${DLRM_ROUNDS:-3}
ROWS=${DLRM_ROWS:-4000000}
STEPS=${DLRM_STEPS:-300}
OPTS=${DLRM_OPTIMIZERS:-"adagrad rowwise-adagrad"}
PORT=${DLRM_PORT-"12 2000000 32"}
PORT_ROUNDS=${DLRM_PORT_ROUNDS:-1}
SCALE=${DLRM_SCALE-"1000000000"}
PY=/usr/bin/python3
if ! $PY -c 'import torch' 2>/dev/null; then
    echo "SKIP dlrm: skipped: $PY cannot import torch (python3-torch)"
    exit 0
fi
ARGS="--tables 8 --dim 16 --batch 128 --threads 1 --zipf 1.05 --seed 1"
load() { cut -d' ' -f1-3 /proc/loadavg; }
say() { echo "dlrm_bench: $*" >&2; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# field VALUE-AFTER FILE: the word after the words $1 on each line
after() { sed -n "s|.* $1 \([0-9.]*\).*|\1|p" "$2"; }

# the script's lines: TAG.sps (all processes' samples/s together), TAG.auc
# (rank 0's), TAG.rss (each process's peak RSS MB, rank order), TAG.wrap
# (each process's RSS after the wrap), TAG.tbr (server table bytes a row)
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
    after "peak rss MB" "$WORK/$_tag.lines" | tr '\n' ' ' >"$WORK/$_tag.rss"
    after "rss after wrap MB" "$WORK/$_tag.lines" | tr '\n' ' ' >"$WORK/$_tag.wrap"
    after "server table bytes/row" "$WORK/$_tag.lines" | head -n 1 >"$WORK/$_tag.tbr"
    # evaluation with autograd on gives what it gives off
    awk '{ a = ""; b = ""; for (i = 1; i < NF; i++) { if ($i == "auc") a = $(i + 1); if ($i == "on") b = $(i + 1) }
           sub(/\)/, "", b); if (a != b) { print "eval with grad on differs: " a " vs " b; exit 1 } }' \
        "$WORK/$_tag.lines" >&2 || return 1
}

# ps_run MODE TAG ROWS [example flags]: one server, 2 workers; TAG.srv: the
# server's peak RSS MB
ps_run() {
    _m=$1 _tag=$2 _rows=$3
    shift 3
    start_servers 1 2 "$_m" --threads 1 --optimizer sgd --lr 0.1 || return 1
    _pids=""
    for _r in 0 1; do
        PS_SERVERS=$PS_SERVERS PS_RANK=$_r PS_NUM_WORKERS=2 PS_MODE=$_m $BENCH_LIMIT \
            $PY examples/torch_dlrm.py --backend ps --rows "$_rows" --steps "$STEPS" "$@" \
            >"$WORK/$_tag.w$_r.log" 2>&1 &
        _pids="$_pids $!"
    done
    for p in $_pids; do wait "$p"; done
    _p=${SERVER_PIDS# }
    # with BENCH_TIMEOUT the pid is timeout's: the server is its child
    _c=$(pgrep -P "$_p" -x ps_server 2>/dev/null) && _p=$_c
    awk '/^VmHWM/ { printf "%.0f\n", $2 / 1024 }' "/proc/$_p/status" >"$WORK/$_tag.srv" 2>/dev/null
    stop_servers
    cat "$WORK/$_tag.w0.log" "$WORK/$_tag.w1.log" >"$WORK/$_tag.log"
    collect "$_tag"
}

# torch_run ddp|none TAG ROWS [example flags]
torch_run() {
    _b=$1 _tag=$2 _rows=$3
    shift 3
    if [ "$_b" = ddp ]; then
        $BENCH_LIMIT $PY examples/torch_dlrm.py --backend ddp --world 2 --rows "$_rows" \
            --steps "$STEPS" "$@" >"$WORK/$_tag.log" 2>&1
    else
        $BENCH_LIMIT $PY examples/torch_dlrm.py --backend none --rows "$_rows" \
            --steps $((2 * STEPS)) "$@" >"$WORK/$_tag.log" 2>&1
    fi
    collect "$_tag"
}

med() { for k in $(seq 1 "$2"); do cat "$WORK/$1$k.sps"; done | median; }
# row NAME TAG SPS DDP_SPS ROUNDS
row() {
    _srv=$( [ -s "$WORK/$2$5.srv" ] && echo "$(cat "$WORK/$2$5.srv"); " )
    echo "$1 $3 $4 $(cat "$WORK/$2$5.auc") $_srv$(cat "$WORK/$2$5.rss")" |
        awk '{ name = $1; gsub(/_/, " ", name); rss = ""; for (i = 5; i <= NF; i++) rss = rss " " $i
               printf "| %s | %.0f | %.2f | %s |%s |\n", name, $2, $2 / $3, $4, rss }'
}
opt_tag() { echo "$1" | tr -d -; }

echo "### PyTorch's DLRM: tables on the servers against DDP"
echo
echo "\`examples/torch_dlrm.py\`: bottom MLP 13-64-16, 8 \`nn.EmbeddingBag\` tables of"
echo "$ROWS ids x 16 (sum), pairwise dot interaction, top MLP 52-64-1; synthetic-ctr"
echo "(Zipf 1.05, one field per table), batch 128 per process, one thread each, SGD lr"
echo "0.1 on the dense layers, lr 0.05 on the tables (Adagrad, or row-wise Adagrad:"
echo "\`--optimizer rowwise-adagrad\`, one state float a row).  ps.torch: 1 \`ps_server\`"
echo "(1 update thread) x 2 workers, the tables made on the meta device and held by the"
echo "server, the next batch's rows prefetched.  PyTorch: DDP over gloo with 2 ranks"
echo "(\`sparse=True\`), and one process on the same samples ($((2 * STEPS)) steps)."
echo "$STEPS steps per worker, $ROUNDS rounds alternating, medians of samples/s (all"
echo "processes together); test AUC (10000 held-out samples, the same with autograd on"
echo "and off) and peak RSS of the last round.  Load before: $(load)."
echo
for o in $OPTS; do
    t=$(opt_tag "$o")
    i=1
    while [ "$i" -le "$ROUNDS" ]; do
        say "$o: round $i of $ROUNDS"
        ps_run async "a$t$i" "$ROWS" $ARGS --optimizer "$o" || exit 1
        if [ "$o" = adagrad ]; then ps_run sync "s$t$i" "$ROWS" $ARGS --optimizer "$o" || exit 1; fi
        torch_run ddp "d$t$i" "$ROWS" $ARGS --optimizer "$o" || exit 1
        torch_run none "t$t$i" "$ROWS" $ARGS --optimizer "$o" || exit 1
        i=$((i + 1))
    done
done
echo "| tables' optimizer, run | samples/s (median) | x DDP | test AUC | peak RSS MB (server; workers) |"
echo "|---|---:|---:|---:|---|"
for o in $OPTS; do
    t=$(opt_tag "$o")
    A=$(med "a$t" "$ROUNDS") D=$(med "d$t" "$ROUNDS") T=$(med "t$t" "$ROUNDS")
    row "${o}:_ps.torch_async_1x2" "a$t" "$A" "$D" "$ROUNDS"
    [ "$o" = adagrad ] && row "${o}:_ps.torch_sync_1x2" "s$t" "$(med "s$t" "$ROUNDS")" "$D" "$ROUNDS"
    row "${o}:_DDP_gloo_2_ranks" "d$t" "$D" "$D" "$ROUNDS"
    row "${o}:_one_process" "t$t" "$T" "$D" "$ROUNDS"
done
echo
echo "Server table memory a row (all of it: values, optimizer state, id, hash, the"
echo "slabs' free rows, over the rows made), last round:"
for o in $OPTS; do
    t=$(opt_tag "$o")
    echo "$o: $(cat "$WORK/a$t$ROUNDS.tbr") bytes ($(echo "$o" | awk '{ print ($1 == "rowwise-adagrad") ? "16 values + 1 state float = 68" : "16 values + 16 state floats = 128" }') of values and state)."
done
echo

if [ -n "$PORT" ]; then
    set -- $PORT
    PT=$1 PR=$2 PD=$3
    PARGS="--tables $PT --dim $PD --batch 128 --threads 1 --zipf 1.05 --seed 1 --plain"
    i=1
    while [ "$i" -le "$PORT_ROUNDS" ]; do
        say "plain port: round $i of $PORT_ROUNDS"
        ps_run async "pa$i" "$PR" $PARGS || exit 1
        torch_run ddp "pd$i" "$PR" $PARGS || exit 1
        torch_run none "pt$i" "$PR" $PARGS || exit 1
        i=$((i + 1))
    done
    PA=$(med pa "$PORT_ROUNDS") PDD=$(med pd "$PORT_ROUNDS") PTT=$(med pt "$PORT_ROUNDS")
    echo "#### The plain port"
    echo
    echo "The script as a PyTorch user has it (\`--plain\`): $PT \`nn.EmbeddingBag($PR, $PD,"
    echo "sparse=True)\` materialised (uniform), one \`torch.optim.SGD(model.parameters(),"
    echo "lr=0.1)\`, no prefetch, no \`tables=\`, no meta device; ps.torch's one line wraps it"
    echo "(the tables follow that SGD, start from the module's rows, and the worker frees"
    echo "them).  1 server x 2 workers async; $PORT_ROUNDS round(s), medians.  Load before: $(load)."
    echo
    echo "| run | samples/s | x DDP | test AUC | peak RSS MB (server; workers) | RSS after the wrap MB |"
    echo "|---|---:|---:|---:|---|---|"
    for r in "ps.torch_async_1x2 pa $PA" "DDP_gloo_2_ranks pd $PDD" "one_process pt $PTT"; do
        set -- $r
        echo "$(row "$1" "$2" "$3" "$PDD" "$PORT_ROUNDS") $(cat "$WORK/$2$PORT_ROUNDS.wrap") |"
    done
    echo
fi

for s in $SCALE; do
    say "id space $s"
    ps_run async "big$s" "$s" $ARGS || exit 1
    echo "Id space $s per table (8 x $s x 16 floats: $(echo "$s" | awk '{ printf "%.0f", $1 * 8 * 16 * 4 / 2^30 }') GiB as dense tables), async through"
    echo "the server: $(cat "$WORK/big$s.sps") samples/s, test AUC $(cat "$WORK/big$s.auc"), peak RSS MB: server"
    echo "$(cat "$WORK/big$s.srv"), workers $(cat "$WORK/big$s.rss")(the server holds the rows touched only)."
    echo
done

for o in $OPTS; do
    t=$(opt_tag "$o")
    A=$(med "a$t" "$ROUNDS") D=$(med "d$t" "$ROUNDS") T=$(med "t$t" "$ROUNDS")
    echo "$o $A $D $T $(cat "$WORK/a$t$ROUNDS.auc") $(cat "$WORK/t$t$ROUNDS.auc")" | awk '{
        printf "GOAL DLRM %s async >= 3x PyTorch DDP gloo (%.2fx): %s\n", $1, $2 / $3, ($2 >= 3 * $3) ? "met" : "MISSED"
        printf "GOAL DLRM %s async >= 1.3x one PyTorch process (%.2fx): %s\n", $1, $2 / $4, ($2 >= 1.3 * $4) ? "met" : "MISSED"
        e = $5 - $6; if (e < 0) e = -e
        printf "GOAL DLRM %s async test AUC within 0.005 of one PyTorch process after the same samples (%.4f vs %.4f): %s\n", $1, $5, $6, (e <= 0.005) ? "met" : "MISSED" }'
done
S=$(med sadagrad "$ROUNDS") D=$(med dadagrad "$ROUNDS")
echo "$S $D" | awk '{ printf "GOAL DLRM sync >= 1.5x PyTorch DDP gloo (%.2fx): %s\n", $1 / $2, ($1 >= 1.5 * $2) ? "met" : "MISSED" }'
AW=$(cat "$WORK/aadagrad$ROUNDS.rss" | tr ' ' '\n' | sort -g | tail -n 1)
echo "$AW" | awk '{ printf "GOAL DLRM worker peak RSS <= 400 MB (%s MB): %s\n", $1, ($1 <= 400) ? "met" : "MISSED" }'
case " $OPTS " in
*" rowwise-adagrad "*)
    cat "$WORK/arowwiseadagrad$ROUNDS.tbr" | awk '{ printf "GOAL DLRM row-wise Adagrad table memory <= (dim + 1) floats + 16 bytes a row = 84 (%.1f): %s\n", $1, ($1 <= 84) ? "met" : "MISSED" }' ;;
esac
if [ -n "$PORT" ]; then
    PW=$(cat "$WORK/pa$PORT_ROUNDS.wrap" | tr ' ' '\n' | sort -g | tail -n 1)
    DR=$(cat "$WORK/pd$PORT_ROUNDS.rss" | tr ' ' '\n' | sort -g | tail -n 1)
    echo "$PA $PDD $PTT $(cat "$WORK/pa$PORT_ROUNDS.auc") $(cat "$WORK/pt$PORT_ROUNDS.auc") $PW $DR" | awk '{
        e = $4 - $5; if (e < 0) e = -e
        printf "GOAL DLRM plain port test AUC within 0.01 of one PyTorch process (%.4f vs %.4f): %s\n", $4, $5, (e <= 0.01) ? "met" : "MISSED"
        printf "GOAL DLRM plain port async >= 1.3x one PyTorch process (%.2fx): %s\n", $1 / $3, ($1 >= 1.3 * $3) ? "met" : "MISSED"
        printf "GOAL DLRM plain port async >= 3x PyTorch DDP gloo (%.2fx): %s\n", $1 / $2, ($1 >= 3 * $2) ? "met" : "MISSED"
        printf "GOAL DLRM plain port worker RSS after the wrap <= 0.25x a DDP rank (%s vs %s MB): %s\n", $6, $7, ($6 <= 0.25 * $7) ? "met" : "MISSED" }'
fi
