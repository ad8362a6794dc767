#!/bin/sh
# A network partition between a shard group's primary and its replica, both
# still reaching etcd and the workers (docs/OPERATIONS.md "Replicas"):
#
#   ns P (primary, member 0) --veth-- ns E (etcd, workers) --veth-- ns R (member 1)
#
# P and R talk to each other only through E's forwarding; turning it off
# cuts P <-> R alone.  Both see the other silent past --failure-timeout and
# ask etcd: one compare-and-swap wins, the other server stops (exit 1), and
# the workers finish with the one primary.  Never two primaries: etcd's last
# configuration names one, exactly one of the two servers is left, and it is
# that one.  Needs root and `ip netns`; otherwise SKIP.
set -u
BIN=${PS_BIN_DIR:-bin}
ETCD=$(command -v etcd || echo /usr/bin/etcd)
NS_P=ps_rp_$$
NS_R=ps_rr_$$
NS_E=ps_re_$$
TMP=$(mktemp -d /tmp/ps_test_replicas_netns.XXXXXX)
pids=""
name=replicas_partition_never_two_primaries

cleanup() {
    for ns in "$NS_P" "$NS_R" "$NS_E"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    done
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    for ns in "$NS_P" "$NS_R" "$NS_E"; do ip netns del "$ns" 2>/dev/null; done
    [ -n "${PS_TEST_KEEP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

skip() { echo "SKIP $name: $1"; exit 0; }
fail() {
    echo "FAIL $name: $1"
    for f in "$TMP"/*.log; do echo "---- $f"; tail -n 12 "$f"; done
    exit 1
}

[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "ip (iproute2) is not installed"
[ -x "$ETCD" ] || skip "no etcd (install etcd-server: make deps)"
for ns in "$NS_P" "$NS_R" "$NS_E"; do
    ip netns add "$ns" 2>"$TMP/err" || skip "cannot create a network namespace: $(cat "$TMP/err")"
    ip -n "$ns" link set lo up
done
# P - E: 10.251.0.2 - 10.251.0.1; R - E: 10.252.0.2 - 10.252.0.1 (only in
# these namespaces of ours)
ip link add rp$$ type veth peer name ep$$ 2>"$TMP/err" || skip "cannot create a veth pair: $(cat "$TMP/err")"
ip link add rr$$ type veth peer name er$$ || skip "cannot create a veth pair"
ip link set rp$$ netns "$NS_P" && ip link set ep$$ netns "$NS_E" &&
    ip link set rr$$ netns "$NS_R" && ip link set er$$ netns "$NS_E" || skip "cannot move veths"
ip -n "$NS_P" addr add 10.251.0.2/30 dev rp$$
ip -n "$NS_E" addr add 10.251.0.1/30 dev ep$$
ip -n "$NS_R" addr add 10.252.0.2/30 dev rr$$
ip -n "$NS_E" addr add 10.252.0.1/30 dev er$$
for d in "$NS_P rp$$" "$NS_E ep$$" "$NS_R rr$$" "$NS_E er$$"; do
    set -- $d
    ip -n "$1" link set "$2" up
done
ip -n "$NS_P" route add default via 10.251.0.1
ip -n "$NS_R" route add default via 10.252.0.1
ip netns exec "$NS_E" sysctl -qw net.ipv4.ip_forward=1 || skip "cannot turn on forwarding"

# etcd in E, on both links
CP=23790
ip netns exec "$NS_E" "$ETCD" --data-dir "$TMP/etcd" --listen-client-urls "http://0.0.0.0:$CP" \
    --advertise-client-urls "http://10.251.0.1:$CP" --listen-peer-urls http://127.0.0.1:23800 \
    --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster default=http://127.0.0.1:23800 --log-level warn >"$TMP/etcd.log" 2>&1 &
pids="$pids $!"
n=0
until ip netns exec "$NS_P" sh -c "exec 3<>/dev/tcp/10.251.0.1/$CP" 2>/dev/null ||
    ip netns exec "$NS_E" bash -c "exec 3<>/dev/tcp/127.0.0.1/$CP" 2>/dev/null; do
    n=$((n + 1))
    [ $n -lt 100 ] || fail "etcd did not start"
    sleep 0.1
done
sleep 0.5

PP=29701
PR=29702
GROUP="tcp://10.251.0.2:$PP|tcp://10.252.0.2:$PR"
COMMON="--rank 0 --num-servers 1 --num-workers 2 --mode async --lr 0.05 --group $GROUP --job part
  --failure-timeout 1"
# shellcheck disable=SC2086
ip netns exec "$NS_P" timeout 120 "$BIN/ps_server" --bind "tcp://10.251.0.2:$PP" --member 0 \
    --coord "http://10.251.0.1:$CP" $COMMON >"$TMP/p.log" 2>&1 &
PID_P=$!
pids="$pids $PID_P"
# shellcheck disable=SC2086
ip netns exec "$NS_R" timeout 120 "$BIN/ps_server" --bind "tcp://10.252.0.2:$PR" --member 1 \
    --coord "http://10.252.0.1:$CP" $COMMON >"$TMP/r.log" 2>&1 &
PID_R=$!
pids="$pids $PID_R"
for r in 0 1; do
    ip netns exec "$NS_E" timeout 120 "$BIN/ps_worker" --servers "$GROUP" --rank $r \
        --num-workers 2 --mode async --lr 0.05 --model mlp:784-64-10 --data synthetic:4096 \
        --batch 32 --epochs 200 --log-every 500 --request-timeout 1000 --failure-timeout 1 \
        >"$TMP/w$r.log" 2>&1 &
    eval "w$r=$!"
    pids="$pids $!"
done
n=0
while [ $n -lt 300 ] && ! grep -q "taking its stream" "$TMP/r.log" 2>/dev/null; do
    sleep 0.1
    n=$((n + 1))
done
grep -q "taking its stream" "$TMP/r.log" || fail "the replica never took the primary's stream"
n=0
while [ $n -lt 300 ] && ! grep -q " iter " "$TMP/w0.log" 2>/dev/null; do
    sleep 0.1
    n=$((n + 1))
done
sleep 0.5
ip netns exec "$NS_E" sysctl -qw net.ipv4.ip_forward=0
echo "# P <-> R cut at $(date +%T.%N | cut -c1-12)"
sleep 4
ip netns exec "$NS_E" sysctl -qw net.ipv4.ip_forward=1
echo "# P <-> R restored at $(date +%T.%N | cut -c1-12)"
# shellcheck disable=SC2154
for r in 0 1; do
    eval "p=\$w$r"
    wait "$p" || fail "worker $r exited $?"
done
grep -q "summary:" "$TMP/w0.log" || fail "worker 0 printed no summary"
# who won: etcd's configuration names one primary; the other server stopped
cfg=$(ip netns exec "$NS_E" env ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$CP" get \
      /ps/part/group/0 --print-value-only 2>/dev/null)
echo "# group 0 in etcd: $cfg"
primary=$(echo "$cfg" | sed -n 's/.*"primary":\([0-9]\).*/\1/p')
epoch=$(echo "$cfg" | sed -n 's/.*"epoch":\([0-9]*\).*/\1/p')
[ -n "$primary" ] && [ "${epoch:-1}" -ge 2 ] || fail "etcd holds no later configuration: $cfg"
if [ "$primary" = 0 ]; then win=$PID_P lose=$PID_R wlog=p loser=r; else win=$PID_R lose=$PID_P wlog=r loser=p; fi
st=0
wait "$lose" || st=$?
[ "$st" -eq 1 ] || fail "the losing member ($loser) exited $st, not 1"
grep -q "this server stops (exit 1)" "$TMP/$loser.log" || fail "the loser did not say it stops"
kill -0 "$win" 2>/dev/null || fail "the winner ($wlog) is not running"
n_p=$(grep -c "is now the primary\|: primary; group" "$TMP/p.log" "$TMP/r.log" | awk -F: '{s+=$2} END {print s}')
echo "# member $primary is the primary at epoch $epoch; the other stopped; $n_p primary line(s) over both logs"
kill "$win" 2>/dev/null
wait "$win"
echo "PASS $name"
