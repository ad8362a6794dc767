#!/bin/sh
# The shipped Slurm job scripts (examples/slurm/) under a real Slurm that
# this test sets up on this machine: munged with its own key and socket,
# slurmctld and two slurmd (`slurmd -N psn1`, `-N psn2`: two nodes on one
# host, at 127.0.0.1 and 127.0.0.2, each with its own port), one slurm.conf
# in a temp dir with its own free ports and state/spool directories, no
# cgroup plugins (proctrack/linuxproc, task/none), select/cons_tres.  Every
# daemon is stopped by PID at the end.  The cases:
#   - one_node.sbatch, sync: CPU workers under ps_launch, summaries, clean stop;
#   - one_node.sbatch, async, stopped as the time limit would
#     (scancel --batch --signal=TERM, what --signal=B:TERM@60 sends);
#   - multi_node.sbatch on 2 nodes, async: servers on psn1, workers on psn2;
#   - multi_node.sbatch on 1 node, sync: everything on it;
#   - multi_node.sbatch on 2 nodes beside, async, stopped as at the time limit.
# A clean stop: each server's 'stopped:' line, a checkpoint written after
# 'stop requested', the checkpoint files.  Prints one PASS/FAIL/SKIP line per
# case; SKIP with the reason where a daemon cannot start here.
#
#   PS_BIN_DIR   where ps_launch, ps_server, ps_worker are (default bin)
#   PS_TEST_KEEP keep the temp dir
set -u
ROOT=$(pwd -P)
BIN=$(cd "${PS_BIN_DIR:-bin}" 2>/dev/null && pwd -P) || BIN=$ROOT/bin
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_slurm.XXXXXX") || exit 1
chmod 755 "$T"
CASES="slurm_one_node_sync slurm_one_node_time_limit slurm_multi_node_async slurm_multi_node_on_one_node slurm_multi_node_time_limit"
DAEMONS=""
failed=0
export SLURM_CONF=$T/slurm.conf

# our job processes have $T in their argv (the programs are copied there);
# the daemons too, so they are left out
ours() {
    for p in $(pgrep -f "$T"); do
        case " $DAEMONS " in *" $p "*) ;; *) echo "$p" ;; esac
    done
}
stop_pid() { # PID: SIGTERM, then SIGKILL after 5 s
    kill "$1" 2>/dev/null || return 0
    i=0
    while kill -0 "$1" 2>/dev/null && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$1" 2>/dev/null
}
cleanup() {
    if [ -n "$DAEMONS" ]; then
        # jobs first: their step daemons outlive slurmd
        scancel --quiet --user="$(id -un)" 2>/dev/null
        i=0
        while [ -n "$(squeue --noheader 2>/dev/null)" ] && [ "$i" -lt 100 ]; do
            sleep 0.1
            i=$((i + 1))
        done
    fi
    pids=$(ours)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    for p in $DAEMONS; do stop_pid "$p"; done
    [ -n "${PS_TEST_KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

pass() { echo "PASS $1"; }
fail() {
    echo "FAIL $1: $2"
    failed=1
    if [ -n "${3:-}" ] && [ -f "$3" ]; then
        echo "---- $1: last lines of $3" >&2
        tail -n 40 "$3" >&2
    fi
}
skip_all() {
    for c in $CASES; do echo "SKIP $c: skipped: $1"; done
    exit 0
}
has() { grep -qF -- "$2" "$1"; }
# free_ports N: the first of N consecutive free TCP ports on 127.0.0.1
free_ports() {
    python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randint(20000, 60000 - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
        print(base)
        sys.exit(0)
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
sys.exit(1)
EOF
}

# ---------------------------------------------------------------- the cluster
[ "$(id -u)" -eq 0 ] || skip_all "slurmd must run as root to start jobs"
for p in munged slurmctld slurmd sbatch squeue scontrol scancel python3; do
    command -v $p >/dev/null 2>&1 || skip_all "no $p (Debian: slurm-wlm munge)"
done
for p in ps_launch ps_server ps_worker; do
    [ -x "$BIN/$p" ] || skip_all "$BIN/$p not built"
done
# the programs run from $T/bin, so every process of a job has $T in its argv
mkdir -p "$T/bin" "$T/munge" "$T/state" "$T/spool/psn1" "$T/spool/psn2" "$T/log"
cp "$BIN/ps_launch" "$BIN/ps_server" "$BIN/ps_worker" "$T/bin/"

chmod 700 "$T/munge"
dd if=/dev/urandom of="$T/munge/key" bs=1024 count=1 2>/dev/null
chmod 400 "$T/munge/key"
munged --foreground --force --socket="$T/munge/sock" --key-file="$T/munge/key" \
    --pid-file="$T/munge/pid" --seed-file="$T/munge/seed" --log-file="$T/log/munged.log" \
    >"$T/log/munged.out" 2>&1 &
DAEMONS="$!"

ports=$(free_ports 3) || skip_all "no free ports on 127.0.0.1"
cpus=$(nproc)
host=$(hostname)
cat >"$SLURM_CONF" <<EOF
ClusterName=pstest
SlurmctldHost=localhost
SlurmctldPort=$ports
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge/sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd-%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd-%n.log
PlugStackConfig=$T/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
ReturnToService=2
MailProg=/bin/true
KillWait=5
MinJobAge=600
NodeName=psn1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((ports + 1)) CPUs=$cpus
NodeName=psn2 NodeHostname=$host NodeAddr=127.0.0.2 Port=$((ports + 2)) CPUs=$cpus
PartitionName=pstest Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
: >"$T/plugstack.conf"
i=0
while [ ! -S "$T/munge/sock" ] && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ -S "$T/munge/sock" ] || skip_all "munged did not start: $(tail -n 1 "$T/log/munged.out")"
slurmctld -D -i -f "$SLURM_CONF" >"$T/log/slurmctld.out" 2>&1 &
DAEMONS="$DAEMONS $!"
for n in psn1 psn2; do
    slurmd -D -N $n -f "$SLURM_CONF" >"$T/log/slurmd-$n.out" 2>&1 &
    DAEMONS="$DAEMONS $!"
done
# both nodes idle, or why not
i=0
while [ "$(sinfo --noheader --format '%t' 2>/dev/null | tr -d '\n ')" != idle ] && [ "$i" -lt 150 ]; do
    for p in $DAEMONS; do
        kill -0 "$p" 2>/dev/null ||
            skip_all "a Slurm daemon exited: $(tail -q -n 1 "$T"/log/*.out | grep -i error | tail -n 1)"
    done
    sleep 0.1
    i=$((i + 1))
done
[ "$(sinfo --noheader --format '%t' | tr -d '\n ')" = idle ] ||
    skip_all "the two nodes did not come up: $(sinfo --noheader 2>&1 | head -n 2 | tr '\n' ' ')"
echo "# slurm: slurmctld on port $ports, slurmd psn1 (127.0.0.1:$((ports + 1))) and psn2 (127.0.0.2:$((ports + 2))), $cpus CPUs each"

# ---------------------------------------------------------------- jobs
# submit NAME SCRIPT SBATCH-FLAGS...: submit from $T with the environment
# set by the caller; $job is the id
submit() {
    name=$1 script=$2
    shift 2
    job=$(sbatch --parsable --chdir="$T" --output="$T/$name.out" "$@" "$ROOT/$script" 2>"$T/$name.err")
}
# job_state: JobState and ExitCode of $job
job_field() { scontrol show job -o "$job" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }
# finish SECONDS: wait for $job to end; 1 when it did not (or stayed
# pending for 15 s: then $pending says why)
finish() {
    i=0 pending=""
    while [ "$i" -lt $(($1 * 5)) ]; do
        case $(job_field JobState) in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;;
        PENDING) [ "$i" -ge 75 ] && pending=" (pending: $(job_field Reason))" && break ;;
        esac
        sleep 0.2
        i=$((i + 1))
    done
    scancel "$job"
    return 1
}
# wait_for FILE REGEX SECONDS: until FILE has a line matching REGEX
wait_for() {
    i=0 pending=""
    while [ "$i" -lt $(($3 * 10)) ]; do
        grep -Eq -- "$2" "$1" 2>/dev/null && return 0
        case $(job_field JobState) in
        PENDING) [ "$i" -ge 150 ] && pending=" (pending: $(job_field Reason))" && return 1 ;;
        RUNNING | CONFIGURING | "") ;;
        *) return 1 ;;
        esac
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# servers_stopped OUT CKPT N: N servers each printed stopped:, wrote a
# checkpoint after 'stop requested', and left its files; prints what is wrong
servers_stopped() {
    n=$(grep -c 'ps_server\[[0-9]*\] info .*stopped: ' "$1")
    [ "$n" -eq "$3" ] || echo "$n 'stopped:' lines, expected $3"
    r=0
    while [ "$r" -lt "$3" ]; do
        awk -v r="$r" 'index($0, "ps_server[" r "] ") && /stop requested/ { s = 1 }
             s && index($0, "ps_server[" r "] ") && /checkpoint [0-9]+ written/ { c = 1 }
             END { exit !c }' "$1" || echo "server $r wrote no checkpoint after 'stop requested'"
        ls "$2"/shard-$r-*.ckpt >/dev/null 2>&1 || echo "no checkpoint of server $r in $2"
        r=$((r + 1))
    done
}
# summaries OUT N: workers 0..N-1 printed their summary
summaries() {
    r=0
    while [ "$r" -lt "$2" ]; do
        grep -q "ps_worker\[$r\] info .*summary: " "$1" || echo "no summary from worker $r"
        r=$((r + 1))
    done
}
# no_leftovers: no process of a job runs any more (waits up to 5 s)
no_leftovers() {
    i=0
    while [ "$i" -lt 50 ]; do
        [ -z "$(ours)" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# done_case CASE WHY OUT
done_case() {
    no_leftovers || set -- "$1" "$2; left running: $(ours | head -n 3 | tr '\n' ' ')" "$3"
    w=$(printf '%s' "$2" | sed 's/^; //')
    if [ -z "$w" ]; then pass "$1"; else fail "$1" "$w" "$3"; fi
}
add() { [ -n "$1" ] && why="$why; $(echo "$1" | paste -sd';' -)"; }

TRAIN="--model mlp:784-64-10 --batch 32 --data synthetic:4096 --log-every 20"
LONG="$TRAIN --epochs 100000"
SHORT="$TRAIN --steps 60"
export PS_BIN_DIR=$T/bin

case=slurm_one_node_sync
why=""
out=$T/one-sync.out
PS_MODE=sync PS_TRAIN=$SHORT PS_CKPT_DIR=$T/ckpt-one-sync submit one-sync examples/slurm/one_node.sbatch
if [ -z "$job" ]; then
    why="sbatch refused the script: $(cat "$T/one-sync.err")"
elif ! finish 60; then
    why="job $job did not end within 60 s$pending"
else
    [ "$(job_field JobState) $(job_field ExitCode)" = "COMPLETED 0:0" ] ||
        why="job $job: $(job_field JobState) $(job_field ExitCode)"
    w=$(sed -n 's/^ps-1node: .* \([0-9]*\) workers, sync$/\1/p' "$out")
    [ -n "$w" ] || why="$why; no 'ps-1node: ...' line"
    grep -q "^ps_launch: done in .*: ${w:-?} workers finished (mode sync), 1 server stopped" "$out" ||
        why="$why; no ps_launch summary for $w workers"
    r=0
    while [ "$r" -lt "${w:-0}" ]; do
        grep -q "^\[worker $r\] .*summary: " "$out" || why="$why; no summary from worker $r"
        r=$((r + 1))
    done
    add "$(servers_stopped "$out" "$T/ckpt-one-sync" 1)"
fi
done_case $case "$why" "$out"

# the time limit's warning: --signal=B:TERM@60 sends SIGTERM to the batch
# shell only, as scancel --batch --signal=TERM does now
case=slurm_one_node_time_limit
why=""
out=$T/one-stop.out
PS_MODE=async PS_TRAIN=$LONG PS_CKPT_DIR=$T/ckpt-one-stop submit one-stop examples/slurm/one_node.sbatch
if [ -z "$job" ]; then
    why="sbatch refused the script: $(cat "$T/one-stop.err")"
elif ! wait_for "$out" '^\[worker 1\] .* iter ' 60; then
    why="the workers did not start training$pending"
    scancel "$job"
    finish 20
else
    scancel --batch --signal=TERM "$job"
    if ! finish 30; then
        why="job $job did not end within 30 s of SIGTERM"
    else
        [ "$(job_field ExitCode)" = "143:0" ] ||
            why="job $job: $(job_field JobState) $(job_field ExitCode), expected exit 143"
        has "$out" "ps_launch: got SIGTERM; sending SIGTERM" || why="$why; ps_launch did not get SIGTERM"
        has "$out" "sending SIGKILL" && why="$why; $(grep -m1 'sending SIGKILL' "$out")"
        add "$(servers_stopped "$out" "$T/ckpt-one-stop" 1)"
    fi
fi
done_case $case "$why" "$out"

case=slurm_multi_node_async
why=""
out=$T/multi.out
PS_MODE=async PS_PORT=$(free_ports 2) PS_TRAIN=$SHORT PS_CKPT_DIR=$T/ckpt-multi \
    submit multi examples/slurm/multi_node.sbatch --nodes=2
if [ -z "$job" ]; then
    why="sbatch refused the script: $(cat "$T/multi.err")"
elif ! finish 60; then
    why="job $job did not end within 60 s$pending"
else
    [ "$(job_field JobState) $(job_field ExitCode)" = "COMPLETED 0:0" ] ||
        why="job $job: $(job_field JobState) $(job_field ExitCode)"
    has "$out" "ps-train: 2 nodes (apart): 2 servers on psn1, 2 workers (cpu) on psn2, async" ||
        why="$why; not 2 servers on psn1 and 2 workers on psn2"
    grep -q "^ps-train: PS_SERVERS=tcp://127\.0\.0\.1:[0-9]*,tcp://127\.0\.0\.1:[0-9]*$" "$out" ||
        why="$why; PS_SERVERS is not psn1's address twice"
    grep -q "launch task StepId=$job\." "$T/log/slurmd-psn2.log" || why="$why; no step ran on psn2"
    add "$(summaries "$out" 2)"
    add "$(servers_stopped "$out" "$T/ckpt-multi" 2)"
fi
done_case $case "$why" "$out"

case=slurm_multi_node_on_one_node
why=""
out=$T/multi1.out
PS_MODE=sync PS_PORT=$(free_ports 2) PS_TRAIN=$SHORT PS_CKPT_DIR=$T/ckpt-multi1 \
    submit multi1 examples/slurm/multi_node.sbatch --nodes=1
if [ -z "$job" ]; then
    why="sbatch refused the script: $(cat "$T/multi1.err")"
elif ! finish 60; then
    why="job $job did not end within 60 s$pending"
else
    [ "$(job_field JobState) $(job_field ExitCode)" = "COMPLETED 0:0" ] ||
        why="job $job: $(job_field JobState) $(job_field ExitCode)"
    grep -q "^ps-train: 1 nodes (beside): 2 servers on psn[12], 2 workers (cpu) on psn[12], sync" "$out" ||
        why="$why; not everything on one node"
    add "$(summaries "$out" 2)"
    add "$(servers_stopped "$out" "$T/ckpt-multi1" 2)"
fi
done_case $case "$why" "$out"

case=slurm_multi_node_time_limit
why=""
out=$T/multi-stop.out
PS_MODE=async PS_LAYOUT=beside PS_SERVERS_PER_NODE=1 PS_PORT=$(free_ports 2) PS_TRAIN=$LONG \
    PS_CKPT_DIR=$T/ckpt-multi-stop submit multi-stop examples/slurm/multi_node.sbatch --nodes=2
if [ -z "$job" ]; then
    why="sbatch refused the script: $(cat "$T/multi-stop.err")"
elif ! wait_for "$out" 'ps_worker\[3\] .* iter ' 60; then
    why="the workers did not start training$pending"
    scancel "$job"
    finish 20
else
    scancel --batch --signal=TERM "$job"
    if ! finish 30; then
        why="job $job did not end within 30 s of SIGTERM"
    else
        [ "$(job_field ExitCode)" = "143:0" ] ||
            why="job $job: $(job_field JobState) $(job_field ExitCode), expected the workers' 143"
        grep -q "^ps-train: PS_SERVERS=tcp://127\.0\.0\.1:[0-9]*,tcp://127\.0\.0\.2:[0-9]*$" "$out" ||
            why="$why; PS_SERVERS is not one server at each node's address"
        n=$(grep -c 'ps_worker\[[0-3]\] warn .*stopped by a signal' "$out")
        [ "$n" -eq 4 ] || why="$why; $n of 4 workers stopped by the signal"
        add "$(servers_stopped "$out" "$T/ckpt-multi-stop" 2)"
    fi
fi
done_case $case "$why" "$out"

exit $failed
