#!/bin/sh
# accuracy: the accuracy goals with 1 server and 2 workers on Fashion-MNIST,
# through bin/ps_launch (or ps_server/ps_worker started by hand when
# ps_launch is not there):
#   MLP 784-256-128-10, 10 epochs, sync   goal >= 0.885
#   MLP 784-256-128-10, 10 epochs, async  goal >= 0.88
#   CNN, 3 epochs, sync                   goal >= 0.915
# Long: the CNN alone takes minutes on a small CPU.  Prints a markdown table
# with the test accuracy after each epoch (worker 0) and GOAL lines.
#   --write-doc   also replace the accuracy section of docs/BENCHMARKS.md
#   ACC_MLP_OPT / ACC_MLP_LR (adam / 0.0005), ACC_CNN_OPT / ACC_CNN_LR (adam / 0.001)
#   ACC_ONLY="mlp-sync mlp-async cnn-sync"   ACC_DATA (default dir)   PS_BIN_DIR (bin)
#   ACC_MLP_EPOCHS (10), ACC_CNN_EPOCHS (3): fewer only to try the script
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
write_doc=0
for a in "$@"; do
    case "$a" in
    --write-doc) write_doc=1 ;;
    --help)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
        exit 0
        ;;
    *)
        echo "usage: bench/accuracy.sh [--write-doc]" >&2
        exit 2
        ;;
    esac
done
bench_init
DOC=${BENCH_DOC:-docs/BENCHMARKS.md}
MLP_OPT=${ACC_MLP_OPT:-adam}
MLP_LR=${ACC_MLP_LR:-0.0005}
CNN_OPT=${ACC_CNN_OPT:-adam}
CNN_LR=${ACC_CNN_LR:-0.001}
ONLY=${ACC_ONLY:-"mlp-sync mlp-async cnn-sync"}
MLP_EPOCHS=${ACC_MLP_EPOCHS:-10} # the goals are for 10 and 3; fewer only to try the script
CNN_EPOCHS=${ACC_CNN_EPOCHS:-3}
# the CNN: batch 32 per worker (2 x 32 = 64 a round) and the rate cut to 0.3x
# after each epoch (937 rounds) on the servers
CNN_BATCH=${ACC_CNN_BATCH:-32}
CNN_EXTRA=${ACC_CNN_EXTRA:-"--lr-decay 0.3 --lr-decay-every 937"}
MLP_BATCH=64
DATA_FLAG=""
[ -n "$ACC_DATA" ] && DATA_FLAG="--data $ACC_DATA"
t_start=$(date +%s)

# train MODE SPEC EPOCHS OPT LR: runs 1 server x 2 workers; leaves worker 0's
# output in $WORK/run.log; prints the final test accuracy (empty on failure)
train() {
    _mode=$1 _spec=$2 _ep=$3 _opt=$4 _lr=$5 _batch=$6 _extra=$7
    _flags="--model $_spec --epochs $_ep --batch $_batch --lr $_lr --optimizer $_opt $_extra --threads 1 $DATA_FLAG"
    if [ -x "$BIN/ps_launch" ]; then
        # shellcheck disable=SC2086
        "$BIN/ps_launch" --servers 1 --workers 2 --gpus none --mode "$_mode" -- $_flags \
            >"$WORK/launch.log" 2>&1
        _rc=$?
        grep '^\[worker 0\]' "$WORK/launch.log" >"$WORK/run.log"
    else
        start_servers 1 2 "$_mode" --lr "$_lr" --optimizer "$_opt" || return 1
        # shellcheck disable=SC2086
        run_workers 2 "$_mode" $_flags >/dev/null
        _rc=$?
        stop_servers
        cp "$WORK/worker0.log" "$WORK/run.log"
    fi
    if [ "$_rc" -ne 0 ]; then
        echo "accuracy: $_mode $_spec failed (exit $_rc); last lines:" >&2
        tail -n 8 "$WORK/launch.log" "$WORK/run.log" 2>/dev/null >&2
        return 1
    fi
    sed -n 's/.*summary: .*test accuracy \([0-9.]*\).*/\1/p' "$WORK/run.log" | tail -n 1
}

# per-epoch accuracies of the last run: "0.81, 0.84, ..."
epochs_line() {
    sed -n 's/.*epoch \([0-9]*\) test accuracy \([0-9.]*\).*/\2/p' "$WORK/run.log" |
        awk '{ printf "%s%s", (NR > 1 ? ", " : ""), $1 } END { print "" }'
}

table="$WORK/table.md"
goals="$WORK/goals"
: >"$goals"
echo "| run | model | epochs | mode | batch/worker | optimizer | lr | test accuracy per epoch (worker 0) | final | goal | time s |" >"$table"
echo "| --- | --- | ---: | --- | ---: | --- | --- | --- | ---: | --- | ---: |" >>"$table"
fail=0
for run in mlp-sync mlp-async cnn-sync; do
    case " $ONLY " in *" $run "*) ;; *) continue ;; esac
    case $run in
    mlp-sync) mode=sync spec=mlp:784-256-128-10 ep=$MLP_EPOCHS opt=$MLP_OPT lr=$MLP_LR goal=0.885
        batch=$MLP_BATCH extra="" ;;
    mlp-async) mode=async spec=mlp:784-256-128-10 ep=$MLP_EPOCHS opt=$MLP_OPT lr=$MLP_LR goal=0.88
        batch=$MLP_BATCH extra="" ;;
    cnn-sync) mode=sync spec=cnn ep=$CNN_EPOCHS opt=$CNN_OPT lr=$CNN_LR goal=0.915
        batch=$CNN_BATCH extra=$CNN_EXTRA ;;
    esac
    echo "accuracy: $run ($spec, $ep epochs, $mode, $opt lr $lr) ..." >&2
    t0=$(date +%s)
    acc=$(train "$mode" "$spec" "$ep" "$opt" "$lr" "$batch" "$extra")
    secs=$(( $(date +%s) - t0 ))
    per=$(epochs_line)
    if [ -z "$acc" ]; then
        fail=1
        echo "| $run | $spec | $ep | $mode | $batch | $opt | $lr $extra | $per | failed | >= $goal: **missed** | $secs |" >>"$table"
        echo "GOAL accuracy $run >= $goal: MISSED (the run failed)" >>"$goals"
        continue
    fi
    met=$(awk -v a="$acc" -v g="$goal" 'BEGIN { print (a >= g ? "met" : "**missed**") }')
    echo "| $run | $spec | $ep | $mode | $batch | $opt | $lr $extra | $per | $acc | >= $goal: $met | $secs |" >>"$table"
    if [ "$met" = met ]; then
        echo "GOAL accuracy $run >= $goal: MET ($acc)" >>"$goals"
    else
        echo "GOAL accuracy $run >= $goal: MISSED ($acc)" >>"$goals"
    fi
    echo "accuracy: $run: $acc ($secs s)" >&2
done

out="$WORK/out.md"
{
    cat "$table"
    echo
    echo "1 server, 2 workers (\`ps_launch --servers 1 --workers 2 --gpus none\`),"
    echo "\`--threads 1\`; the optimizer (and the lr decay) runs on the server.  The accuracy per epoch is"
    echo "worker 0's test accuracy on its own copy of the weights at the end of each epoch,"
    echo "the last one (= final) on the servers' weights after the last step.  Async runs are"
    echo "not bitwise repeatable (the order updates arrive in varies); sync runs are."
    echo
    cat "$goals"
} >"$out"
cat "$out"

if [ "$write_doc" = 1 ]; then
    if [ -f "$DOC" ] && grep -q '<!-- accuracy:begin -->' "$DOC"; then
        {
            echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') with \`bench/accuracy.sh\`" \
                 "($(( $(date +%s) - t_start )) s) on $(machine_line)."
            echo
            sed 's/^GOAL /- GOAL /' "$out"
        } >"$WORK/section"
        sed 's/^GOAL /- /' "$goals" >"$WORK/goals.md"
        # replace the accuracy section and the accuracy lines of the goals list
        awk -v f="$WORK/section" -v g="$WORK/goals.md" '
            /<!-- accuracy:begin -->/ { print; while ((getline l < f) > 0) print l; skip = 1; next }
            /<!-- accuracy:end -->/ { skip = 0 }
            /<!-- accuracy-goals:begin -->/ { print; while ((getline l < g) > 0) print l; skip = 1; next }
            /<!-- accuracy-goals:end -->/ { skip = 0 }
            !skip' "$DOC" >"$WORK/doc" && cp "$WORK/doc" "$DOC"
        echo "accuracy: updated the accuracy section of $DOC" >&2
    else
        echo "accuracy: $DOC has no accuracy section yet; run make bench first" >&2
    fi
fi
[ "$fail" -eq 0 ]
