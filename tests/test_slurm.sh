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
SERVER=$T/bin/ps_server
export SLURM_CONF=$T/slurm.conf
. "$(dirname "$0")/engine_lib.sh"

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
# job_field NAME: a field of `scontrol show job` for $job
job_field() { scontrol show job -o "$job" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }
# finish SECONDS: wait for $job to end; 1 when it did not (or stayed pending
# for 15 s), with why set, and the job cancelled
finish() {
    i=0
    while [ "$i" -lt $(($1 * 5)) ]; do
        case $(job_field JobState) in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;;
        PENDING) [ "$i" -ge 75 ] && break ;;
        esac
        sleep 0.2
        i=$((i + 1))
    done
    why="$why; job $job did not end within $1 s ($(job_field JobState) $(job_field Reason))"
    scancel "$job"
    return 1
}
# submit NAME SCRIPT SBATCH-FLAGS...: submit SCRIPT from $T with the
# environment the caller set, output in $out; $job is the id (empty, with
# why set, when sbatch refused it)
submit() {
    out=$T/$1.out
    script=$2
    shift 2
    job=$(sbatch --parsable --chdir="$T" --output="$out" "$@" "$ROOT/$script" 2>"$out.err")
    [ -n "$job" ] || why="sbatch refused $script: $(cat "$out.err")"
    [ -n "$job" ]
}
# run_job NAME SCRIPT SBATCH-FLAGS...: submit and wait for the end; 0 when
# the job completed with exit 0, else why says how it ended
run_job() {
    submit "$@" && finish 60 || return 1
    [ "$(job_field JobState) $(job_field ExitCode)" = "COMPLETED 0:0" ] && return 0
    why="$why; job $job: $(job_field JobState) $(job_field ExitCode)"
    return 1
}
# stop_at_time_limit REGEX: once $out has a line matching REGEX (training
# runs), SIGTERM to the batch shell, as --signal=B:TERM@60 sends it; 0 when
# the job then ended with exit 143 within 30 s
stop_at_time_limit() {
    i=0
    until grep -Eq -- "$1" "$out" 2>/dev/null; do
        i=$((i + 1))
        case $(job_field JobState) in PENDING | RUNNING | CONFIGURING) ;; *) i=600 ;; esac
        if [ "$i" -ge 600 ]; then
            why="$why; the workers did not start training ($(job_field JobState))"
            scancel "$job"
            finish 20
            return 1
        fi
        sleep 0.1
    done
    scancel --batch --signal=TERM "$job"
    finish 30 || return 1
    [ "$(job_field ExitCode)" = "143:0" ] && return 0
    why="$why; job $job: $(job_field JobState) $(job_field ExitCode), expected exit 143"
    return 1
}

TRAIN="--model mlp:784-64-10 --batch 32 --data synthetic:4096 --log-every 20"
LONG="$TRAIN --epochs 100000"
SHORT="$TRAIN --steps 60"
export PS_BIN_DIR=$T/bin

case=slurm_one_node_sync_job_finishes_and_its_server_checkpoints_the_last_update
why=""
if PS_MODE=sync PS_TRAIN=$SHORT PS_CKPT_DIR=$T/ckpt-one-sync \
    run_job one-sync examples/slurm/one_node.sbatch; then
    w=$(sed -n 's/^ps-1node: .* \([0-9]*\) workers, sync$/\1/p' "$out")
    [ -n "$w" ] || why="$why; no 'ps-1node: ...' line"
    grep -q "^ps_launch: done in .*: ${w:-?} workers finished (mode sync), 1 server stopped" "$out" ||
        why="$why; no ps_launch summary for $w workers"
    add "$(summaries "$out" "${w:-0}")"
    add "$(servers_stopped "$out" "$T/ckpt-one-sync" 1 --num-workers "${w:-0}" --mode sync --lr 0.05)"
fi
done_case $case "$out"

# the time limit's warning: --signal=B:TERM@60 sends SIGTERM to the batch
# shell only, as scancel --batch --signal=TERM does now
case=slurm_time_limit_signal_stops_a_one_node_job_with_143_and_a_last_checkpoint
why=""
if PS_MODE=async PS_TRAIN=$LONG PS_CKPT_DIR=$T/ckpt-one-stop \
    submit one-stop examples/slurm/one_node.sbatch && stop_at_time_limit '^\[worker 1\] .* iter '; then
    has "$out" "ps_launch: got SIGTERM; sending SIGTERM" || why="$why; ps_launch did not get SIGTERM"
    has "$out" "sending SIGKILL" && why="$why; $(grep -m1 'sending SIGKILL' "$out")"
    w=$(sed -n 's/^ps-1node: .* \([0-9]*\) workers, async$/\1/p' "$out")
    add "$(servers_stopped "$out" "$T/ckpt-one-stop" 1 --num-workers "${w:-0}" --mode async --lr 0.05)"
fi
done_case $case "$out"

case=slurm_two_node_job_runs_servers_and_workers_apart_and_finishes
why=""
# with metrics: servers at MP, MP+1 on psn1, workers at MP+100, MP+101 on psn2
MP=$(free_ports 102)
if PS_MODE=async PS_PORT=$(free_ports 2) PS_TRAIN=$SHORT PS_CKPT_DIR=$T/ckpt-multi \
    PS_METRICS_PORT=$MP PS_METRICS_TARGETS=$T/targets.json \
    run_job multi examples/slurm/multi_node.sbatch --nodes=2; then
    has "$out" "ps-train: metrics targets in $T/targets.json" || why="$why; no targets file"
    python3 - "$T/targets.json" "$MP" "$job" <<'PY' || why="$why; targets file wrong"
import json, sys
t, mp, job = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
want = [("127.0.0.1:%d" % mp, "server", "0"), ("127.0.0.1:%d" % (mp + 1), "server", "1"),
        ("127.0.0.2:%d" % (mp + 100), "worker", "0"), ("127.0.0.2:%d" % (mp + 101), "worker", "1")]
got = [(g["targets"][0], g["labels"]["role"], g["labels"]["ps_rank"]) for g in t]
assert got == want and all(g["labels"]["ps_job"] == job for g in t), (got, want)
PY
    for r in 0 1; do
        grep -q "ps_server\[$r\] info .*metrics: http://0.0.0.0:$((MP + r))/metrics" "$out" ||
            why="$why; server $r did not serve metrics at $((MP + r))"
    done
    grep -Eq "ps_worker\[[01]\] info .*metrics: http://0.0.0.0:$((MP + 100))/metrics" "$out" &&
        grep -Eq "ps_worker\[[01]\] info .*metrics: http://0.0.0.0:$((MP + 101))/metrics" "$out" ||
        why="$why; the workers did not serve metrics at $((MP + 100)) and $((MP + 101))"

    has "$out" "ps-train: 2 nodes (apart): 2 servers on psn1, 2 workers (cpu) on psn2, async" ||
        why="$why; not 2 servers on psn1 and 2 workers on psn2"
    grep -q "^ps-train: PS_SERVERS=tcp://127\.0\.0\.1:[0-9]*,tcp://127\.0\.0\.1:[0-9]*$" "$out" ||
        why="$why; PS_SERVERS is not psn1's address twice"
    grep -q "launch task StepId=$job\." "$T/log/slurmd-psn2.log" || why="$why; no step ran on psn2"
    add "$(summaries "$out" 2)"
    add "$(servers_stopped "$out" "$T/ckpt-multi" 2 --num-workers 2 --mode async --lr 0.05)"
fi
done_case $case "$out"

case=slurm_multi_node_job_on_one_node_runs_everything_beside_and_finishes
why=""
if PS_MODE=sync PS_PORT=$(free_ports 2) PS_TRAIN=$SHORT PS_CKPT_DIR=$T/ckpt-multi1 \
    run_job multi1 examples/slurm/multi_node.sbatch --nodes=1; then
    grep -q "^ps-train: 1 nodes (beside): 2 servers on psn[12], 2 workers (cpu) on psn[12], sync" "$out" ||
        why="$why; not everything on one node"
    add "$(summaries "$out" 2)"
    add "$(servers_stopped "$out" "$T/ckpt-multi1" 2 --num-workers 2 --mode sync --lr 0.05)"
fi
done_case $case "$out"

case=slurm_time_limit_signal_stops_every_worker_of_a_two_node_job_with_a_last_checkpoint
why=""
if PS_MODE=async PS_LAYOUT=beside PS_SERVERS_PER_NODE=1 PS_PORT=$(free_ports 2) PS_TRAIN=$LONG \
    PS_CKPT_DIR=$T/ckpt-multi-stop submit multi-stop examples/slurm/multi_node.sbatch --nodes=2 &&
    stop_at_time_limit 'ps_worker\[3\] .* iter '; then
    grep -q "^ps-train: PS_SERVERS=tcp://127\.0\.0\.1:[0-9]*,tcp://127\.0\.0\.2:[0-9]*$" "$out" ||
        why="$why; PS_SERVERS is not one server at each node's address"
    n=$(grep -c 'ps_worker\[[0-3]\] warn .*stopped by a signal' "$out")
    [ "$n" -eq 4 ] || why="$why; $n of 4 workers stopped by the signal"
    add "$(servers_stopped "$out" "$T/ckpt-multi-stop" 2 --num-workers 4 --mode async --lr 0.05)"
fi
done_case $case "$out"

exit $failed
