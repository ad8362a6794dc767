#!/bin/sh
# multihost: training across simulated hosts on one machine, where the link
# and not the CPU should be the limit (`make bench` runs it; root only).
#
# Topology: every simulated host is a network namespace with one veth link
# to a bridge in a "switch" namespace of its own; each link is shaped in both
# directions with `tc qdisc ... tbf` (host side: what the host sends; switch
# side: what it receives) to the rate of the run (1, 10, 25 Gbit/s).  Each
# host also gets a /dev/shm of its own (a directory of the real one
# bind-mounted over /dev/shm for every process started there), so workers of
# one host share memory with each other and never with a server on another
# host.  Servers run on server hosts (one ps_server each), workers on worker
# hosts, all started with `ip netns exec`.  For every run it reports the
# samples/s of all workers (sum of their summary lines), the bytes each link
# carried (/sys/class/net/eth0/statistics in the host's namespace), the link
# utilisation (bytes x 8 / (rate x training time), the busier direction) and
# the CPU busy share of the machine (/proc/stat), and says which one limits
# the run.  Everything made (namespaces, links, shm directories, processes)
# is removed at exit, also on SIGINT/SIGTERM.
#
# Prints markdown tables and GOAL lines (bench/run.sh puts them in
# docs/BENCHMARKS.md) on stdout, progress on stderr; a "SKIP: ..." line and
# exit 0 where namespaces cannot be made (not root, no iproute2, no tbf).
#
#   --smoke          one server host, one worker host, 1 Gbit/s, a few steps:
#                    checks the set-up (tests/test_multihost.sh); PASS/FAIL line
#   --intro          print the section's introduction (bench/run.sh uses it)
# `make bench` runs it as its part "multihost" and writes the tables into
# docs/BENCHMARKS.md; `BENCH_ONLY=multihost make bench` refreshes only them.
#   MH_ONLY="dtype agg scale"   the parts to run (default all three)
#   MH_MLP_EPOCHS (1)  MH_CNN_STEPS (40)  MH_SCALE_STEPS (500)
#   MH_MLP_BATCH (16)  MH_CNN_BATCH (2)  MH_MODELS ("mlp cnn")
#   MH_CNN_ACC_EPOCHS (1; 0: no CNN accuracy runs)
#   MH_KEEP=1        keep the logs (their directory is printed)
#   PS_BIN_DIR (bin)
cd "$(dirname "$0")/.." || exit 1
BIN=${PS_BIN_DIR:-bin}
ONLY=${MH_ONLY:-"dtype agg scale"}
MLP_EPOCHS=${MH_MLP_EPOCHS:-1}
CNN_STEPS=${MH_CNN_STEPS:-40}
CNN_ACC_EPOCHS=${MH_CNN_ACC_EPOCHS:-1}
SCALE_STEPS=${MH_SCALE_STEPS:-500}
MLP_BATCH=${MH_MLP_BATCH:-16}
CNN_BATCH=${MH_CNN_BATCH:-2}
MODELS=${MH_MODELS:-"mlp cnn"}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || DATA=synthetic:60000
SMOKE=0
case "${1:-}" in
--smoke) SMOKE=1 ;;
--intro)
    cat <<'INTRO'
`bench/multihost.sh` (root): simulated hosts on this machine, each a network
namespace with its own /dev/shm, joined by veth pairs to a bridge; every
link is shaped in both directions with `tc tbf` to the rate shown (this
kernel has no netem).  Servers and workers run inside the namespaces, so
every payload crosses the shaped links (same-host shared memory cannot reach
across them).  Samples/s is the sum of the workers' own figures (their
training loop only); bytes are the kernel's counters of each host's
interface, the mean over worker hosts; link use is bytes x 8 / (rate x
training time) on the busiest link and direction; CPU busy is the whole
machine (2 cores here, shared by every simulated host) over the run.  All
ratios are between runs of the same invocation.
INTRO
    exit 0 ;;
"") ;;
*)
    echo "usage: bench/multihost.sh [--smoke | --intro]" >&2
    exit 2 ;;
esac

ID=$$
SW=psmh${ID}sw            # the switch namespace
BR=psbr0
NET=10.252.$((ID % 200)).
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ps_multihost.XXXXXX") || exit 1
HOSTS=""                  # host names made so far: s0 s1 w0 w1 ...
PIDS=""

say() { echo "multihost: $*" >&2; }

cleanup() {
    for h in $HOSTS; do
        for p in $(ip netns pids "psmh$ID$h" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    done
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    for h in $HOSTS; do ip netns del "psmh$ID$h" 2>/dev/null; done
    ip netns del "$SW" 2>/dev/null
    rm -rf /dev/shm/psmh-"$ID"-*
    if [ "${MH_KEEP:-0}" = 1 ]; then say "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'cleanup; trap - EXIT; exit 130' INT TERM

skip() {
    if [ "$SMOKE" = 1 ]; then echo "SKIP multihost_smoke_bf16_and_local_aggregate_cut_the_bytes: $1"; else
        echo "SKIP: skipped: $1"
        echo
        echo "GOAL multihost: skipped: $1"
    fi
    exit 0
}

[ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces"
command -v ip >/dev/null 2>&1 || skip "ip (iproute2) is not installed"
command -v tc >/dev/null 2>&1 || skip "tc (iproute2) is not installed"
for p in ps_server ps_worker; do
    [ -x "$BIN/$p" ] || { echo "multihost: $BIN/$p not found; run make first" >&2; exit 1; }
done
ip netns add "$SW" 2>"$WORK/err" || skip "cannot make a network namespace: $(cat "$WORK/err")"
ip -n "$SW" link add "$BR" type bridge 2>"$WORK/err" || skip "cannot make a bridge: $(cat "$WORK/err")"
ip -n "$SW" link set "$BR" up
ip -n "$SW" link set lo up

# add_host NAME INDEX: namespace, veth to the bridge, address NET(10+INDEX)
add_host() {
    _ns=psmh$ID$1
    ip netns add "$_ns" 2>"$WORK/err" || skip "cannot make a network namespace: $(cat "$WORK/err")"
    HOSTS="$HOSTS $1"
    # the host's end is eth0 inside its namespace; the switch's end is v<name>
    ip link add "psmh$ID$1" type veth peer name "v$1" 2>"$WORK/err" ||
        skip "cannot make a veth pair: $(cat "$WORK/err")"
    ip link set "psmh$ID$1" netns "$_ns" name eth0
    ip link set "v$1" netns "$SW"
    ip -n "$SW" link set "v$1" master "$BR" up
    ip -n "$_ns" addr add "$NET$((10 + $2))/24" dev eth0
    ip -n "$_ns" link set eth0 up
    ip -n "$_ns" link set lo up
    mkdir -p "/dev/shm/psmh-$ID-$1"
    eval "ADDR_$1=$NET$((10 + $2))"
}

# shape NAME MBIT: tbf on both ends of the host's link.  burst: 4 ms at the
# rate (a timer tick of HZ 250) and at least 256 KiB, so GSO packets pass;
# a queue of 20 ms.
shape() {
    _rate=$2
    _b=$(( _rate * 1000000 / 8 / 250 ))
    [ "$_b" -lt 262144 ] && _b=262144
    tc -n "psmh$ID$1" qdisc replace dev eth0 root tbf rate "${_rate}mbit" burst "$_b" \
        latency 20ms 2>"$WORK/err" &&
        tc -n "$SW" qdisc replace dev "v$1" root tbf rate "${_rate}mbit" burst "$_b" \
            latency 20ms 2>>"$WORK/err" || skip "tc tbf does not work here: $(cat "$WORK/err")"
}

# on NAME PROGRAM ARGS...: run in host NAME's namespace with its own /dev/shm
on() {
    _h=$1
    shift
    # exec: a caller's `on ... &` is then the program's own pid, for kill
    exec ip netns exec "psmh$ID$_h" sh -c 'mount --bind "$0" /dev/shm && exec "$@"' \
        "/dev/shm/psmh-$ID-$_h" "$@"
}

# link_bytes NAME: "tx rx" of the host's link since it was made
link_bytes() {
    ip netns exec "psmh$ID$1" sh -c \
        'echo $(cat /sys/class/net/eth0/statistics/tx_bytes) $(cat /sys/class/net/eth0/statistics/rx_bytes)'
}

# cpu_ticks: "busy total" jiffies of the whole machine
cpu_ticks() { awk '/^cpu / { b = $2 + $3 + $4 + $7 + $8; print b, b + $5 + $6 }' /proc/stat; }

# Which part a worker host's processes use, set per run by run_cfg.
have_flag() { "$BIN/$1" --help 2>&1 | grep -q -- "$2"; }

# run_cfg TAG MBIT SERVERS WHOSTS PER_HOST MODEL STEPS BATCH DTYPE AGG
#   SERVERS server hosts (s0..), WHOSTS worker hosts (w0..) with PER_HOST
#   workers each; STEPS: a number of steps, or eN for N epochs; DTYPE
#   f32|bf16|f16; AGG 1: --local-aggregate.  RUN_OPT (the optimizer flags,
#   default sgd 0.05) and RUN_DATA (default: the data set, synthetic for the
#   CNN) change what is trained.  Sets R_SPS R_TIME R_UTIL R_CPU R_LIMIT
#   R_ACC (worker 0's final test accuracy) R_WTX R_WRX (mean bytes per worker
#   host per direction), R_STX R_SRX (server hosts); non-zero on failure.
run_cfg() {
    _tag=$1 _mbit=$2 _ns=$3 _nh=$4 _per=$5 _model=$6 _steps=$7 _batch=$8 _dt=$9
    shift 9
    _agg=$1
    _W=$((_nh * _per))
    # the CNN's throughput on a small synthetic set: its evaluation at the
    # end (outside the measured loop) stays short
    _data=$DATA
    [ "$_model" = cnn ] && _data=synthetic:16384
    [ -n "${RUN_DATA:-}" ] && _data=$RUN_DATA
    _len="--steps $_steps --epochs 1000"
    case $_steps in e*) _len="--epochs ${_steps#e}" ;; esac
    _sw=$_W
    [ "$_agg" = 1 ] && _sw=$_nh
    for h in $HOSTS; do shape "$h" "$_mbit"; done
    _shared="--mode sync ${RUN_OPT:---optimizer sgd --lr 0.05}"
    [ "$_dt" != f32 ] && _shared="$_shared --wire-dtype $_dt"
    _eps="" _spids=""
    _i=0
    while [ "$_i" -lt "$_ns" ]; do
        eval "_a=\$ADDR_s$_i"
        _port=$((29700 + _i))
        # shellcheck disable=SC2086
        on "s$_i" "$BIN/ps_server" --bind "tcp://$_a:$_port" --rank "$_i" --num-servers "$_ns" \
            --num-workers "$_sw" $_shared >"$WORK/$_tag-server$_i.log" 2>&1 &
        _spids="$_spids $!"
        PIDS="$PIDS $!"
        _eps="${_eps:+$_eps,}tcp://$_a:$_port"
        _i=$((_i + 1))
    done
    sleep 0.3
    _before=""
    for h in $HOSTS; do _before="$_before $(link_bytes "$h")"; done
    _c0=$(cpu_ticks)
    _t0=$(date +%s.%N)
    _wpids=""
    _r=0
    _h=0
    while [ "$_h" -lt "$_nh" ]; do
        _l=0
        while [ "$_l" -lt "$_per" ]; do
            _lg=""
            [ "$_agg" = 1 ] && _lg="--local-aggregate $_per"
            # shellcheck disable=SC2086
            on "w$_h" "$BIN/ps_worker" --servers "$_eps" --rank "$_r" --num-workers "$_W" \
                $_shared --model "$_model" $_len --batch "$_batch" --threads 1 \
                --data "$_data" --log-every 1000000 $_lg \
                --request-timeout 30000 >"$WORK/$_tag-worker$_r.log" 2>&1 &
            _wpids="$_wpids $!"
            PIDS="$PIDS $!"
            _r=$((_r + 1))
            _l=$((_l + 1))
        done
        _h=$((_h + 1))
    done
    _bad=0
    for p in $_wpids; do wait "$p" || _bad=1; done
    _t1=$(date +%s.%N)
    _c1=$(cpu_ticks)
    _after=""
    for h in $HOSTS; do _after="$_after $(link_bytes "$h")"; done
    for p in $_spids; do kill -TERM "$p" 2>/dev/null; done
    for p in $_spids; do wait "$p" 2>/dev/null; done
    if [ "$_bad" = 1 ]; then
        say "$_tag: a worker failed; the end of its log:"
        for f in "$WORK/$_tag"-worker*.log; do tail -n 3 "$f" >&2; done
        return 1
    fi
    R_SPS=$(cat "$WORK/$_tag"-worker*.log | sed -n 's/.*summary: time [0-9.]* s, \([0-9.]*\) samples\/s per worker.*/\1/p' |
        awk '{ s += $1 } END { printf "%.0f", s }')
    R_TIME=$(cat "$WORK/$_tag"-worker*.log | sed -n 's/.*summary: time \([0-9.]*\) s.*/\1/p' |
        awk '$1 > m { m = $1 } END { print m + 0 }')
    R_ACC=$(sed -n 's/.*summary: .*test accuracy \([0-9.]*\).*/\1/p' "$WORK/$_tag-worker0.log")
    # per host: bytes sent and received during the run; the busiest direction
    # of any link sets the utilisation
    set -- $_before
    _bl="$*"
    set -- $_after
    R_WTX=0 R_WRX=0 R_STX=0 R_SRX=0 R_UTIL=0
    _k=1
    for h in $HOSTS; do
        _tx=$(( $(echo "$*" | cut -d' ' -f$_k) - $(echo "$_bl" | cut -d' ' -f$_k) ))
        _rx=$(( $(echo "$*" | cut -d' ' -f$((_k + 1))) - $(echo "$_bl" | cut -d' ' -f$((_k + 1))) ))
        _k=$((_k + 2))
        case $h in
            s*) [ "${h#s}" -lt "$_ns" ] || continue
                R_STX=$((R_STX + _tx / _ns)) R_SRX=$((R_SRX + _rx / _ns)) ;;
            w*) [ "${h#w}" -lt "$_nh" ] || continue
                R_WTX=$((R_WTX + _tx / _nh)) R_WRX=$((R_WRX + _rx / _nh)) ;;
        esac
        R_UTIL=$(awk -v tx="$_tx" -v rx="$_rx" -v u="$R_UTIL" -v m="$_mbit" -v t="$R_TIME" \
            'BEGIN { b = (tx > rx ? tx : rx); x = (t > 0 ? b * 8 / (m * 1e6 * t) : 0);
                     printf "%.2f", (x > u ? x : u) }')
    done
    R_CPU=$(echo "$_c0 $_c1" | awk '{ printf "%.0f", ($4 > $2 ? 100 * ($3 - $1) / ($4 - $2) : 0) }')
    R_LIMIT=$(awk -v u="$R_UTIL" -v c="$R_CPU" 'BEGIN {
        if (u >= 0.75) print "link"; else if (c >= 85) print "CPU"; else print "neither (waits)" }')
    say "$_tag: $R_SPS samples/s, ${R_TIME} s, accuracy ${R_ACC:-?}, worker link $R_WTX B out $R_WRX B in, util $R_UTIL, CPU $R_CPU%, $R_LIMIT-bound ($(awk -v a="$_t0" -v b="$_t1" 'BEGIN { printf "%.0f", b - a }') s wall)"
    return 0
}

mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }

# ---- smoke: the set-up works and tiny runs cross the shaped link ----
# 1 server host, 1 worker host with 2 workers: flat f32, flat bf16 and
# --local-aggregate 2 f32, 20 steps each; bf16 and the aggregation must each
# cut the bytes out of the worker host to at most 0.6 of the flat f32 run's.
if [ "$SMOKE" = 1 ]; then
    add_host s0 0
    add_host w0 1
    why=""
    RUN_DATA=synthetic:4096
    if run_cfg smoke-f32 1000 1 1 2 mlp:784-32-10 20 32 f32 0 && [ "$R_SPS" -gt 0 ] &&
        [ "$R_WTX" -gt 100000 ] && [ "$R_SRX" -gt 100000 ]; then
        flat=$R_WTX
        run_cfg smoke-bf16 1000 1 1 2 mlp:784-32-10 20 32 bf16 0 && [ "$R_SPS" -gt 0 ] ||
            why="$why the bf16 run failed;"
        bf=$R_WTX
        run_cfg smoke-agg 1000 1 1 2 mlp:784-32-10 20 32 f32 1 && [ "$R_SPS" -gt 0 ] ||
            why="$why the --local-aggregate run failed;"
        agg=$R_WTX
        rb=$(ratio "$bf" "$flat") ra=$(ratio "$agg" "$flat")
        ge 0.6 "$rb" || why="$why bf16 sent $rb of the f32 bytes;"
        ge 0.6 "$ra" || why="$why --local-aggregate 2 sent $ra of the bytes;"
        echo "# tbf 1 Gbit/s, 1 server host, 1 worker host x 2 workers, 20 steps: out of the worker host f32 $(mb "$flat") MiB, bf16 x $rb, --local-aggregate 2 x $ra"
    else
        why=" the f32 run through the namespaces failed or moved no bytes"
    fi
    if [ -z "$why" ]; then
        echo "PASS multihost_smoke_bf16_and_local_aggregate_cut_the_bytes"
        exit 0
    fi
    echo "FAIL multihost_smoke_bf16_and_local_aggregate_cut_the_bytes:$why"
    for f in "$WORK"/smoke-*.log; do echo "== $f"; tail -n 5 "$f"; done
    exit 1
fi

wanted() { case " $ONLY " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
add_host s0 0
add_host s1 1
NW=2
wanted scale && NW=4
_i=0
while [ "$_i" -lt "$NW" ]; do add_host "w$_i" $((2 + _i)); _i=$((_i + 1)); done
say "$(echo $HOSTS | wc -w) hosts in namespaces psmh$ID*, bridge $BR in $SW; data $DATA"

echo "multihost: simulated hosts (network namespaces, a bridge, tbf on both ends of every link)," \
     "sync, sgd, 1 thread per worker, $(nproc) cores" >&2
GOALS=""
goal() { GOALS="$GOALS
GOAL $*"; }
header() {
    echo "| run | link | samples/s (all workers) | training s | MiB out / in per worker host | link use (busiest) | CPU busy | test accuracy | limit |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
}
row() { # LABEL MBIT
    echo "| $1 | $(awk -v m="$2" 'BEGIN { printf "%g Gbit/s", m / 1000 }') | $R_SPS | $R_TIME | $(mb "$R_WTX") / $(mb "$R_WRX") | $R_UTIL | $R_CPU% | ${R_ACC:--} | $R_LIMIT |"
}
# points A B: |A - B| in percentage points
points() { awk -v a="$1" -v b="$2" 'BEGIN { d = 100 * (a - b); if (d < 0) d = -d; printf "%.2f", d }'; }

# ---- 1. narrower wire: f32 against bf16 at 1 Gbit/s ----
if wanted dtype; then
    if ! have_flag ps_worker --wire-dtype; then
        goal "multihost dtype: skipped: ps_worker has no --wire-dtype"
    else
        echo
        echo "### Wire dtype at 1 Gbit/s: 2 server hosts, 2 worker hosts x 2 workers"
        echo
        echo "Sync, the same seed and data order for f32 and bf16.  MLP: $MLP_EPOCHS epoch(s) of"
        echo "Fashion-MNIST, batch $MLP_BATCH per worker, sgd lr 0.05; its test accuracy"
        echo "is from the same runs.  CNN: $CNN_STEPS steps of batch $CNN_BATCH per worker (synthetic"
        echo "data: the samples/s only); its accuracy runs follow in the next table."
        echo
        header
        sp_ok=1 acc_ok=1 detail="" adetail=""
        for m in $MODELS; do
            if [ $m = mlp ]; then spec=mlp:784-256-128-10 st=e$MLP_EPOCHS b=$MLP_BATCH; else spec=cnn st=$CNN_STEPS b=$CNN_BATCH; fi
            run_cfg "$m-f32" 1000 2 2 2 "$spec" "$st" "$b" f32 0 || { sp_ok=0; continue; }
            f32=$R_SPS a32=$R_ACC
            # the aggregation part's baseline is this very run
            [ $m = mlp ] && MLP_F32_ROW="R_SPS=$R_SPS R_TIME=$R_TIME R_WTX=$R_WTX R_WRX=$R_WRX R_UTIL=$R_UTIL R_CPU=$R_CPU R_ACC=$R_ACC R_LIMIT='$R_LIMIT'"
            row "$spec batch $b, f32" 1000
            run_cfg "$m-bf16" 1000 2 2 2 "$spec" "$st" "$b" bf16 0 || { sp_ok=0; continue; }
            row "$spec batch $b, bf16" 1000
            r=$(ratio "$R_SPS" "$f32")
            detail="$detail${detail:+; }$m $r"
            ge "$r" 1.7 || sp_ok=0
            if [ $m = mlp ]; then
                d=$(points "$R_ACC" "$a32")
                adetail="$adetail${adetail:+; }mlp $a32 / $R_ACC ($d points)"
                ge 0.3 "$d" || acc_ok=0
            fi
        done
        case " $MODELS " in *" cnn "*) cnn_acc=1 ;; *) cnn_acc=0 ;; esac
        if [ "$cnn_acc" = 1 ] && [ "$CNN_ACC_EPOCHS" -gt 0 ]; then
            echo
            echo "CNN accuracy: 1 worker host x 2 workers, 1 server host, 10 Gbit/s (the link does"
            echo "not change the result), $CNN_ACC_EPOCHS epoch(s) of Fashion-MNIST, batch 32 per"
            echo "worker, adam lr 0.001 on the servers (bench/accuracy.sh's settings)."
            echo
            header
            RUN_OPT="--optimizer adam --lr 0.001" RUN_DATA=$DATA
            if run_cfg cnnacc-f32 10000 1 1 2 cnn "e$CNN_ACC_EPOCHS" 32 f32 0; then
                a32=$R_ACC
                row "cnn batch 32, f32" 10000
                if run_cfg cnnacc-bf16 10000 1 1 2 cnn "e$CNN_ACC_EPOCHS" 32 bf16 0; then
                    row "cnn batch 32, bf16" 10000
                    d=$(points "$R_ACC" "$a32")
                    adetail="$adetail${adetail:+; }cnn $a32 / $R_ACC ($d points)"
                    ge 0.3 "$d" || acc_ok=0
                else acc_ok=0; fi
            else acc_ok=0; fi
            unset RUN_OPT RUN_DATA
        fi
        echo
        if [ "$sp_ok" = 1 ]; then goal "multihost bf16/f32 samples/s at 1 Gbit/s >= 1.7 ($MODELS): MET ($detail)"
        else goal "multihost bf16/f32 samples/s at 1 Gbit/s >= 1.7 ($MODELS): MISSED ($detail)"; fi
        if [ "$acc_ok" = 1 ]; then goal "multihost bf16 test accuracy within 0.3 points of f32 after the same epochs: MET (f32 / bf16: $adetail)"
        else goal "multihost bf16 test accuracy within 0.3 points of f32 after the same epochs: MISSED (f32 / bf16: $adetail)"; fi
    fi
fi

# ---- 2. aggregation per host ----
if wanted agg; then
    if ! have_flag ps_worker --local-aggregate; then
        goal "multihost aggregation: skipped: ps_worker has no --local-aggregate"
    else
        echo
        echo "### Aggregation per host at 1 Gbit/s: 2 server hosts, 2 worker hosts x 2 workers, f32"
        echo
        echo "With --local-aggregate 2 the servers run with --num-workers 2 (hosts); the"
        echo "two workers of a host sum their gradients in shared memory and the first"
        echo "pushes the mean and shares the weights.  $MLP_EPOCHS epoch(s), sync, sgd lr 0.05."
        echo
        header
        # without it: the same run as the wire-dtype part's MLP f32 row, when
        # that ran (same flags), else run now
        if [ -n "${MLP_F32_ROW:-}" ]; then
            eval "$MLP_F32_ROW"
        else
            run_cfg agg-off 1000 2 2 2 mlp:784-256-128-10 "e$MLP_EPOCHS" "$MLP_BATCH" f32 0
        fi && off=$R_SPS offb=$R_WTX &&
            row "mlp:784-256-128-10 batch $MLP_BATCH, without --local-aggregate" 1000 &&
            run_cfg agg-on 1000 2 2 2 mlp:784-256-128-10 "e$MLP_EPOCHS" "$MLP_BATCH" f32 1 &&
            row "mlp:784-256-128-10 batch $MLP_BATCH, --local-aggregate 2" 1000
        if [ -n "${off:-}" ]; then
            r=$(ratio "$R_SPS" "$off")
            # bytes per step: each run did the same steps
            bb=$(ratio "$R_WTX" "$offb")
            echo
            if ge "$r" 1.6 && ge 0.55 "$bb"; then
                goal "multihost aggregation per host (2x2 at 1 Gbit/s): bytes out of each worker host x $bb (<= 0.55), samples/s x $r (>= 1.6): MET"
            else
                goal "multihost aggregation per host (2x2 at 1 Gbit/s): bytes out of each worker host x $bb (<= 0.55), samples/s x $r (>= 1.6): MISSED"
            fi
        fi
    fi
fi

# ---- 3. scaling at 10 Gbit/s ----
if wanted scale; then
    echo
    echo "### Scaling at 10 Gbit/s: 2 server hosts, 1..4 worker hosts x 1 worker, MLP 784-256-128-10, f32"
    echo
    echo "| worker hosts | samples/s | ideal (linear from 1) | / ideal | util | CPU busy | limit |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    one=0
    : >"$WORK/scale.dat"
    for n in 1 2 4; do
        run_cfg "scale$n" 10000 2 "$n" 1 mlp:784-256-128-10 "$SCALE_STEPS" 64 f32 0 || continue
        [ "$n" = 1 ] && one=$R_SPS
        ideal=$((one * n))
        echo "| $n | $R_SPS | $ideal | $(ratio "$R_SPS" "$ideal") | $R_UTIL | $R_CPU% | $R_LIMIT |"
        echo "$n $R_SPS $ideal" >>"$WORK/scale.dat"
    done
    if [ -s "$WORK/scale.dat" ]; then
        echo
        echo "Samples/s against worker hosts (# measured, . the rest of the ideal line):"
        echo
        echo '```'
        awk '{ n[NR] = $1; m[NR] = $2; id[NR] = $3; if ($3 > top) top = $3 }
             END { for (i = 1; i <= NR; i++) {
                       w = 60; a = int(w * m[i] / top + 0.5); b = int(w * id[i] / top + 0.5)
                       bar = ""; for (k = 0; k < b; k++) bar = bar (k < a ? "#" : ".")
                       for (k = b; k < a; k++) bar = bar "#"
                       printf "%d host%s |%-60s %6d of %d\n", n[i], (n[i] > 1 ? "s" : " "), bar, m[i], id[i] } }' \
            "$WORK/scale.dat"
        echo '```'
    fi
    if [ -n "${MH_PLOT:-}" ] && command -v gnuplot >/dev/null 2>&1 && [ -s "$WORK/scale.dat" ]; then
        gnuplot <<EOF 2>/dev/null
set terminal pngcairo size 640,420 noenhanced
set output "$MH_PLOT"
set title "Scaling at 10 Gbit/s (2 server hosts, 1 worker per host, MLP, sync)"
set xlabel "worker hosts"
set ylabel "samples/s, all workers"
set xtics (1, 2, 4)
set key top left
set grid
plot "$WORK/scale.dat" using 1:3 with linespoints title "ideal (linear from 1 host)", \
     "$WORK/scale.dat" using 1:2 with linespoints title "measured"
EOF
        [ -s "$MH_PLOT" ] && say "wrote $MH_PLOT"
    fi
    goal "multihost scaling at 10 Gbit/s (1, 2, 4 worker hosts): measured (no threshold; see the table for the limit)"
fi
echo "$GOALS" | sed '/^$/d'
