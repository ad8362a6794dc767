#!/bin/sh
# profile_torch: where the CPU goes when ps.torch trains the CNN: one run of
# 1 ps_server x 2 workers (examples/torch_fashion_mnist.py, async, 1 torch
# thread), `perf record` attached to the three processes while the workers
# are in their training loop, then every sample sorted by process, thread
# (a worker's training thread, its other threads: libps's comm thread and
# ZeroMQ's I/O thread) and library.  Prints a markdown table; a note instead
# when perf cannot record.
#   PS_BIN_DIR (bin)  PROFILE_STEPS (40)  TORCH_DATA
cd "$(dirname "$0")/.." || exit 1
BIN=${PS_BIN_DIR:-bin}
STEPS=${PROFILE_STEPS:-40}
DATA=${TORCH_DATA:-/usr/share/datasets/fashion-mnist}
if ! command -v perf >/dev/null 2>&1; then
    echo "(perf is not installed: no profile)"
    exit 0
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/ps_proftorch.XXXXXX") || exit 1
trap '[ -n "$PROFILE_KEEP" ] || rm -rf "$W"' EXIT
export PS_LIBRARY="$(pwd -P)/lib/libps.so"
"$BIN/ps_server" --bind 'tcp://127.0.0.1:*' --num-workers 2 --mode async --optimizer momentum \
    --lr 0.05 --momentum 0.9 >"$W/server.log" 2>&1 &
srv=$!
i=0
while ! grep -q 'listening on' "$W/server.log" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
ep=$(sed -n 's/.*listening on //p' "$W/server.log")
pids=""
for r in 0 1; do
    /usr/bin/python3 examples/torch_fashion_mnist.py --servers "$ep" --rank $r --num-workers 2 \
        --mode async --optimizer momentum --lr 0.05 --momentum 0.9 --steps "$STEPS" \
        --test-samples 1 --data "$DATA" --log-every 1000000 >"$W/worker$r.log" 2>&1 &
    pids="$pids $!"
done
# the training loop only: record from the moment both workers start it
i=0
while [ "$(cat "$W"/worker*.log 2>/dev/null | grep -c 'training')" -lt 2 ] && [ $i -lt 600 ]; do
    sleep 0.05
    i=$((i + 1))
done
perf record -q -F 499 -o "$W/perf.data" -p "$srv,$(echo $pids | tr ' ' ',')" >"$W/perf.out" 2>&1 &
perf_pid=$!
for p in $pids; do wait "$p"; done
kill -INT "$perf_pid" 2>/dev/null
wait "$perf_pid"
kill "$srv" 2>/dev/null
wait "$srv" 2>/dev/null
if [ ! -s "$W/perf.data" ]; then
    echo "(perf record failed: $(tail -n 1 "$W/perf.out"); no profile)"
    exit 0
fi
perf script -i "$W/perf.data" -F comm,pid,tid,ip,dso 2>/dev/null | awk '
{
    for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+\/[0-9]+$/) break
    if (i > NF) next
    split($i, pt, "/"); pid = pt[1]; tid = pt[2]
    comm = $1
    dso = $NF; gsub(/[()]/, "", dso); n = split(dso, parts, "/"); lib = parts[n]
    kern = ($(i + 1) ~ /^ffff/) || lib ~ /kernel/
    if (comm ~ /ps_server/) role = "server"
    else if (comm ~ /python/ || comm ~ /^ZMQ/ || comm ~ /^pt_/) role = "worker"
    else next
    if (role == "server") {
        if (kern) c = "server: kernel (sockets, page faults)"
        else if (lib ~ /ps_server/) c = "server: ps_server (optimizer apply, I/O loop)"
        else if (lib ~ /libzmq/) c = "server: ZeroMQ"
        else c = "server: libc (copies, malloc) and other"
    } else if (tid == pid) {
        if (kern) c = "worker training thread: kernel (page faults, syscalls)"
        else if (lib ~ /libtorch|libc10|dnnl|mkl|openblas|gomp|sleef/) c = "worker training thread: PyTorch compute"
        else if (dso ~ /^JIT|perf-[0-9]+\.map$/) c = "worker training thread: PyTorch compute (oneDNN JIT kernels)"
        else if (lib ~ /python/) c = "worker training thread: Python interpreter (loop, hooks)"
        else if (lib ~ /libps/) c = "worker training thread: libps (exchange calls)"
        else c = "worker training thread: libc (copies, malloc) and other"
    } else {
        if (kern) c = "worker other threads: kernel (sockets)"
        else if (lib ~ /libps|libzmq/) c = "worker other threads: libps comm thread, ZeroMQ I/O"
        else if (lib ~ /libtorch|libc10|gomp/) c = "worker other threads: PyTorch"
        else c = "worker other threads: libc (copies into the back buffers) and other"
    }
    cnt[c]++; total++
}
END {
    printf "| where (perf samples of 1 server + 2 workers, async) | share |\n| --- | ---: |\n"
    while (1) {
        best = ""; bv = 0
        for (k in cnt) if (cnt[k] > bv) { bv = cnt[k]; best = k }
        if (best == "") break
        printf "| %s | %.1f%% |\n", best, 100.0 * bv / total
        delete cnt[best]
    }
    printf "\n%d samples at 499 Hz over the training loops.\n", total
}'
for r in 0 1; do
    sed -n 's/.*summary: /worker '"$r"': /p' "$W/worker$r.log"
done | sed 's/^/    /'
echo
