#!/bin/sh
# Servers and workers under Open MPI's mpirun (4.x): the processes do not use
# MPI; mpirun starts them where the allocation has room and tells each its
# rank (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK).  One mpirun of servers,
# one of workers (one per GPU, or CPU workers); the server list comes from
# where mpirun places the servers.  Run it from the repository (the same
# path on every host):
#
#   examples/mpi/run.sh                          # this host: 1 server, 2 CPU workers
#   PS_MODE=async examples/mpi/run.sh
#   PS_HOSTFILE=hosts examples/mpi/run.sh        # Open MPI hostfile: 'node1 slots=8'
#   salloc -N 3 examples/mpi/run.sh              # mpirun finds a Slurm/PBS allocation
#
# PS_MODE sync|async (sync), PS_NUM_SERVERS (1; round-robin over the hosts),
# PS_GPUS_PER_HOST (the GPUs nvidia-smi lists here), PS_CPU_WORKERS_PER_HOST
# (2, without GPUs), PS_PORT (29500: server i listens on PS_PORT + i),
# PS_OPT (the flags servers and workers share: --lr 0.05), PS_TRAIN
# (ps_worker's flags: --model cnn --epochs 5), PS_CKPT_DIR (ckpt/mpi-PID,
# removed after a run that succeeded),
# PS_HOSTFILE or PS_HOSTS (mpirun --hostfile / -H), PS_MPIRUN_ARGS (more
# mpirun flags), PS_BIN_DIR (bin).
# As root mpirun needs --allow-run-as-root (added here).  Stopping: SIGTERM or
# SIGINT to this script stops the workers (mpirun: SIGTERM to them), then the
# servers with SIGUSR1, which mpirun passes on as it is (on SIGTERM it would
# SIGKILL them a second later) and ps_server takes as a stop: last checkpoint,
# 'stopped:' line.  Exits with the workers' mpirun status.
set -u
MODE=${PS_MODE:-sync}
S=${PS_NUM_SERVERS:-1}
PORT=${PS_PORT:-29500}
OPT=${PS_OPT:---lr 0.05}
TRAIN=${PS_TRAIN:---model cnn --epochs 5}
CKPT=${PS_CKPT_DIR:-ckpt/mpi-$$}
BIN=${PS_BIN_DIR:-bin}
GPUS=${PS_GPUS_PER_HOST:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}

MPIRUN="mpirun --oversubscribe"
[ "$(id -u)" -eq 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
local=1
if [ -n "${PS_HOSTFILE:-}" ]; then
    MPIRUN="$MPIRUN --hostfile $PS_HOSTFILE" local=""
elif [ -n "${PS_HOSTS:-}" ]; then
    MPIRUN="$MPIRUN -H $PS_HOSTS" local=""
elif [ -n "${SLURM_JOB_ID:-}${PBS_NODEFILE:-}${LSB_HOSTS:-}" ]; then
    local="" # mpirun takes the hosts from the allocation
fi
MPIRUN="$MPIRUN ${PS_MPIRUN_ARGS:-}"

# the hosts, in mpirun's order; --map-by node puts server r on host r mod H
hosts=$($MPIRUN --map-by ppr:1:node sh -c 'echo "$OMPI_COMM_WORLD_RANK $(hostname)"' |
    sort -n | cut -d' ' -f2)
[ -n "$hosts" ] || { echo "run.sh: mpirun could not start on the hosts" >&2; exit 1; }
nhosts=$(echo "$hosts" | wc -l)
PS_SERVERS=$(r=0
    while [ $r -lt "$S" ]; do
        h=$(echo "$hosts" | sed -n "$((r % nhosts + 1))p")
        [ -n "$local" ] && h=127.0.0.1 # one host: the loopback is enough
        printf 'tcp://%s:%d\n' "$h" $((PORT + r))
        r=$((r + 1))
    done | paste -sd, -)
if [ "$GPUS" -gt 0 ]; then
    WPH=$GPUS
else
    WPH=${PS_CPU_WORKERS_PER_HOST:-2}
fi
W=$((WPH * nhosts))
export PS_SERVERS MODE PORT W S OPT TRAIN CKPT BIN GPUS
echo "run.sh: $nhosts host(s): $S servers, $W workers ($([ "$GPUS" -gt 0 ] && echo "$GPUS GPUs per host" || echo cpu)), $MODE"
echo "run.sh: PS_SERVERS=$PS_SERVERS"
FWD="-x PS_SERVERS -x MODE -x PORT -x W -x OPT -x TRAIN -x CKPT -x BIN -x GPUS"

# servers: each binds PORT + its rank
$MPIRUN -np "$S" --map-by node $FWD \
    sh -c 'exec "$BIN/ps_server" --bind "tcp://*:$((PORT + OMPI_COMM_WORLD_RANK))" \
        --rank "$OMPI_COMM_WORLD_RANK" --num-servers "$OMPI_COMM_WORLD_SIZE" --num-workers "$W" \
        --mode "$MODE" --checkpoint-dir "$CKPT" $OPT' &
servers=$!

# workers: rank and count from OMPI_COMM_WORLD_*, servers from PS_SERVERS;
# GPU = local rank
workers=""
trap '[ -n "$workers" ] && echo "run.sh: a signal: stopping the workers (mpirun $workers), then the servers" >&2 && kill -TERM $workers' TERM INT
$MPIRUN -np "$W" --map-by "ppr:$WPH:node" $FWD \
    sh -c 'if [ "$GPUS" -gt 0 ]; then
            export CUDA_VISIBLE_DEVICES=$((OMPI_COMM_WORLD_LOCAL_RANK % GPUS)) && set -- cuda:0
        else
            set -- cpu
        fi
        exec "$BIN/ps_worker" --mode "$MODE" --device "$1" $OPT $TRAIN' &
workers=$!
# servers that end early (a port taken, a crash) stop the workers
(while kill -0 $servers 2>/dev/null; do sleep 1; done; kill -TERM $workers 2>/dev/null) &
watchdog=$!
wait $workers
status=$?
while kill -0 $workers 2>/dev/null; do # a trapped signal ended the wait early
    wait $workers
    status=$?
done

kill $watchdog 2>/dev/null
kill -USR1 $servers 2>/dev/null
wait $servers
# checkpoints under a PID no later run restores: kept only when it failed
if [ -z "${PS_CKPT_DIR:-}" ]; then
    if [ "$status" -eq 0 ]; then rm -rf "$CKPT"; else echo "run.sh: checkpoints kept in $CKPT" >&2; fi
fi
exit $status
