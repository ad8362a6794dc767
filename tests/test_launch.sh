#!/bin/sh
# End-to-end tests of bin/ps_launch.  One "PASS name" / "FAIL name: why" /
# "SKIP name: why" line per case on stdout (tests/run.sh counts them);
# details of a failure go to stderr.  Every process is bounded by `timeout`,
# every file lives in one temp dir whose path is in every child's argv, so
# `pgrep -f $T` finds leftovers and the exit trap kills them.
#
#   PS_BIN_DIR   where ps_launch, ps_server, ps_worker are (default bin)
#   PS_TEST_KEEP keep the temp dir
#   PS_DATA      data for the training cases (default: Fashion-MNIST if
#                installed, else synthetic:4096)

ROOT=$(pwd -P)
BIN=$(cd "${PS_BIN_DIR:-bin}" 2>/dev/null && pwd -P) || BIN=$ROOT/bin
LAUNCH=$BIN/ps_launch
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_launch.XXXXXX") || exit 1
failed=0

kill_leftovers() {
    pids=$(pgrep -f "$T")
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
}
cleanup() {
    kill_leftovers
    [ -n "$PS_TEST_KEEP" ] || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

pass() { echo "PASS $1"; }
skip() { echo "SKIP $1: $2"; }
fail() {
    echo "FAIL $1: $2"
    failed=1
    if [ -n "$3" ] && [ -f "$3" ]; then
        echo "---- $1: last lines of $3" >&2
        tail -n 30 "$3" >&2
    fi
}
# has FILE FIXED-STRING: the file contains the string
has() { grep -qF -- "$2" "$1"; }
# wait_for FILE STRING SECONDS [PID]: until FILE contains STRING (gives up
# early when process PID has ended)
wait_for() {
    i=0
    while [ "$i" -lt $(($3 * 10)) ]; do
        has "$1" "$2" && return 0
        [ -n "$4" ] && ! kill -0 "$4" 2>/dev/null && return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# no_leftovers: nothing started from this test dir still runs (waits up to 3 s)
no_leftovers() {
    i=0
    while [ "$i" -lt 30 ]; do
        [ -z "$(pgrep -f "$T")" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

if [ ! -x "$LAUNCH" ]; then
    echo "FAIL launch_built: $LAUNCH not built"
    exit 1
fi

# ---------------------------------------------------------------- flags
case=launch_bad_flags_exit_2_with_a_message_naming_the_flag
why=""
check_bad() { # expected-message args...
    msg=$1
    shift
    timeout 10 "$LAUNCH" "$@" >"$T/bad.out" 2>&1
    rc=$?
    if [ "$rc" -ne 2 ]; then
        why="$why; '$*' exited $rc, expected 2"
    elif ! has "$T/bad.out" "$msg"; then
        why="$why; '$*' did not say \"$msg\" (said: $(head -c 200 "$T/bad.out"))"
    fi
}
check_bad "ps_launch: --workers must be an integer in [1, 1024], got '0'" --servers 1 --workers 0
check_bad "ps_launch: --servers must be an integer in [1, 256], got 'x'" --servers x --workers 2
check_bad "ps_launch: --workers is required" --servers 1
check_bad "ps_launch: --servers is required" --workers 1
check_bad "ps_launch: --mode must be sync or async, got 'bsp'" --servers 1 --workers 1 --mode bsp
check_bad "ps_launch: --gpus must be auto, none or a list" --servers 1 --workers 1 --gpus 0,one
check_bad "ps_launch: --server-threads must be an integer" --servers 1 --workers 1 --server-threads 0
check_bad "ps_launch: unknown flag '--model'" --servers 1 --workers 1 --model cnn
check_bad "ps_launch: --workers needs a value" --servers 1 --workers
check_bad "ps_launch: --rank is set by ps_launch" --servers 1 --workers 1 -- --rank 0
check_bad "ps_launch: --device is set by ps_launch" --servers 1 --workers 1 -- --device cpu
check_bad "conflicts with --timeline-dir" --servers 1 --workers 1 --timeline-dir "$T/x" -- --timeline a.json
check_bad "ps_launch: cannot read --hostfile" --hostfile "$T/no-such-hostfile"
printf 'h1 servers=two\n' >"$T/bad-hosts"
check_bad "servers= must be an integer" --hostfile "$T/bad-hosts"
printf 'h1 servers=1 workers=1 slots=4\n' >"$T/bad-hosts"
check_bad "expected servers=N, workers=M or gpus=G" --hostfile "$T/bad-hosts"
printf 'h1 servers=1 workers=2\n' >"$T/bad-hosts"
check_bad "disagree with the hostfile" --hostfile "$T/bad-hosts" --workers 3
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }"; fi

case=launch_help_lists_every_flag_and_version_prints_it
why=""
timeout 10 "$LAUNCH" --help >"$T/help.out" 2>&1 || why="--help exited $?"
for f in --servers --workers --gpus --mode --server-threads --timeline-dir --bin-dir \
    --hostfile --base-port --dry-run --version; do
    has "$T/help.out" "$f" || why="$why; --help does not mention $f"
done
has "$T/help.out" "e.g." || why="$why; --help has no example"
v=$(timeout 10 "$LAUNCH" --version 2>&1)
echo "$v" | grep -Eq '^ps_launch [0-9]+\.[0-9]+' || why="$why; --version printed '$v'"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }"; fi

# ---------------------------------------------------------------- plans
case=launch_dry_run_prints_the_exact_ssh_command_of_every_hostfile_process
why=""
cat >"$T/hosts" <<'EOF'
# two servers on h1, two GPU workers on h2, one of each on h3
h1 servers=2
alice@h2 workers=2 gpus=2   # user@host: ssh as alice, connect to h2
h3 servers=1 workers=1
EOF
(cd "$T" && timeout 10 "$LAUNCH" --hostfile hosts --dry-run --mode async --server-threads 2 \
    --base-port 30000 --bin-dir /opt/ps/bin --timeline-dir tl \
    -- --model cnn --lr 0.1 --optimizer momentum --log-csv 'w{rank}.csv' --eval-all) \
    >"$T/plan.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || why="exit status $rc"
SL="tcp://h1:30000,tcp://h1:30001,tcp://h3:30002"
for exp in \
    "ssh -o BatchMode=yes h1 'cd $T && mkdir -p tl && exec /opt/ps/bin/ps_launch --remote-child /opt/ps/bin/ps_server --bind \"tcp://*:30000\" --rank 0 --num-servers 3 --num-workers 3 --mode async --threads 2 --exit-on-stdin-eof --timeline tl/server-0.json --metrics-port 29401 --lr 0.1 --optimizer momentum'" \
    "ssh -o BatchMode=yes h1 'cd $T && mkdir -p tl && exec /opt/ps/bin/ps_launch --remote-child /opt/ps/bin/ps_server --bind \"tcp://*:30001\" --rank 1 --num-servers 3 --num-workers 3 --mode async --threads 2 --exit-on-stdin-eof --timeline tl/server-1.json --metrics-port 29402 --lr 0.1 --optimizer momentum'" \
    "ssh -o BatchMode=yes h3 'cd $T && mkdir -p tl && exec /opt/ps/bin/ps_launch --remote-child /opt/ps/bin/ps_server --bind \"tcp://*:30002\" --rank 2 --num-servers 3 --num-workers 3 --mode async --threads 2 --exit-on-stdin-eof --timeline tl/server-2.json --metrics-port 29403 --lr 0.1 --optimizer momentum'" \
    "ssh -o BatchMode=yes alice@h2 'cd $T && mkdir -p tl && exec /opt/ps/bin/ps_launch --remote-child env CUDA_VISIBLE_DEVICES=0 /opt/ps/bin/ps_worker --servers $SL --rank 0 --num-workers 3 --mode async --model cnn --lr 0.1 --optimizer momentum --log-csv w0.csv --eval-all --device cuda:0 --timeline tl/worker-0.json --metrics-port 29404'" \
    "ssh -o BatchMode=yes alice@h2 'cd $T && mkdir -p tl && exec /opt/ps/bin/ps_launch --remote-child env CUDA_VISIBLE_DEVICES=1 /opt/ps/bin/ps_worker --servers $SL --rank 1 --num-workers 3 --mode async --model cnn --lr 0.1 --optimizer momentum --log-csv w1.csv --eval-all --device cuda:0 --timeline tl/worker-1.json --metrics-port 29405'" \
    "ssh -o BatchMode=yes h3 'cd $T && mkdir -p tl && exec /opt/ps/bin/ps_launch --remote-child /opt/ps/bin/ps_worker --servers $SL --rank 2 --num-workers 3 --mode async --model cnn --lr 0.1 --optimizer momentum --log-csv w2.csv --eval-all --device cpu --timeline tl/worker-2.json --metrics-port 29406'"; do
    grep -qxF -- "$exp" "$T/plan.out" || why="$why; missing command: $exp"
done
n=$(grep -c '^ssh ' "$T/plan.out")
[ "$n" -eq 6 ] || why="$why; $n ssh commands, expected 6"
# default bin dir: relative to the working directory when below it
case "$BIN" in
"$ROOT"/*)
    rel=${BIN#"$ROOT"/}
    timeout 10 "$LAUNCH" --hostfile "$T/hosts" --dry-run -- --lr 0.1 >"$T/plan2.out" 2>&1
    has "$T/plan2.out" "&& exec $rel/ps_launch --remote-child $rel/ps_server --bind \"tcp://*:29500\" --rank 0" ||
        why="$why; default bin dir: no '&& exec $rel/ps_launch --remote-child $rel/ps_server' with base port 29500"
    ;;
esac
has "$T/plan.out" "--log-csv w0.csv" && ! has "$T/plan.out" "{rank}" ||
    why="$why; {rank} was not replaced"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/plan.out"; fi

case=launch_dry_run_gives_local_workers_the_gpus_round_robin_or_the_cpu
why=""
timeout 10 "$LAUNCH" --servers 2 --workers 3 --gpus 0,1 --dry-run -- --lr 0.1 >"$T/g.out" 2>&1 ||
    why="--gpus 0,1 exited $?"
for r in 0 1 2; do
    g=$((r % 2))
    grep -Eq "^CUDA_VISIBLE_DEVICES=$g .*/ps_worker --servers tcp://127\.0\.0\.1:[0-9]+,tcp://127\.0\.0\.1:[0-9]+ --rank $r --num-workers 3 --mode sync --lr 0\.1 --device cuda:0 --metrics-port [0-9]+\$" \
        "$T/g.out" || why="$why; worker $r not on GPU $g"
done
grep -Eq "/ps_server --bind tcp://127\.0\.0\.1:[0-9]+ --rank 1 --num-servers 2 --num-workers 3 --mode sync --threads 1 --metrics-port [0-9]+ --lr 0\.1\$" \
    "$T/g.out" || why="$why; server 1 command wrong"
p0=$(sed -n 's/.*ps_server --bind tcp:\/\/127.0.0.1:\([0-9]*\) --rank 0 .*/\1/p' "$T/g.out")
p1=$(sed -n 's/.*ps_server --bind tcp:\/\/127.0.0.1:\([0-9]*\) --rank 1 .*/\1/p' "$T/g.out")
[ -n "$p0" ] && [ "$p0" != "$p1" ] || why="$why; server ports '$p0' and '$p1' not distinct"
# auto follows CUDA_VISIBLE_DEVICES when a scheduler set it
CUDA_VISIBLE_DEVICES=5,7 timeout 10 "$LAUNCH" --servers 1 --workers 2 --dry-run >"$T/g2.out" 2>&1
grep -q '^CUDA_VISIBLE_DEVICES=7 .*--rank 1 .*--device cuda:0' "$T/g2.out" ||
    why="$why; auto did not use CUDA_VISIBLE_DEVICES=5,7"
CUDA_VISIBLE_DEVICES= timeout 10 "$LAUNCH" --servers 1 --workers 2 --dry-run >"$T/g3.out" 2>&1
has "$T/g3.out" "ps_launch: no GPU found, running 2 CPU workers" ||
    why="$why; no 'no GPU found' line with CUDA_VISIBLE_DEVICES empty"
timeout 10 "$LAUNCH" --servers 1 --workers 2 --gpus none --dry-run >"$T/g4.out" 2>&1
[ "$(grep -Ec -- '--device cpu --metrics-port [0-9]+$' "$T/g4.out")" -eq 2 ] || why="$why; --gpus none: not 2 CPU workers"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/g.out"; fi

# ---------------------------------------------------------------- supervision
# Stand-in programs: they show how ps_launch handles output, exits and
# signals whether or not the real ones are built.
mkdir -p "$T/fake"
cat >"$T/fake/ps_server" <<'EOF'
#!/bin/sh
trap 'echo "server got SIGTERM"; exit 0' TERM
echo "server args: $*"
echo "server stderr line" >&2
case " $* " in *" --fake-die "*) sleep 0.5; exit 4 ;; esac
while :; do sleep 0.1; done
EOF
cat >"$T/fake/ps_worker" <<'EOF'
#!/bin/sh
rank=-1 exit_rank=-1 code=0 hang=0
while [ $# -gt 0 ]; do
    case $1 in
    --rank) rank=$2; shift ;;
    --fake-exit) exit_rank=${2%:*}; code=${2#*:}; shift ;;
    --fake-hang) hang=1 ;;
    esac
    shift
done
echo "worker $rank started"
printf 'part'; sleep 0.2; printf 'ial line\n'
echo "worker $rank stderr" >&2
[ "$rank" = "$exit_rank" ] && exit "$code"
[ "$hang" = 1 ] && while :; do sleep 0.1; done
echo "ps_worker[$rank] info 00:00:00.000: summary: time 1.0 s, 100 samples/s per worker, test accuracy 0.5" >&2
printf 'last line without newline'
exit 0
EOF
chmod +x "$T/fake/ps_server" "$T/fake/ps_worker"
FAKE="--bin-dir $T/fake --gpus none"

# Bad values are refused with exit 2 before anything starts: stand-ins that
# leave a mark when run show that none ran.
case=launch_bad_values_start_nothing
why=""
mkdir -p "$T/mark"
for p in ps_server ps_worker; do
    printf '#!/bin/sh\ntouch "%s/mark/ran-$$"\nexit 0\n' "$T" >"$T/mark/$p"
    chmod +x "$T/mark/$p"
done
: >"$T/afile"
refused_early() { # expected-message args...
    msg=$1
    shift
    timeout 10 "$LAUNCH" --bin-dir "$T/mark" --gpus none "$@" >"$T/early.out" 2>&1
    rc=$?
    if [ "$rc" -ne 2 ]; then
        why="$why; '$*' exited $rc, expected 2"
    elif ! has "$T/early.out" "$msg"; then
        why="$why; '$*' did not say \"$msg\" (said: $(head -c 200 "$T/early.out"))"
    fi
    has "$T/early.out" "ps_launch: started" && why="$why; '$*' started processes"
    ls "$T/mark" | grep -q '^ran-' && why="$why; '$*' ran a program"
    rm -f "$T"/mark/ran-*
}
# ps_server --threads takes at most 64: ps_launch used to start the cluster
refused_early "ps_launch: --server-threads must be an integer in [1, 64], got '65'" \
    --servers 1 --workers 1 --server-threads 65
# worker flags that go to the servers too are checked first
refused_early "ps_launch: worker flag --lr must be a number in [0, 1e+06], got 'fast'" \
    --servers 1 --workers 2 -- --model mlp:784-10 --lr fast
refused_early "ps_launch: worker flag --optimizer must be one of sgd, momentum, nesterov, adagrad, adam, adamw, average, add, got 'rmsprop'" \
    --servers 1 --workers 1 -- --optimizer rmsprop
refused_early "ps_launch: worker flag --max-staleness must be 0 with --mode sync, got '2'" \
    --servers 1 --workers 1 -- --max-staleness 2
# output paths whose directory cannot be made
refused_early "ps_launch: --timeline-dir $T/afile/tl: cannot create the directory: Not a directory" \
    --servers 1 --workers 1 --timeline-dir "$T/afile/tl"
refused_early "ps_launch: --log-csv $T/afile/w.csv: cannot create the directory '$T/afile': Not a directory" \
    --servers 1 --workers 1 -- --log-csv "$T/afile/w.csv"
refused_early "ps_launch: --save $T/afile/sub/m.bin: cannot create the directory '$T/afile/sub'" \
    --servers 1 --workers 2 -- --save "$T/afile/sub/m.bin"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/early.out"; fi

case=launch_prefixes_every_line_and_exits_0_once_the_workers_finish
why=""
timeout 30 "$LAUNCH" --servers 2 --workers 2 $FAKE -- --lr 0.5 >"$T/f1.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || why="exit status $rc"
for l in "[server 0] server args: --bind tcp://127.0.0.1:" "[server 1] server stderr line" \
    "[worker 0] partial line" "[worker 1] partial line" "[worker 1] worker 1 stderr" \
    "[worker 0] last line without newline" "[server 0] server got SIGTERM" \
    "ps_launch: done in" "200 samples/s over all workers"; do
    has "$T/f1.out" "$l" || why="$why; no line '$l'"
done
grep -Eq -- "--num-servers 2 --num-workers 2 --mode sync --threads 1 --metrics-port [0-9]+ --lr 0\.5" "$T/f1.out" ||
    why="$why; servers did not get --lr 0.5"
grep -v '^\[server [01]\] \|^\[worker [01]\] \|^ps_launch: ' "$T/f1.out" >"$T/f1.other"
[ -s "$T/f1.other" ] && why="$why; unprefixed line: $(head -n 1 "$T/f1.other")"
no_leftovers || why="$why; processes left behind"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/f1.out"; fi

case=launch_serves_its_metrics_and_says_where_every_process_serves_its_own
why=""
# --metrics-bind among the worker flags goes to every process, ps_launch too
timeout 30 "$LAUNCH" --servers 1 --workers 2 $FAKE -- --metrics-bind 127.0.0.2 >"$T/m1.out" 2>&1 ||
    why="exit status $?"
for l in "ps_launch: metrics of ps_launch at http://127.0.0.2:" \
    "ps_launch: metrics of server 0 at http://127.0.0.2:" \
    "ps_launch: metrics of worker 1 at http://127.0.0.2:"; do
    has "$T/m1.out" "$l" || why="$why; no line '$l'"
done
grep -Eq -- "--metrics-port [0-9]+ --metrics-bind 127\.0\.0\.2" "$T/m1.out" ||
    why="$why; the server did not get its port and the bind"
timeout 30 "$LAUNCH" --servers 1 --workers 1 $FAKE --metrics-port off >"$T/m2.out" 2>&1 ||
    why="$why; --metrics-port off: exit status $?"
grep -q -- "metrics" "$T/m2.out" && why="$why; --metrics-port off still serves metrics"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/m1.out"; fi

case=launch_worker_exit_stops_all
why=""
timeout 30 "$LAUNCH" --servers 1 --workers 3 $FAKE -- --fake-exit 1:3 --fake-hang >"$T/f2.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || why="exit status $rc, expected 1"
grep -Eq '^ps_launch: worker 1 \(pid [0-9]+\) exited with status 3; stopping the others$' \
    "$T/f2.out" || why="$why; no line naming worker 1 and its status"
no_leftovers || why="$why; processes left behind"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/f2.out"; fi

case=launch_server_exit_stops_all
why=""
timeout 30 "$LAUNCH" --servers 2 --workers 1 $FAKE --server-arg --fake-die -- --fake-hang \
    >"$T/f3.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || why="exit status $rc, expected 1"
grep -Eq '^ps_launch: server [01] \(pid [0-9]+\) exited with status 4 before the workers finished; stopping the others$' \
    "$T/f3.out" || why="$why; no line naming the server"
no_leftovers || why="$why; processes left behind"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/f3.out"; fi

case=launch_sigterm_forwarded
why=""
timeout 30 "$LAUNCH" --servers 1 --workers 2 $FAKE -- --fake-hang >"$T/f4.out" 2>&1 &
tpid=$!
if wait_for "$T/f4.out" "[worker 1] partial line" 10 && wait_for "$T/f4.out" "[worker 0] partial line" 10; then
    lpid=$(pgrep -P "$tpid")
    kill -TERM "$lpid"
    wait "$tpid"
    rc=$?
    [ "$rc" -eq 143 ] || why="exit status $rc, expected 143"
    has "$T/f4.out" "[server 0] server got SIGTERM" || why="$why; server did not get SIGTERM"
else
    why="workers did not start"
    wait "$tpid"
fi
no_leftovers || why="$why; processes left behind"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/f4.out"; fi

case=launch_sigint_forwarded
why=""
timeout 30 "$LAUNCH" --servers 1 --workers 1 $FAKE -- --fake-hang >"$T/f5.out" 2>&1 &
tpid=$!
if wait_for "$T/f5.out" "[worker 0] partial line" 10; then
    kill -INT "$(pgrep -P "$tpid")"
    wait "$tpid"
    rc=$?
    [ "$rc" -eq 130 ] || why="exit status $rc, expected 130"
else
    why="worker did not start"
    wait "$tpid"
fi
no_leftovers || why="$why; processes left behind"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/f5.out"; fi
kill_leftovers

# --exec: any worker program, its settings in its environment
case=launch_exec_workers_get_their_settings_in_the_environment_and_a_failure_stops_all
why=""
cat >"$T/fake/exec_worker" <<'EOF'
#!/bin/sh
echo "args: $*"
env | grep -E '^PS_(DEVICE|LR|MAX_STALENESS|MODE|NUM_SERVERS|NUM_WORKERS|RANK|SERVERS)=' | sort | tr '\n' ' '
echo
[ "$PS_RANK" = 1 ] && [ "$1" = fail ] && exit 3
[ "$1" = fail ] && while :; do sleep 0.1; done
exit 0
EOF
chmod +x "$T/fake/exec_worker"
timeout 30 "$LAUNCH" --servers 1 --workers 2 $FAKE --mode async --lr 0.5 \
    --exec "$T/fake/exec_worker" --out 'w{rank}' >"$T/e1.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || why="exit status $rc"
for l in "[worker 1] args: --out w1" \
    "[worker 0] PS_DEVICE=cpu PS_LR=0.5 PS_MAX_STALENESS=-1 PS_MODE=async PS_NUM_SERVERS=1 PS_NUM_WORKERS=2 PS_RANK=0 PS_SERVERS=tcp://127.0.0.1:" \
    "ps_launch: done in"; do
    has "$T/e1.out" "$l" || why="$why; no line '$l'"
done
grep -Eq -- "--num-servers 1 --num-workers 2 --mode async --threads 1 --metrics-port [0-9]+ --lr 0\.5" \
    "$T/e1.out" || why="$why; the server did not get its flags and --metrics-port"
timeout 30 "$LAUNCH" --servers 1 --workers 2 $FAKE --exec "$T/fake/exec_worker" fail \
    >"$T/e2.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || why="$why; a failing --exec worker: exit status $rc, expected 1"
grep -Eq '^ps_launch: worker 1 \(pid [0-9]+\) exited with status 3; stopping the others$' \
    "$T/e2.out" || why="$why; no line naming worker 1 and its status"
timeout 10 "$LAUNCH" --servers 1 --workers 1 $FAKE --exec no-such-program-$$ >"$T/e3.out" 2>&1
rc=$?
[ "$rc" -eq 2 ] || why="$why; a missing --exec program: exit status $rc, expected 2"
has "$T/e3.out" "ps_launch: --exec: cannot run 'no-such-program-$$': not found in PATH" ||
    why="$why; no message for the missing program"
has "$T/e3.out" "ps_launch: started" && why="$why; started processes for a missing program"
no_leftovers || why="$why; processes left behind"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$T/e1.out"; fi
kill_leftovers

# ---------------------------------------------------------------- training
DATA=${PS_DATA:-}
if [ -z "$DATA" ]; then
    if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
        DATA=/usr/share/datasets/fashion-mnist
    else
        DATA=synthetic:4096
    fi
fi

missing=""
[ -x "$BIN/ps_worker" ] || missing="bin/ps_worker"
[ -x "$BIN/ps_server" ] || missing="${missing:+$missing and }bin/ps_server"

# json_events FILE NAME...: FILE is JSON trace events with every NAME
json_events() {
    python3 - "$@" <<'EOF'
import json, os, sys
path = sys.argv[1]
if not os.path.exists(path):
    print("%s: missing" % path)
    sys.exit(1)
try:
    d = json.load(open(path))
except Exception as e:
    print("%s: not JSON: %s" % (path, e))
    sys.exit(1)
ev = d.get("traceEvents", []) if isinstance(d, dict) else d
names = {e.get("name") for e in ev if isinstance(e, dict)}
missing = [n for n in sys.argv[2:] if n not in names]
if missing:
    print("%s: no %s events" % (path, ", ".join(missing)))
    sys.exit(1)
EOF
}

# started_pids FILE: the pids ps_launch reported starting
started_pids() { sed -n 's/^ps_launch: started [a-z]* [0-9]* (pid \([0-9]*\)).*/\1/p' "$1"; }
# pids_gone FILE: every process ps_launch started has ended
pids_gone() {
    for p in $(started_pids "$1"); do
        kill -0 "$p" 2>/dev/null && return 1
    done
    return 0
}

# check_csv FILE: prints what is wrong with a --log-csv file, nothing if fine
check_csv() {
    if [ ! -f "$1" ]; then
        echo "no CSV at $1"
        return
    fi
    awk -F, '
        NR == 1 { if ($0 != "time_s,epoch,iter,loss,samples_per_s,comm_wait_pct") bad = $0; next }
        NF >= 4 { n++; if (n == 1) first = $4; last = $4 }
        END {
            if (bad != "") { print "CSV header is \"" bad "\""; exit }
            if (n < 2) { print "CSV has " n + 0 " rows"; exit }
            if (!(last + 0 < first + 0)) print "loss did not fall: first " first ", last " last
        }' "$1"
}

# train MODE NAME [ps_launch flags...]: the small training run of these cases
train() {
    mode=$1 name=$2
    shift 2
    timeout 90 "$LAUNCH" --servers 1 --workers 2 --gpus none --mode "$mode" --bin-dir "$BIN" "$@" \
        -- --model mlp:784-64-10 --batch 32 --steps 300 --lr 0.05 --log-every 50 \
        --data "$DATA" --log-csv "$T/$name.csv" >"$T/$name.out" 2>&1
}

train_case() { # mode: exit 0, prefixed lines, the loss fell, nothing left running
    mode=$1
    case=launch_${mode}_run_trains_with_prefixed_lines_and_a_falling_loss
    if [ -n "$missing" ]; then
        skip $case "$missing not built"
        return
    fi
    out=$T/train-$mode.out
    train "$mode" "train-$mode"
    rc=$?
    why=""
    [ "$rc" -eq 0 ] || why="exit status $rc ($(grep '^ps_launch: failed' "$out" | tail -n 1))"
    for p in "[server 0] " "[worker 0] " "[worker 1] "; do
        awk -v p="$p" 'index($0, p) == 1 { f = 1 } END { exit !f }' "$out" ||
            why="$why; no line prefixed '$p'"
    done
    r=$(check_csv "$T/train-$mode.csv")
    [ -z "$r" ] || why="$why; $r"
    has "$out" "ps_launch: done in" || why="$why; no closing summary line"
    { no_leftovers && pids_gone "$out"; } || why="$why; processes left behind"
    if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi
    kill_leftovers
}

timeline_case() { # mode: --timeline-dir gives JSON traces with the named events
    mode=$1
    case=launch_timeline_dir_gives_${mode}_traces_with_the_named_events
    if [ -n "$missing" ]; then
        skip $case "$missing not built"
        return
    fi
    if ! command -v python3 >/dev/null 2>&1; then
        skip $case "python3 not found"
        return
    fi
    tl=$T/tl-$mode
    out=$T/timeline-$mode.out
    train "$mode" "timeline-$mode" --timeline-dir "$tl"
    rc=$?
    why=""
    [ "$rc" -eq 0 ] || why="exit status $rc ($(grep '^ps_launch: failed' "$out" | tail -n 1))"
    for w in 0 1; do
        r=$(json_events "$tl/worker-$w.json" forward backward push pull 2>&1) || why="$why; $r"
    done
    r=$(json_events "$tl/server-0.json" 2>&1) || why="$why; $r"
    { no_leftovers && pids_gone "$out"; } || why="$why; processes left behind"
    if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi
    kill_leftovers
}

train_case sync
train_case async
timeline_case sync
timeline_case async

# --log-csv into a directory that does not exist yet: ps_launch creates it
# before starting (the docs' first command, on a fresh checkout)
case=launch_creates_the_log_csv_directory_before_starting
if [ -n "$missing" ]; then
    skip $case "$missing not built"
else
    why=""
    out=$T/csvdir.out
    csv=$T/fresh/out/w0.csv
    timeout 90 "$LAUNCH" --servers 1 --workers 1 --gpus none --bin-dir "$BIN" \
        -- --model mlp:784-64-10 --batch 32 --steps 20 --lr 0.05 --log-every 10 \
        --data "$DATA" --log-csv "$csv" >"$out" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || why="exit status $rc ($(grep '^ps_launch: ' "$out" | tail -n 1))"
    if [ ! -f "$csv" ]; then
        why="$why; no CSV at $csv"
    else
        [ "$(head -n 1 "$csv")" = "time_s,epoch,iter,loss,samples_per_s,comm_wait_pct" ] ||
            why="$why; CSV header is '$(head -n 1 "$csv")'"
        [ "$(wc -l <"$csv")" -ge 2 ] || why="$why; CSV has no rows"
    fi
    { no_leftovers && pids_gone "$out"; } || why="$why; processes left behind"
    if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi
    kill_leftovers
fi

# --exec end to end against a real server: the C example reads PS_SERVERS,
# the server applies the --lr given to ps_launch (w1 = w0 - 0.5 g)
case=launch_exec_runs_the_c_example_against_servers_with_the_given_lr
PUSH_PULL=${BUILD:-build}/examples/push_pull
if [ -n "$missing" ] || [ ! -x "$PUSH_PULL" ]; then
    skip $case "${missing:-$PUSH_PULL} not built"
else
    why=""
    out=$T/exec-pp.out
    timeout 60 "$LAUNCH" --servers 1 --workers 1 --gpus none --mode sync --lr 0.5 \
        --bin-dir "$BIN" --exec "$PUSH_PULL" >"$out" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || why="exit status $rc ($(grep '^ps_launch: ' "$out" | tail -n 1))"
    has "$out" "[worker 0] w1: 0.75 1.875 3.5 3" || why="$why; no '[worker 0] w1: 0.75 1.875 3.5 3'"
    { no_leftovers && pids_gone "$out"; } || why="$why; processes left behind"
    if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi
    kill_leftovers
fi

case=launch_a_killed_worker_stops_the_run_naming_its_pid_and_signal
if [ -n "$missing" ]; then
    skip $case "$missing not built"
else
    why=""
    out=$T/kill.out
    timeout 60 "$LAUNCH" --servers 1 --workers 2 --gpus none --mode async --bin-dir "$BIN" \
        -- --model mlp:784-64-10 --batch 32 --epochs 100000 --lr 0.05 --log-every 20 \
        --data "$DATA" --log-csv "$T/kill-w{rank}.csv" >"$out" 2>&1 &
    tpid=$!
    # worker 1 is found by the unique path in its flags
    wpid=""
    if wait_for "$out" "[worker 1] " 30 "$tpid"; then
        sleep 1
        wpid=$(pgrep -f "$T/kill-w1.csv" | head -n 1)
    fi
    if [ -n "$wpid" ]; then
        spid=$(sed -n 's/^ps_launch: started worker 1 (pid \([0-9]*\)).*/\1/p' "$out")
        [ "$spid" = "$wpid" ] || why="ps_launch said worker 1 is pid '$spid', pgrep found $wpid"
        kill -9 "$wpid"
        wait "$tpid"
        rc=$?
        [ "$rc" -eq 1 ] || why="$why; exit status $rc, expected 1"
        grep -q "^ps_launch: worker 1 (pid $wpid) was killed by signal 9" "$out" ||
            why="$why; no line 'ps_launch: worker 1 (pid $wpid) was killed by signal 9'"
    else
        kill -TERM "$(pgrep -P "$tpid")" 2>/dev/null
        wait "$tpid"
        why="worker 1 did not start or ps_launch ended first ($(grep '^ps_launch: ' "$out" | tail -n 1))"
    fi
    { no_leftovers && pids_gone "$out"; } ||
        why="$why; processes left behind: $(pgrep -af "$T" | head -n 3)"
    if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi
    kill_leftovers
fi

# An elastic job (--workers 2:4): a killed worker is removed at once (its
# connection closed), the other three go on, and the new worker ps_launch
# starts joins the running job where it is; all exit 0.
case=launch_elastic_job_goes_on_without_a_killed_worker_and_its_replacement_joins
if [ -n "$missing" ]; then
    skip $case "$missing not built"
else
    why=""
    out=$T/elastic.out
    timeout 120 "$LAUNCH" --servers 1 --workers 2:4 --gpus none --mode sync --bin-dir "$BIN" \
        -- --model mlp:784-64-10 --batch 32 --epochs 1000 --steps 3000 --lr 0.05 \
        --log-every 500 --data "$DATA" --log-csv "$T/el-w{rank}.csv" >"$out" 2>&1 &
    tpid=$!
    wpid=""
    if wait_for "$out" "[worker 2] " 30 "$tpid" && wait_for "$out" "iter 500/" 60 "$tpid"; then
        wpid=$(pgrep -f "$T/el-w2.csv" | head -n 1)
    fi
    if [ -n "$wpid" ]; then
        kill -9 "$wpid"
        wait "$tpid"
        rc=$?
        [ "$rc" -eq 0 ] || why="exit status $rc, expected 0"
        has "$out" "worker 2's connection closed: removed; 3 members (min 2)" ||
            why="$why; the server did not remove worker 2 at once, leaving 3"
        grep -q "^ps_launch: worker 2 (pid $wpid) was killed by signal 9 (SIGKILL); started a new one" "$out" ||
            why="$why; ps_launch did not start a new worker 2"
        [ "$(grep -c 'worker 2 joins' "$out")" -eq 2 ] || why="$why; worker 2 did not join again"
        step=$(sed -n 's/.*\[worker 2\] .*joined the job at step \([0-9]*\)$/\1/p' "$out" | tail -n 1)
        [ -n "$step" ] && [ "$step" -gt 0 ] ||
            why="$why; the new worker 2 did not join the running job (step '$step')"
        grep -q "^\[worker 2\] .*this worker takes share 2 of [34] " "$out" ||
            why="$why; the new worker 2 did not take its share of the data"
        has "$out" "4 workers finished" || why="$why; not every worker finished"
    else
        kill -TERM "$(pgrep -P "$tpid")" 2>/dev/null
        wait "$tpid"
        why="worker 2 did not start or ps_launch ended first ($(grep '^ps_launch: ' "$out" | tail -n 1))"
    fi
    { no_leftovers && pids_gone "$out"; } ||
        why="$why; processes left behind: $(pgrep -af "$T" | head -n 3)"
    if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi
    kill_leftovers
fi

# An elastic job: SIGTERM to one worker makes it leave (LEAVE to the
# server, which removes it at once by its message, not by its connection's
# close or --worker-timeout), while the others go on and ps_launch starts a
# new one; the job ends with 0.
case=launch_elastic_sigterm_makes_a_worker_leave_the_job
if [ -n "$missing" ]; then
    skip $case "$missing not built"
else
    why=""
    out=$T/elastic_term.out
    timeout 120 "$LAUNCH" --servers 1 --workers 2:3 --gpus none --mode async --bin-dir "$BIN" \
        -- --model mlp:784-64-10 --batch 32 --epochs 1000 --steps 40000 --lr 0.05 \
        --log-every 200 --data "$DATA" --log-csv "$T/elt-w{rank}.csv" >"$out" 2>&1 &
    tpid=$!
    wpid=""
    i=0 # until worker 2 trains (it may start after the others)
    while [ "$i" -lt 600 ] && ! grep -F '[worker 2] ' "$out" 2>/dev/null | grep -qF ' iter '; do
        kill -0 "$tpid" 2>/dev/null || break
        sleep 0.1
        i=$((i + 1))
    done
    grep -F '[worker 2] ' "$out" | grep -qF ' iter ' && wpid=$(pgrep -f "$T/elt-w2.csv" | head -n 1)
    if [ -n "$wpid" ]; then
        kill -TERM "$wpid"
        wait "$tpid"
        rc=$?
        [ "$rc" -eq 0 ] || why="exit status $rc, expected 0"
        grep -q "^\[worker 2\] .*stopped by a signal: left the job at step [0-9]*$" "$out" ||
            why="$why; worker 2 did not say it left the job"
        # the first removal of worker 2 is its LEAVE's (the new worker 2
        # ps_launch starts is removed at the end by its connection's close)
        first=$(grep -E "worker 2 left: |worker 2's connection closed: removed" "$out" | head -n 1)
        case $first in
        *"worker 2 left: "*) ;;
        *) why="$why; the server did not remove worker 2 by its LEAVE first (${first:-nothing})" ;;
        esac
    else
        kill -TERM "$(pgrep -P "$tpid")" 2>/dev/null
        wait "$tpid"
        why="worker 2 did not start or ps_launch ended first ($(grep '^ps_launch: ' "$out" | tail -n 1))"
    fi
    { no_leftovers && pids_gone "$out"; } ||
        why="$why; processes left behind: $(pgrep -af "$T" | head -n 3)"
    if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi
    kill_leftovers
fi

# --elastic-servers: SIGUSR2 to ps_launch adds a server while training goes
# on (a new ps_server --added as slot 2, then ps_servers add moves its share
# to it), and `ps_servers remove 1` with the admin token ps_launch made takes
# server 1 out: its exit ends its part, the job goes on and ends with 0, and
# the token's private dir is gone.
case=launch_elastic_servers_sigusr2_adds_a_server_and_a_removed_one_leaves
if [ -n "$missing" ] || [ ! -x "$BIN/ps_servers" ]; then
    skip $case "${missing:-ps_servers} not built"
else
    why=""
    out=$T/grow.out
    TMPDIR=$T timeout 90 "$LAUNCH" --servers 2 --workers 2 --gpus none --mode async \
        --elastic-servers --bin-dir "$BIN" \
        -- --model mlp:784-64-10 --batch 32 --epochs 1000 --steps 30000 --lr 0.05 \
        --log-every 1000 --data "$DATA" --log-csv "$T/grow-w{rank}.csv" >"$out" 2>&1 &
    tpid=$!
    added=""
    if wait_for "$out" "[worker 1] " 30 "$tpid" && wait_for "$out" " iter 1000/" 60 "$tpid"; then
        kill -USR2 "$(pgrep -P "$tpid")"
        wait_for "$out" "ps_launch: server 2 (pid " 30 "$tpid" &&
            wait_for "$out" " added: added slot 2 (tcp://127.0.0.1:" 30 "$tpid" && added=1
    fi
    if [ -n "$added" ]; then
        token=$(sed -n 's/^ps_launch: --elastic-servers: .*admin token is \([^ ]*\) .*/\1/p' "$out")
        list=$(sed -n 's/^ps_launch: started server [01] (pid [0-9]*) at \(tcp:[^ ]*\)$/\1/p' "$out" |
            paste -sd, -)
        timeout 30 "$BIN/ps_servers" --servers "$list" --admin-token-file "$token" remove 1 \
            >"$T/grow-remove.out" 2>&1 || why="ps_servers remove 1 failed: $(cat "$T/grow-remove.out")"
        wait "$tpid"
        rc=$?
        [ "$rc" -eq 0 ] || why="$why; exit status $rc, expected 0"
        grep -q "^\[server 2\] .*joined the job as server slot 2 " "$out" ||
            why="$why; the added server did not join as slot 2"
        grep -q "^\[server 2\] .*--added" "$out" || why="$why; server 2 was not started --added"
        grep -q "^\[server 1\] .*removed from the job and every worker told: exiting" "$out" ||
            why="$why; server 1 did not say it was removed"
        grep -q "^ps_launch: server 1 (pid [0-9]*) left the job (removed" "$out" ||
            why="$why; ps_launch did not take server 1's exit as its leaving"
        has "$out" "all workers finished; stopping the servers" || why="$why; the workers did not finish"
        [ -z "$(ls -d "$T"/ps_launch.* 2>/dev/null)" ] ||
            why="$why; the admin token's dir was left: $(ls -d "$T"/ps_launch.*)"
        [ -n "$(check_csv "$T/grow-w0.csv")" ] && why="$why; worker 0: $(check_csv "$T/grow-w0.csv")"
    else
        kill -TERM "$(pgrep -P "$tpid")" 2>/dev/null
        wait "$tpid"
        why="no server was added ($(grep '^ps_launch: ' "$out" | tail -n 1))"
    fi
    { no_leftovers && pids_gone "$out"; } ||
        why="$why; processes left behind: $(pgrep -af "$T" | head -n 3)"
    if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi
    kill_leftovers
fi

# Ctrl-C or SIGTERM to ps_launch in the middle of a real sync run: every
# worker stops at once wherever it waits (no SIGKILL after the grace period),
# ps_launch exits 128+N and leaves nothing behind.
stop_case() { # SIGNAL WANTED-STATUS
    sig=$1 want=$2
    case=launch_sig$(echo "$sig" | tr "A-Z" "a-z")_stops_a_real_run_without_sigkill
    if [ -n "$missing" ]; then
        skip $case "$missing not built"
        return
    fi
    why=""
    out=$T/stop-$sig.out
    timeout 60 "$LAUNCH" --servers 1 --workers 2 --gpus none --mode sync --bin-dir "$BIN" \
        -- --model mlp:784-64-10 --batch 32 --epochs 100000 --lr 0.05 --log-every 20 \
        --data "$DATA" >"$out" 2>&1 &
    tpid=$!
    i=0
    while [ "$i" -lt 300 ] && ! grep -F '[worker 1] ' "$out" 2>/dev/null | grep -qF 'iter 40/'; do
        kill -0 "$tpid" 2>/dev/null || break
        sleep 0.1
        i=$((i + 1))
    done
    if grep -F '[worker 1] ' "$out" | grep -qF 'iter 40/'; then
        t0=$(date +%s%N)
        kill -"$sig" "$(pgrep -P "$tpid")"
        wait "$tpid"
        rc=$?
        ms=$(( ($(date +%s%N) - t0) / 1000000 ))
        [ "$rc" -eq "$want" ] || why="exit status $rc, expected $want"
        has "$out" "sending SIGKILL" && why="$why; $(grep -F 'sending SIGKILL' "$out" | head -n 1)"
        [ "$ms" -lt 4000 ] || why="$why; ps_launch took $ms ms to stop"
        echo "# ps_launch stopped by $sig in $ms ms"
    else
        kill -TERM "$(pgrep -P "$tpid")" 2>/dev/null
        wait "$tpid"
        why="the workers did not get to step 40 ($(grep '^ps_launch: ' "$out" | tail -n 1))"
    fi
    { no_leftovers && pids_gone "$out"; } ||
        why="$why; processes left behind: $(pgrep -af "$T" | head -n 3)"
    if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi
    kill_leftovers
}
stop_case TERM 143
stop_case INT 130

# --exec with a bare name: the file PATH gave it is said before anything runs
# (a python3 first on PATH is often not the one with the modules needed)
case=launch_exec_says_which_file_a_bare_program_name_is
out=$T/exec_bare.out
PATH="$T/pathdir:$PATH"
mkdir -p "$T/pathdir" && printf '#!/bin/sh\nexit 0\n' >"$T/pathdir/ps_fake_prog" &&
    chmod +x "$T/pathdir/ps_fake_prog"
timeout 60 "$LAUNCH" --servers 1 --workers 1 --exec ps_fake_prog >"$out" 2>&1
rc=$?
if [ "$rc" -eq 0 ] && has "$out" "ps_launch: --exec ps_fake_prog is $T/pathdir/ps_fake_prog (the first on PATH"; then
    pass $case
else
    fail $case "exit $rc; no line naming $T/pathdir/ps_fake_prog" "$out"
fi
kill_leftovers

exit $failed
