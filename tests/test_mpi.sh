#!/bin/sh
# The shipped Open MPI script (examples/mpi/run.sh) under the real mpirun on
# this host (as root it adds --allow-run-as-root; --oversubscribe lets 3
# processes share 2 cores): sync with one server, async with two, and a
# SIGTERM to the script while it trains.  Each checks the workers' summaries
# (or their stop), every server's clean stop ('stopped:', a checkpoint
# written after 'stop requested', the files) and that no process is left.
# Prints one PASS/FAIL/SKIP line per case; SKIP with the reason where
# mpirun cannot run here.
#
#   PS_BIN_DIR   where ps_server and ps_worker are (default bin)
#   PS_TEST_KEEP keep the temp dir
set -u
ROOT=$(pwd -P)
BIN=$(cd "${PS_BIN_DIR:-bin}" 2>/dev/null && pwd -P) || BIN=$ROOT/bin
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_mpi.XXXXXX") || exit 1
CASES="mpi_sync mpi_async_two_servers mpi_sigterm"
SERVER=$T/bin/ps_server
. "$(dirname "$0")/engine_lib.sh"

# every process of a run has $T in its argv: mpirun (-x PS_TEST_DIR=$T),
# the programs (copied to $T/bin)
ours() { pgrep -f "$T"; }
cleanup() {
    pids=$(ours)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    [ -n "${PS_TEST_KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun (Debian: openmpi-bin)"
command -v python3 >/dev/null 2>&1 || skip_all "no python3"
for p in ps_server ps_worker; do
    [ -x "$BIN/$p" ] || skip_all "$BIN/$p not built"
done
mkdir -p "$T/bin"
cp "$BIN/ps_server" "$BIN/ps_worker" "$T/bin/"
# Open MPI's session directory in our own temp dir: two mpiruns of one user
# (another test run, a user's job) share /tmp/ompi.HOST.UID and can collide
# ("orte_session_dir failed ... File exists")
export OMPI_MCA_orte_tmpdir_base=$T
ROOTFLAG=""
[ "$(id -u)" -eq 0 ] && ROOTFLAG=--allow-run-as-root
if ! timeout 30 mpirun $ROOTFLAG --oversubscribe -np 2 true >"$T/probe.out" 2>&1; then
    skip_all "mpirun cannot start processes here: $(grep -v '^--*$' "$T/probe.out" | head -n 2 | tr '\n' ' ')"
fi

export PS_BIN_DIR=$T/bin PS_MPIRUN_ARGS="-x PS_TEST_DIR=$T"
TRAIN="--model mlp:784-64-10 --batch 32 --data synthetic:4096 --log-every 20"

# run NAME [VAR=value...]: examples/mpi/run.sh in the background with those
# variables; $rpid, $out
run() {
    name=$1
    shift
    out=$T/$name.out
    env PS_PORT="$(free_ports 2)" PS_CKPT_DIR="$T/ckpt-$name" "$@" \
        timeout 90 "$ROOT/examples/mpi/run.sh" >"$out" 2>&1 &
    rpid=$!
}

case=mpi_sync_run_finishes_and_its_server_checkpoints_the_last_update
why=""
run sync PS_MODE=sync "PS_TRAIN=$TRAIN --steps 60"
wait $rpid
rc=$?
[ "$rc" -eq 0 ] || why="exit status $rc"
has "$out" "run.sh: 1 host(s): 1 servers, 2 workers (cpu), sync" || why="$why; no 'run.sh: 1 host(s)' line"
add "$(summaries "$out" 2)"
add "$(servers_stopped "$out" "$T/ckpt-sync" 1 --num-workers 2 --mode sync --lr 0.05)"
done_case $case "$out"

case=mpi_async_run_over_two_servers_finishes_and_each_checkpoints_its_last_update
why=""
run async PS_MODE=async PS_NUM_SERVERS=2 "PS_TRAIN=$TRAIN --steps 60"
wait $rpid
rc=$?
[ "$rc" -eq 0 ] || why="exit status $rc"
grep -q "^run.sh: PS_SERVERS=tcp://127\.0\.0\.1:[0-9]*,tcp://127\.0\.0\.1:[0-9]*$" "$out" ||
    why="$why; no PS_SERVERS line with two servers"
add "$(summaries "$out" 2)"
add "$(servers_stopped "$out" "$T/ckpt-async" 2 --num-workers 2 --mode async --lr 0.05)"
done_case $case "$out"

# SIGTERM to the script: the workers stop (mpirun passes SIGTERM on to them),
# then the servers (SIGUSR1, passed on as it is) with a last checkpoint
case=mpi_sigterm_stops_the_workers_then_the_servers_with_a_last_checkpoint
why=""
run stop PS_MODE=async "PS_TRAIN=$TRAIN --epochs 100000"
if wait_for "$out" 'ps_worker\[1\] .* iter ' 60 $rpid && wait_for "$out" 'ps_worker\[0\] .* iter ' 30 $rpid; then
    kill -TERM "$(pgrep -P $rpid)"
    wait $rpid
    rc=$?
    [ "$rc" -ne 0 ] || why="exit status 0 after SIGTERM"
    has "$out" "run.sh: a signal: stopping the workers" || why="$why; run.sh did not say it had the signal"
    # mpirun merges the workers' output: one's line may land inside another's,
    # so count the words, not whole lines
    n=$(grep -o 'stopped by a signal after [0-9]* steps' "$out" | wc -l)
    [ "$n" -eq 2 ] || why="$why; $n of 2 workers stopped by the signal"
    add "$(servers_stopped "$out" "$T/ckpt-stop" 1 --num-workers 2 --mode async --lr 0.05)"
else
    why="the workers did not start training"
    kill -TERM "$(pgrep -P $rpid)" 2>/dev/null
    wait $rpid
fi
done_case $case "$out"

exit $failed
