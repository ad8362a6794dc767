#!/bin/sh
# A /dev/shm of 64 MiB (Docker's default) in a private mount namespace, and
# a model too large for it (mlp:784-2048-2048-10: 23.3 MB a copy):
#   - a worker's arena (six copies) is a memfd, not a file of /dev/shm: the
#     worker trains through shared memory and exits 0, /dev/shm untouched
#     (earlier versions made a sparse file there and died of SIGBUS);
#   - local aggregation's segment (three copies for two workers) lives in
#     /dev/shm and does not fit: the leader allocates it at start, and every
#     worker of the group stops at once with the size needed and the space
#     free, leaving /dev/shm empty.
# Needs root (unshare -m, mount); otherwise prints SKIP with the reason.
set -u
BIN=${PS_BIN_DIR:-bin}
C1=an_arena_larger_than_dev_shm_trains_through_shared_memory
C2=local_aggregation_larger_than_dev_shm_stops_every_worker_with_the_sizes
MODEL=mlp:784-2048-2048-10

if [ "${1:-}" = --inner ]; then
    # in the namespace: $2 is the scratch directory
    T=$2
    mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 3
    free_port() {
        python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
    }
    # wait_exit PID SECONDS: its exit status, 124 when it outlived SECONDS
    wait_exit() {
        i=0
        while kill -0 "$1" 2>/dev/null && [ "$i" -lt $(($2 * 10)) ]; do
            sleep 0.1
            i=$((i + 1))
        done
        if kill -0 "$1" 2>/dev/null; then
            kill -9 "$1" 2>/dev/null
            wait "$1" 2>/dev/null
            return 124
        fi
        wait "$1"
    }
    ls -A /dev/shm >"$T/shm-before"

    P=$(free_port)
    "$BIN/ps_server" --bind "tcp://127.0.0.1:$P" --num-workers 1 --mode async >"$T/s1.log" 2>&1 &
    s=$!
    "$BIN/ps_worker" --servers "tcp://127.0.0.1:$P" --rank 0 --num-workers 1 --mode async \
        --model $MODEL --data synthetic:256 --batch 32 --steps 6 --log-every 1 >"$T/w1.log" 2>&1 &
    w=$!
    wait_exit "$w" 120
    echo "$?" >"$T/w1.rc"
    ls -A /dev/shm >"$T/shm-1"
    kill "$s" 2>/dev/null
    wait_exit "$s" 10

    P=$(free_port)
    "$BIN/ps_server" --bind "tcp://127.0.0.1:$P" --num-workers 1 --mode sync >"$T/s2.log" 2>&1 &
    s=$!
    start=$(date +%s)
    for r in 0 1; do
        "$BIN/ps_worker" --servers "tcp://127.0.0.1:$P" --rank $r --num-workers 2 --mode sync \
            --local-aggregate 2 --model $MODEL --data synthetic:256 --batch 32 --steps 6 \
            --server-timeout 60 >"$T/lg$r.log" 2>&1 &
        eval "l$r=\$!"
    done
    wait_exit "$l0" 120
    echo "$?" >"$T/lg0.rc"
    wait_exit "$l1" 120
    echo "$?" >"$T/lg1.rc"
    echo $(($(date +%s) - start)) >"$T/lg.secs"
    ls -A /dev/shm >"$T/shm-2"
    kill "$s" 2>/dev/null
    wait_exit "$s" 10
    exit 0
fi

TMP=$(mktemp -d /tmp/ps_test_shm_space.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
skip() { echo "SKIP $C1: $1"; echo "SKIP $C2: $1"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root for a private mount namespace with a 64 MiB /dev/shm"
command -v unshare >/dev/null 2>&1 || skip "no unshare (util-linux)"
unshare -m --propagation private sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm' \
    2>"$TMP/err" || skip "cannot mount a tmpfs in a private mount namespace: $(head -c 200 "$TMP/err")"

unshare -m --propagation private sh "$0" --inner "$TMP"
rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL $C1: the namespace's script exited $rc"; echo "FAIL $C2: (the same)"; exit 1; }

why=""
[ "$(cat "$TMP/w1.rc")" = 0 ] || why="$why the worker exited $(cat "$TMP/w1.rc") ($(grep -m2 -E 'error|warn' "$TMP/w1.log"));"
grep -q "iter 6/" "$TMP/w1.log" || why="$why it did not train 6 steps;"
grep -q "worker 0: payloads through shared memory" "$TMP/s1.log" ||
    why="$why not through shared memory ($(grep -m1 'worker 0: payloads' "$TMP/s1.log"));"
cmp -s "$TMP/shm-before" "$TMP/shm-1" || why="$why /dev/shm now holds $(cat "$TMP/shm-1");"
if [ -z "$why" ]; then echo "PASS $C1"; else echo "FAIL $C1:$why"; fi

why=""
for r in 0 1; do
    rc=$(cat "$TMP/lg$r.rc")
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || why="$why worker $r exited $rc;"
    grep -q "need [0-9.]* MiB of shared memory" "$TMP/lg$r.log" &&
        grep -q "MiB free of 64.0 MiB" "$TMP/lg$r.log" ||
        why="$why worker $r does not give the sizes ($(grep -m1 -E 'error' "$TMP/lg$r.log"));"
done
[ "$(cat "$TMP/lg.secs")" -le 30 ] || why="$why the group took $(cat "$TMP/lg.secs") s to stop;"
cmp -s "$TMP/shm-before" "$TMP/shm-2" || why="$why /dev/shm now holds $(cat "$TMP/shm-2");"
if [ -z "$why" ]; then echo "PASS $C2"; else echo "FAIL $C2:$why"; exit 1; fi
[ -z "$(grep -l FAIL /dev/null)" ]
