#!/bin/sh
# load_bench: 16 workers against 2 servers (async), bounded by a step count,
# at two model sizes.  The window is from the first worker's first step to the
# last worker's last step (timestamps of each worker's "training" line and of
# its last "iter N/N" line), so start-up, the final pull and evaluation are
# outside it.  In it: W x steps x batch samples, W x steps x chunks updates
# (each pushed chunk is one update in async) and W x steps x 2 x model bytes
# of payload (gradient up, weights down).  The servers' own counters (the
# "stopped:" line) are shown beside it as a check.
#   LOAD_WORKERS (16)  LOAD_SERVERS (2)  LOAD_SMALL_STEPS (150)  LOAD_LARGE_STEPS (40)
#   LOAD_MODELS ("mlp:784-256-128-10 mlp:784-1024-1024-10")  PS_BIN_DIR (bin)
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
bench_init

W=${LOAD_WORKERS:-16}
S=${LOAD_SERVERS:-2}
MODELS=${LOAD_MODELS:-"mlp:784-256-128-10 mlp:784-1024-1024-10"}
SMALL_STEPS=${LOAD_SMALL_STEPS:-150}
LARGE_STEPS=${LOAD_LARGE_STEPS:-40}
BATCH=64
LR=0.05
DATA=synthetic:4096
CHUNK=$((4 << 20))

echo "load_bench: $W workers, $S servers, async, $DATA, batch $BATCH, --threads 1 each," \
     "on $(nproc) cores" >&2
# window: earliest "training" line to latest "iter N/N" line of the worker
# logs (timestamps HH:MM:SS.mmm), in seconds
window() {
    cat "$WORK"/worker*.log | awk '
        function sec(ts,  t) { split(ts, t, ":"); return t[1] * 3600 + t[2] * 60 + t[3] }
        / training / { s = sec(substr($3, 1, length($3) - 1)); if (lo == "" || s < lo) lo = s }
        / iter [0-9]+\/[0-9]+ / { e = sec(substr($3, 1, length($3) - 1)); if (hi == "" || e > hi) hi = e }
        END { w = hi - lo; if (w < 0) w += 86400; printf "%.3f\n", w }'
}

echo "| model | params | chunks/step | steps/worker | window s | samples/s (all workers) | compute-only samples/s ($W workers, no server) | through servers / compute-only | updates/s | payload MB/s | server updates (expected) | server MiB in+out |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
fail=0
first=1
for model in $MODELS; do
    if [ "$first" = 1 ]; then steps=$SMALL_STEPS; else steps=$LARGE_STEPS; fi
    first=0
    # parameters and chunks of an mlp spec: every layer's weight and bias
    set -- $(echo "${model#mlp:}" | awk -F- -v chunk="$CHUNK" '{
        p = 0; c = 0
        for (i = 1; i < NF; i++) {
            w = $i * $(i + 1); b = $(i + 1)
            p += w + b
            c += int((w * 4 + chunk - 1) / chunk) + int((b * 4 + chunk - 1) / chunk)
        }
        print p, c }')
    params=$1 chunks=$2
    # enough epochs of the small synthetic set for `steps`; no evaluation inside
    epochs=$(( (steps * BATCH * W + 4095) / 4096 + 1 ))
    flags="--model $model --data $DATA --steps $steps --epochs $epochs --batch $BATCH --threads 1"
    flags="$flags --lr $LR --eval-every 1000000000 --log-every 1000000"
    # baseline: the same W workers, each alone (--servers none), at the same time
    rm -f "$WORK"/worker*.log
    run_workers "$W" none $flags >/dev/null || fail=1
    cwin=$(window)
    rm -f "$WORK"/worker*.log
    if ! start_servers "$S" "$W" async --lr "$LR"; then fail=1; continue; fi
    run_workers "$W" async $flags >/dev/null || fail=1
    stop_servers
    win=$(window)
    upd=0 mib=0
    i=0
    while [ "$i" -lt "$S" ]; do
        line=$(grep 'stopped:' "$WORK/server$i.log" | tail -n 1)
        u=$(echo "$line" | sed -n 's/.* \([0-9]*\) updates,.*/\1/p')
        mi=$(echo "$line" | sed -n 's/.* \([0-9]*\) MiB in, \([0-9]*\) MiB out.*/\1 \2/p')
        upd=$((upd + ${u:-0}))
        mib=$((mib + $(echo "${mi:-0 0}" | awk '{ print $1 + $2 }')))
        i=$((i + 1))
    done
    awk -v m="$model" -v p="$params" -v c="$chunks" -v st="$steps" -v w="$W" -v b="$BATCH" \
        -v win="$win" -v cwin="$cwin" -v upd="$upd" -v mib="$mib" 'BEGIN {
        n = w * st
        if (win <= 0 || cwin <= 0) { printf "| %s | %d | %d | %d | - | - | - | - | - | - | %d | %d |\n", m, p, c, st, upd, mib; exit }
        printf "| %s | %d | %d | %d | %.2f | %.0f | %.0f | %.2f | %.0f | %.1f | %d (%d) | %d |\n",
            m, p, c, st, win, n * b / win, n * b / cwin, cwin / win, n * c / win,
            n * 2 * p * 4 / win / 1e6, upd, n * c, mib }'
done
echo
echo "Updates/s counts chunk updates (one per pushed chunk, async).  $W workers and $S servers"
echo "share $(nproc) cores, so this measures how the servers hold up under many connections"
echo "and an oversubscribed CPU, not the network."
if [ "$fail" -ne 0 ]; then
    echo "LOAD: some runs failed (see the messages above)"
    exit 1
fi
echo "LOAD: all $W workers finished at every size (no goal set)"
