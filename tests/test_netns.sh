#!/bin/sh
# Multi-host test on one machine: a server and two workers in separate network
# namespaces joined by a veth pair (delay and loss added with tc netem where
# the kernel has it), training in sync mode while the link is cut for a few
# seconds.  Needs root and `ip netns`; otherwise prints SKIP with the reason.
# Prints one PASS/FAIL/SKIP line per case.
set -u
BIN=${PS_BIN_DIR:-bin}
NS_S=ps_srv_$$
NS_W=ps_wrk_$$
VS=pss$$
VW=psw$$
TMP=$(mktemp -d /tmp/ps_test_netns.XXXXXX)
pids=""

cleanup() {
    # every process inside the namespaces, not only the `ip netns exec` we started
    for ns in "$NS_S" "$NS_W"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    done
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    ip netns del "$NS_S" 2>/dev/null
    ip netns del "$NS_W" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

skip() { echo "SKIP netns_train_survives_link_cut: $1"; exit 0; }

[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "ip (iproute2) is not installed"
ip netns add "$NS_S" 2>"$TMP/err" || skip "cannot create a network namespace: $(cat "$TMP/err")"
ip netns add "$NS_W" 2>"$TMP/err" || skip "cannot create a network namespace: $(cat "$TMP/err")"
ip link add "$VS" type veth peer name "$VW" 2>"$TMP/err" || skip "cannot create a veth pair: $(cat "$TMP/err")"
ip link set "$VS" netns "$NS_S" && ip link set "$VW" netns "$NS_W" || skip "cannot move veth into the namespaces"
# 10.250.0.0/30 exists only inside these two namespaces of ours
ip -n "$NS_S" addr add 10.250.0.1/30 dev "$VS"
ip -n "$NS_W" addr add 10.250.0.2/30 dev "$VW"
for ns in "$NS_S" "$NS_W"; do ip -n "$ns" link set lo up; done
ip -n "$NS_S" link set "$VS" up
ip -n "$NS_W" link set "$VW" up
if ip netns exec "$NS_W" tc qdisc add dev "$VW" root netem delay 2ms loss 0.5% 2>/dev/null; then
    echo "# netem: 2 ms delay, 0.5% loss on the worker side"
else
    echo "# netem is not available in this kernel: no delay or loss added (the link cut still runs)"
fi

PORT=29611
ip netns exec "$NS_S" timeout 120 "$BIN/ps_server" --bind "tcp://10.250.0.1:$PORT" --num-workers 2 \
    --mode sync --lr 0.1 >"$TMP/server.log" 2>&1 &
pids="$pids $!"
sleep 0.3
for r in 0 1; do
    ip netns exec "$NS_W" timeout 120 "$BIN/ps_worker" --servers "tcp://10.250.0.1:$PORT" --rank $r \
        --num-workers 2 --mode sync --lr 0.1 --model mlp:784-32-10 --data synthetic:4096 \
        --batch 32 --epochs 40 --log-every 500 --request-timeout 500 >"$TMP/worker$r.log" 2>&1 &
    eval "w$r=$!"
    pids="$pids $!"
done
# let training start (on a loaded machine the workers may take a while to
# get there), then cut the link for 3 seconds
n=0
while [ $n -lt 200 ] && ! grep -q "training " "$TMP/worker0.log" 2>/dev/null; do
    sleep 0.1
    n=$((n + 1))
done
sleep 0.3
ip -n "$NS_W" link set "$VW" down
echo "# link cut at $(date +%T.%N | cut -c1-12)"
sleep 3
ip -n "$NS_W" link set "$VW" up
echo "# link restored at $(date +%T.%N | cut -c1-12)"
fail=""
# shellcheck disable=SC2154
for r in 0 1; do
    eval "p=\$w$r"
    if wait "$p"; then :; else fail="$fail worker $r exited $?;"; fi
done
grep -q "summary:" "$TMP/worker0.log" || fail="$fail worker 0 printed no summary;"
# the cut must have fallen inside training: the run took longer than the cut
t=$(sed -n 's/.*summary: time \([0-9.]*\) s.*/\1/p' "$TMP/worker0.log")
[ -n "$t" ] && awk "BEGIN{exit !($t > 3.0)}" || fail="$fail training ($t s) ended before the 3 s link cut was over;"
if [ -z "$fail" ]; then
    echo "# $(grep 'summary:' "$TMP/worker0.log" | sed 's/.*summary:/summary:/')"
    echo "PASS netns_train_survives_link_cut"
else
    echo "FAIL netns_train_survives_link_cut:$fail"
    tail -n 15 "$TMP/server.log" "$TMP/worker0.log" "$TMP/worker1.log"
    exit 1
fi
