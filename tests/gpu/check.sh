#!/bin/sh
# GPU check: everything of the CUDA backend that needs a GPU, in one call of
# bounded time, from a bundle made elsewhere (make gpu-bundle), so a machine
# with only the NVIDIA driver, the CUDA toolkit and a python3 with torch
# spends its minutes on the GPU.  Run from the source tree:
#
#   tests/gpu/check.sh [--bundle DIR] [--out DIR] [--budget SECONDS] [--build]
#     --bundle DIR   the bundle to run (default build/gpu-bundle)
#     --out DIR      logs and summary.txt go here (default $OUT, else a temp dir)
#     --budget S     the whole check ends within S seconds (default 450): every
#                    step runs under `timeout`, within what is left
#     --build        build here (make CUDA=1 WERROR=0) instead; also done when
#                    the bundle cannot run here
#     --no-bench     leave the benchmark out (its rows say skipped): a quick
#                    check of the tests and the workers, about two minutes
#     --only GROUPS  run only these of: tests python fault workers memcheck
#                    tf32 bench (space-separated; the GPU and the bundle are
#                    always checked), e.g. a second call that reruns what a
#                    first one found failing, or the benchmark alone
#
# Parts, each a row of the summary (ok, FAILED, or skipped with the reason;
# a skipped part is never ok): the GPU and its compute mode (nvidia-smi);
# the bundle; test_cuda (exact FP32, then TF32); test_train's
# cuda_sync_run_matches_cpu and cuda_sync_ctr_run_matches_cpu; ps_worker
# --device cuda:0 for the MLP and the CNN, compute-only (the CNN also with
# PS_CUDNN=0, cuDNN off) and through a server with 1 and 2 workers on the
# GPU, sync and async, --shm auto and off, and for the CTR model
# compute-only and through one server; the Python CUDA tests and the
# PyTorch example through ps_launch --gpus --exec with the machine's python3
# (its torch must have CUDA); a sticky CUDA error injected into a worker
# (tests/fake_cudart.c), which must end it, naming the error; a
# compute-sanitizer memcheck run of a few steps; bench/gpu_bench.sh, ours
# against PyTorch on the same GPU.
# Exit status: 0 when no part FAILED (so 0 on a machine without a GPU, where
# every GPU part says skipped), 1 otherwise, 2 for a bad argument.
# CHECK_DEVICE=cpu (with a stand-in nvidia-smi on PATH) runs the workers,
# the example and the benchmark on the CPU: a dry run of this script itself
# on a machine without a GPU (the CUDA parts then fail or skip, as they must).
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd -P)
bundle="" out=${OUT:-} budget=450 build=0 nobench=0
only="tests python fault workers memcheck tf32 bench"
while [ $# -gt 0 ]; do
    case $1 in
    --bundle) bundle=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --build) build=1; shift ;;
    --no-bench) nobench=1; shift ;;
    --only)
        for g in $2; do
            case " $only " in
            *" $g "*) ;;
            *)
                echo "check.sh: --only takes tests python fault workers memcheck tf32 bench, got '$g'" >&2
                exit 2
                ;;
            esac
        done
        only=$2
        shift 2
        ;;
    *)
        echo "check.sh: unknown argument '$1' (--bundle DIR --out DIR --budget S --build --no-bench --only GROUPS)" >&2
        exit 2
        ;;
    esac
done
case $budget in '' | *[!0-9]*) echo "check.sh: --budget must be seconds" >&2; exit 2 ;; esac
if ! command -v timeout >/dev/null 2>&1; then
    echo "check.sh: needs timeout(1) (coreutils) to bound every step" >&2
    exit 2
fi
# wanted GROUP: whether --only names it
wanted() { case " $only " in *" $1 "*) return 0 ;; esac; return 1; }
START=$(date +%s)
DEADLINE=$((START + budget))
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/ps_gpu_check.XXXXXX") || exit 2
mkdir -p "$out/logs" || exit 2
out=$(cd "$out" && pwd -P)
# scratch that must not travel back with the logs (the bundle's unpacked
# OpenBLAS, test files)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ps_gpu_work.XXXXXX") || exit 2
TMPDIR=$WORK
export TMPDIR
PIDS=""
cleanup() {
    for p in $PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ROWS=$out/.rows
: >"$ROWS"
failed=0
# row PART RESULT SECONDS NOTE: one line of the summary
row() {
    printf '%-34s %-8s %5s  %s\n' "$1" "$2" "$3" "$4" >>"$ROWS"
    printf '%-34s %-8s %5ss %s\n' "$1" "$2" "$3" "$4"
    [ "$2" = FAILED ] && failed=1
    return 0
}
left() { echo $((DEADLINE - $(date +%s))); }
# limit WANT: WANT seconds, or what is left of the budget but 10 (the summary)
limit() {
    _l=$(($(left) - 10))
    [ "$1" -lt "$_l" ] && _l=$1
    echo "$_l"
}
# step NAME WANT MIN CMD...: CMD under timeout, output in logs/NAME.log;
# sets RC and SECS.  Returns 1 (and writes the row) when less than MIN
# seconds are left.
step() {
    _n=$1 _want=$2 _min=$3
    shift 3
    LIM=$(limit "$_want")
    if [ "$LIM" -lt "$_min" ]; then
        row "$_n" skipped 0 "out of the time budget ($(left) s of $budget left)"
        return 1
    fi
    _t0=$(date +%s)
    timeout -k 5 "$LIM" "$@" >"$out/logs/$_n.log" 2>&1
    RC=$?
    SECS=$(($(date +%s) - _t0))
    return 0
}
timed_out() { [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; }
# why_failed LOG: the exit status and the log's last error-looking line
why_failed() {
    if timed_out; then
        echo "timed out after ${LIM}s; $1"
        return
    fi
    _e=$(grep -iE 'error|fail|fatal|refus|abort' "$1" 2>/dev/null | grep -v '^PASS' | tail -n 1 |
        cut -c1-200)
    echo "exit $RC${_e:+: $_e}; $1"
}
# count_tests LOG: PASS/FAIL/SKIP lines; ok only with passes and nothing else
count_tests() {
    P=$(grep -c '^PASS ' "$1") F=$(grep -c '^FAIL ' "$1") S=$(grep -c '^SKIP ' "$1")
}
test_row() {
    count_tests "$out/logs/$1.log"
    if [ "$RC" -eq 0 ] && [ "$F" -eq 0 ] && [ "$S" -eq 0 ] && [ "$P" -gt 0 ]; then
        row "$1" ok "$SECS" "$P passed"
    elif [ "$RC" -eq 0 ] && [ "$F" -eq 0 ] && [ "$P" -eq 0 ] && [ "$S" -gt 0 ]; then
        row "$1" FAILED "$SECS" "every case skipped: $(grep -m1 '^SKIP ' "$out/logs/$1.log" | cut -c1-120)"
    else
        row "$1" FAILED "$SECS" "$P passed, $F failed, $S skipped, $(why_failed "logs/$1.log")"
    fi
}

# server LOG W MODE: a ps_server of what runs here on a free port, bounded
# by LIM; sets SRV (its pid) and EP (its endpoint, "" when it did not start)
server() {
    timeout -k 5 "$LIM" $RUN ps_server --bind 'tcp://127.0.0.1:*' --num-workers "$2" \
        --mode "$3" --lr 0.05 >"$1" 2>&1 &
    SRV=$!
    PIDS="$PIDS $SRV"
    EP="" _i=0
    while [ -z "$EP" ] && [ "$_i" -lt 100 ]; do
        EP=$(sed -n 's/.*listening on \(.*\)$/\1/p' "$1" 2>/dev/null)
        [ -n "$EP" ] || { sleep 0.1; _i=$((_i + 1)); }
    done
}
stop_server() {
    kill -TERM "$SRV" 2>/dev/null
    wait "$SRV" 2>/dev/null
}

echo "== GPU check: logs in $out, budget ${budget}s"

# ---- the GPU
GPUS=0 MODE="" GPU=""
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 20 nvidia-smi >"$out/logs/nvidia-smi.log" 2>&1
    GPUS=$(timeout 10 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    GPU=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode \
        --format=csv,noheader 2>/dev/null | head -n 1)
    MODE=$(echo "$GPU" | awk -F', ' '{print $NF}')
    NOGPU="no CUDA device: nvidia-smi lists no GPU ($(tail -n 1 "$out/logs/nvidia-smi.log" | cut -c1-100))"
else
    NOGPU="no CUDA device: no nvidia-smi on this machine (no NVIDIA driver)"
fi
if [ "$GPUS" -gt 0 ]; then
    row gpu ok 0 "$GPUS GPU(s); cuda:0 $GPU"
else
    row gpu skipped 0 "$NOGPU"
fi

# ---- what runs: the bundle, else a build here
RUN="" BINDIR="" TESTDIR=""
[ -n "$bundle" ] || { [ -x build/gpu-bundle/run ] && bundle=build/gpu-bundle; }
if [ "$build" = 0 ] && [ -n "$bundle" ]; then
    if [ ! -x "$bundle/run" ]; then
        row bundle FAILED 0 "$bundle/run not found (make gpu-bundle makes it)"
    elif step bundle 60 10 sh -c '"$1/run" --check; "$1/run" ps_server --version &&
        "$1/run" ps_worker --version' sh "$bundle"; then
        # --check lists where each library resolves (it needs ldd); what
        # decides is that the programs start
        if [ "$RC" -eq 0 ] && grep -q "=> not found" "$out/logs/bundle.log"; then
            RC=1
        fi
        if [ "$RC" -eq 0 ]; then
            B=$(cd "$bundle" && pwd -P)
            RUN="$B/run" BINDIR=$B/bin TESTDIR=$B/tests
            row bundle ok "$SECS" "$(sed -n 's/^cuda code: //p' "$B/MANIFEST"); $(sed -n 's/^commit: //p' "$B/MANIFEST")"
        else
            row bundle FAILED "$SECS" "cannot run here, building instead: $(why_failed logs/bundle.log)"
            build=1
        fi
    fi
elif [ "$build" = 0 ]; then
    if [ "$GPUS" -gt 0 ]; then
        build=1
    else
        row bundle skipped 0 "no bundle (make gpu-bundle) and no GPU to build for"
    fi
fi
if [ "$build" = 1 ] && [ -z "$RUN" ]; then
    if [ "$GPUS" -eq 0 ]; then
        row build skipped 0 "$NOGPU"
    elif step build 300 60 make CUDA=1 WERROR=0 -j"$(nproc 2>/dev/null || echo 4)"; then
        if [ "$RC" -eq 0 ]; then
            RUN="env PATH=$ROOT/bin:$PATH PS_BIN_DIR=$ROOT/bin PS_LIBRARY=$ROOT/lib/libps.so PYTHONPATH=$ROOT/python"
            BINDIR=$ROOT/bin TESTDIR=$ROOT/build/tests
            row build ok "$SECS" "$(grep '^make: CUDA backend' "$out/logs/build.log" | tail -n 1)"
        else
            row build FAILED "$SECS" "$(grep -m1 'missing Debian packages' "$out/logs/build.log" ||
                why_failed logs/build.log)"
        fi
    fi
fi
# SKIP: why every part below is skipped (empty: they run)
SKIP=""
if [ "$GPUS" -eq 0 ]; then
    SKIP=$NOGPU
elif [ -z "$RUN" ]; then
    SKIP="nothing runs here (see bundle/build)"
fi
PY=${PYTHON:-python3}
DEV=${CHECK_DEVICE:-cuda:0}

# ---- the CUDA tests
cuda_tests() {
    if step test_cuda 150 20 $RUN "$TESTDIR/test_cuda"; then test_row test_cuda; fi
    if step test_train_cuda 150 20 $RUN env PS_BIN_DIR="$BINDIR" "$TESTDIR/test_train" \
        cuda_sync_run_matches_cpu cuda_sync_ctr_run_matches_cpu; then
        test_row test_train_cuda
    fi
}

# ---- ps_worker on cuda:0
# workers NAME SPEC W MODE SHM STEPS [ENV]: MODE none: one worker alone
# (compute only); else one server and W workers on the GPU at once.  ENV:
# VAR=VALUE words for the workers' environment
workers() {
    _name=$1 _spec=$2 _w=$3 _mode=$4 _shm=$5 _steps=$6 _data=${7:-synthetic:8192} _env=${8:-}
    LIM=$(limit 60)
    if [ "$LIM" -lt 15 ]; then
        row "$_name" skipped 0 "out of the time budget ($(left) s of $budget left)"
        return
    fi
    _d=$out/logs/$_name
    mkdir -p "$_d"
    _t0=$(date +%s)
    _flags="--device $DEV --model $_spec --data $_data --batch 64 --steps $_steps --log-every 100"
    EP=none SRV=""
    if [ "$_mode" != none ]; then
        server "$_d/server.log" "$_w" "$_mode"
        if [ -z "$EP" ]; then
            stop_server
            row "$_name" FAILED $(($(date +%s) - _t0)) "the server did not start: $(tail -n 1 "$_d/server.log")"
            return
        fi
        _flags="$_flags --mode $_mode --shm $_shm"
    fi
    _r=0 _wp=""
    while [ "$_r" -lt "$_w" ]; do
        timeout -k 5 "$LIM" env $_env $RUN ps_worker --servers "$EP" --rank "$_r" \
            --num-workers "$_w" $_flags >"$_d/worker$_r.log" 2>&1 &
        _wp="$_wp $!"
        _r=$((_r + 1))
    done
    _bad="" _r=0 _sps=""
    for p in $_wp; do
        wait "$p"
        RC=$?
        _log=$_d/worker$_r.log
        _s=$(sed -n 's/.*summary: time [0-9.]* s, \([0-9.]*\) samples\/s.*/\1/p' "$_log" | tail -n 1)
        if [ "$RC" -ne 0 ] || [ -z "$_s" ]; then
            _bad="$_bad worker $_r: $(why_failed "logs/$_name/worker$_r.log");"
        else
            _sps="$_sps${_sps:+, }$_s"
        fi
        _r=$((_r + 1))
    done
    [ -n "$SRV" ] && stop_server
    _secs=$(($(date +%s) - _t0))
    if [ -z "$_bad" ]; then
        row "$_name" ok "$_secs" "samples/s per worker: $_sps"
    elif [ "$MODE" = Exclusive_Process ] && [ "$_w" -gt 1 ] &&
        grep -q "EXCLUSIVE_PROCESS compute mode" "$_d"/worker*.log; then
        row "$_name" ok "$_secs" "EXCLUSIVE_PROCESS GPU: the second worker was refused, naming MPS and the default mode, as it must"
    else
        row "$_name" FAILED "$_secs" "$_bad"
    fi
}

worker_runs() {
    workers worker_mlp_alone mlp:784-256-128-10 1 none - 400
    workers worker_cnn_alone cnn 1 none - 100
    # the same without cuDNN (im2col + cuBLAS): both samples/s in the rows
    workers worker_cnn_alone_cudnn_off cnn 1 none - 100 synthetic:8192 PS_CUDNN=0
    # the click-through model: rows staged to the GPU, gradients back, its
    # tables local, then on one server
    workers worker_ctr_cuda ctr:fields=8,rows=100000 1 none - 200 synthetic-ctr:20000
    workers worker_ctr_cuda_server ctr:fields=8,rows=100000 1 sync auto 200 synthetic-ctr:20000
    for spec in mlp cnn; do
        if [ "$spec" = mlp ]; then s=mlp:784-256-128-10 n=400; else s=cnn n=100; fi
        for w in 1 2; do
            for mode in sync async; do
                for shm in auto off; do
                    _n=worker_${spec}_${w}w_${mode}_shm-$shm
                    # one process per GPU: the refusal is checked once, in
                    # async (a sync worker would wait for the refused one)
                    if [ "$MODE" = Exclusive_Process ] && [ "$w" -gt 1 ] &&
                        [ "$_n" != worker_mlp_2w_async_shm-auto ]; then
                        row "$_n" skipped 0 "cuda:0 is in EXCLUSIVE_PROCESS mode: two workers cannot share it (worker_mlp_2w_async_shm-auto checks the refusal)"
                        continue
                    fi
                    workers "$_n" "$s" "$w" "$mode" "$shm" "$n"
                done
            done
        done
    done
}

# ---- Python: the CUDA test, the example through ps_launch --gpus --exec
torch_line=""
python_parts() {
    torch_line=$(timeout 60 $RUN "$PY" -c 'import torch
print("torch %s (CUDA %s), cuda available: %s" % (torch.__version__, torch.version.cuda,
      torch.cuda.is_available()))' 2>&1 | tail -n 1)
    # (the dry run, CHECK_DEVICE=cpu, goes on with a torch without CUDA)
    case $torch_line in
    *"available: True"*) ;;
    *"available: False"*)
        if [ "$DEV" != cpu ]; then
            if echo "$torch_line" | grep -q "CUDA None"; then
                _res=skipped _note="$PY: $torch_line (a torch without CUDA)"
            else
                _res=FAILED _note="$PY: $torch_line: its torch cannot use the GPU"
            fi
            row python_cuda_staging "$_res" 0 "$_note"
            row python_cuda_dropin "$_res" 0 "$_note"
            row python_cuda_tables "$_res" 0 "$_note"
            row example_ps_launch_gpus "$_res" 0 "$_note"
            return
        fi
        ;;
    *)
        row python_cuda_staging skipped 0 "$PY has no torch: $torch_line"
        row python_cuda_dropin skipped 0 "$PY has no torch: $torch_line"
        row python_cuda_tables skipped 0 "$PY has no torch: $torch_line"
        row example_ps_launch_gpus skipped 0 "$PY has no torch: $torch_line"
        return
        ;;
    esac
    if step python_cuda_staging 150 30 sh -c 'cd tests/python && exec "$@"' sh $RUN "$PY" \
        test_torch.py cuda_parameters_are_staged_through_pinned_memory; then
        test_row python_cuda_staging
    fi
    if step python_cuda_dropin 150 30 sh -c 'cd tests/python && exec "$@"' sh $RUN "$PY" \
        test_torch_dropin.py \
        a_cuda_model_trains_like_the_cpu_model_updated_on_workers_and_on_servers; then
        test_row python_cuda_dropin
    fi
    if step python_cuda_tables 150 30 sh -c 'cd tests/python && exec "$@"' sh $RUN "$PY" \
        test_torch_tables.py cuda_model_rows_are_staged_to_its_device_and_equal_the_cpu_model; then
        test_row python_cuda_tables
    fi
    example_data
    if step example_ps_launch_gpus 150 30 $RUN ps_launch --servers 1 --workers 1 \
        --gpus "$( [ "$DEV" = cpu ] && echo none || echo 0)" \
        --mode async --lr 0.05 --exec "$PY" examples/torch_fashion_mnist.py --data "$data" \
        --steps 60 --log-every 20 --test-samples 500; then
        _l=$out/logs/example_ps_launch_gpus.log
        if [ "$RC" -eq 0 ] && grep -q "on $DEV" "$_l" && grep -q "summary:" "$_l"; then
            row example_ps_launch_gpus ok "$SECS" "$(sed -n 's/.*summary: time [0-9.]* s, \([0-9]*\) samples\/s.*\(test accuracy [0-9.]*\).*/\1 samples\/s, \2/p' "$_l" | tail -n 1) (data: $data)"
        elif [ "$RC" -eq 0 ]; then
            row example_ps_launch_gpus FAILED "$SECS" "did not train on $DEV (no 'on $DEV' / summary line)"
        else
            row example_ps_launch_gpus FAILED "$SECS" "$(why_failed logs/example_ps_launch_gpus.log)"
        fi
    fi
}

# ---- faults: a sticky CUDA error must end the worker, naming it, not hang
fault_sticky() {
    fake=$TESTDIR/libfake_cudart.so
    if [ ! -f "$fake" ]; then
        row fault_sticky_error skipped 0 "no $fake in this build"
        return
    fi
    LIM=$(limit 60)
    if [ "$LIM" -lt 20 ]; then
        row fault_sticky_error skipped 0 "out of the time budget"
        return
    fi
    _d=$out/logs/fault_sticky_error
    mkdir -p "$_d"
    _t0=$(date +%s)
    server "$_d/server.log" 1 sync
    timeout -k 5 $((LIM - 5)) $RUN env PS_FAKE_CUDA=sticky:300 LD_PRELOAD="$fake" ps_worker \
        --servers "$EP" --mode sync --device "$DEV" --model mlp:784-256-128-10 \
        --data synthetic:8192 --steps 5000 --log-every 1000 >"$_d/worker.log" 2>&1
    RC=$?
    stop_server
    SECS=$(($(date +%s) - _t0))
    _lines=$(wc -l <"$_d/worker.log")
    if timed_out; then
        row fault_sticky_error FAILED "$SECS" "the worker hung after the injected error (killed after ${LIM}s); logs/fault_sticky_error/worker.log"
    elif [ "$RC" -eq 0 ]; then
        row fault_sticky_error FAILED "$SECS" "the worker exited 0 despite the error (was the shim loaded?)"
    elif ! grep -q "an illegal memory access was encountered" "$_d/worker.log"; then
        row fault_sticky_error FAILED "$SECS" "exit $RC without naming the CUDA error: $(tail -n 1 "$_d/worker.log" | cut -c1-160)"
    elif [ "$_lines" -gt 200 ]; then
        row fault_sticky_error FAILED "$SECS" "exit $RC, named the error, but logged $_lines lines (a flood)"
    else
        row fault_sticky_error ok "$SECS" "exit $RC in ${SECS}s, $_lines log lines: $(grep -m1 'illegal memory access' "$_d/worker.log" | sed 's/.*error [0-9:.]*: //' | cut -c1-120)"
    fi
}

# ---- compute-sanitizer memcheck: a few steps alone and through a server
memcheck() {
    cs=$(command -v compute-sanitizer 2>/dev/null)
    for c in ${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer} /usr/local/cuda/bin/compute-sanitizer \
        /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        [ -n "$cs" ] || { [ -x "$c" ] && cs=$c; }
    done
    if [ -z "$cs" ]; then
        row memcheck_cnn_alone skipped 0 "no compute-sanitizer (PATH, CUDA_HOME, /usr/local/cuda)"
        row memcheck_mlp_server skipped 0 "no compute-sanitizer"
        row memcheck_ctr_alone skipped 0 "no compute-sanitizer"
        return
    fi
    if step memcheck_cnn_alone 150 30 $RUN "$cs" --tool memcheck --error-exitcode 9 \
        --print-limit 20 "$BINDIR/ps_worker" --servers none --device "$DEV" --model cnn \
        --data synthetic:512 --batch 16 --steps 4; then
        memcheck_row memcheck_cnn_alone
    fi
    # the click-through model's embedding kernels and staging
    if step memcheck_ctr_alone 120 30 $RUN "$cs" --tool memcheck --error-exitcode 9 \
        --print-limit 20 "$BINDIR/ps_worker" --servers none --device "$DEV" \
        --model ctr:fields=4,rows=1000,mlp=32-1 --data synthetic-ctr:2048 --batch 32 --steps 6; then
        memcheck_row memcheck_ctr_alone
    fi
    # through a server: the exchange's copies, events and pinned staging
    LIM=$(limit 120)
    if [ "$LIM" -lt 30 ]; then
        row memcheck_mlp_server skipped 0 "out of the time budget"
        return
    fi
    server "$out/logs/memcheck_server.log" 1 async
    if step memcheck_mlp_server 120 30 $RUN "$cs" --tool memcheck --error-exitcode 9 \
        --print-limit 20 "$BINDIR/ps_worker" --servers "$EP" --mode async --device "$DEV" \
        --model mlp:784-256-128-10 --data synthetic:512 --batch 32 --steps 8; then
        memcheck_row memcheck_mlp_server
    fi
    stop_server
}
memcheck_row() {
    _l=$out/logs/$1.log
    _sum=$(grep -m1 'ERROR SUMMARY' "$_l" | sed 's/^=* *//')
    if [ "$RC" -eq 0 ] && echo "$_sum" | grep -q ' 0 errors'; then
        row "$1" ok "$SECS" "$_sum"
    else
        row "$1" FAILED "$SECS" "${_sum:+$_sum, }$(why_failed "logs/$1.log")"
    fi
}

# example_data: Fashion-MNIST when it is here, else IDX files of the same
# shapes made on the spot (once); sets data
example_data() {
    [ -n "${data:-}" ] && return 0
    data=/usr/share/datasets/fashion-mnist
    if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
        data=$WORK/fmnist
        timeout 60 "$PY" - "$data" <<'EOF' >"$out/logs/example_data.log" 2>&1
import os, random, struct, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = random.Random(1)
for split, n in (("train", 4096), ("t10k", 512)):
    labels = bytes(rng.randrange(10) for _ in range(n))
    # each class lights its own band of rows, so there is something to learn
    img = bytearray(n * 784)
    for i, c in enumerate(labels):
        for p in range(784):
            img[i * 784 + p] = (200 if p // 28 in (2 * c + 4, 2 * c + 5) else 0) + rng.randrange(50)
    with open(os.path.join(d, split + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">HBBIII", 0, 8, 3, n, 28, 28) + bytes(img))
    with open(os.path.join(d, split + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">HBBI", 0, 8, 1, n) + labels)
EOF
    fi
}

# ---- the benchmark, ours against PyTorch on the same GPU
bench() {
    LIM=$(limit 600)
    if [ "$nobench" = 1 ]; then
        for _p in gpu_bench gpu_bench_pytorch gpu_bench_pstorch; do
            row $_p skipped 0 "--no-bench"
        done
        return
    fi
    if [ "$LIM" -lt 60 ]; then
        row gpu_bench skipped 0 "out of the time budget ($(left) s of $budget left)"
        row gpu_bench_pytorch skipped 0 "out of the time budget"
        row gpu_bench_pstorch skipped 0 "out of the time budget"
        return
    fi
    # steps sized to what is left: 12 runs per model and the PyTorch runs
    _mlp=$((LIM * 5)) _cnn=$((LIM * 3 / 2))
    [ "$_mlp" -gt 2000 ] && _mlp=2000
    [ "$_cnn" -gt 600 ] && _cnn=600
    [ -n "$PY" ] && example_data
    # two repetitions where the time allows (ours: the best of each; ps.torch:
    # the median of its pairs)
    _reps=1
    [ "$LIM" -ge 240 ] && _reps=2
    step gpu_bench "$LIM" 60 $RUN env GPU_REPS=$_reps GPU_MLP_STEPS=$_mlp GPU_CNN_STEPS=$_cnn \
        GPU_DEVICE="$DEV" GPU_TORCH_DATA="${data:-}" BENCH_TIMEOUT=$((LIM / 6)) PYTHON="$PY" \
        GPU_DEADLINE=$(($(date +%s) + LIM - 10)) sh bench/gpu_bench.sh
    _l=$out/logs/gpu_bench.log
    _ours=$(sed -n 's/^gpu_bench: ours: //p' "$_l" | tail -n 1)
    _torch=$(sed -n 's/^gpu_bench: pytorch: //p' "$_l" | tail -n 1)
    _pst=$(sed -n 's/^gpu_bench: ps.torch: //p' "$_l" | tail -n 1)
    case $_ours in
    ok*) row gpu_bench ok "$SECS" "MLP $_mlp, CNN $_cnn steps${_ours#ok}; tables in logs/gpu_bench.log" ;;
    skipped*) row gpu_bench skipped "$SECS" "${_ours#skipped: }" ;;
    *) row gpu_bench FAILED "$SECS" "${_ours:-$(why_failed logs/gpu_bench.log)}" ;;
    esac
    case $_torch in
    ok*) row gpu_bench_pytorch ok "$SECS" "${_torch#ok: }" ;;
    skipped*) row gpu_bench_pytorch skipped 0 "${_torch#skipped: }" ;;
    *) row gpu_bench_pytorch FAILED 0 "${_torch:-not reached: $(why_failed logs/gpu_bench.log)}" ;;
    esac
    case $_pst in
    ok*) row gpu_bench_pstorch ok 0 "${_pst#ok: }" ;;
    skipped*) row gpu_bench_pstorch skipped 0 "${_pst#skipped: }" ;;
    *) row gpu_bench_pstorch FAILED 0 "${_pst:-not reached: $(why_failed logs/gpu_bench.log)}" ;;
    esac
}

if [ -n "$SKIP" ]; then
    for p in test_cuda test_train_cuda python_cuda_staging python_cuda_dropin python_cuda_tables \
        example_ps_launch_gpus \
        fault_sticky_error worker_runs memcheck test_cuda_tf32 gpu_bench gpu_bench_pytorch \
        gpu_bench_pstorch; do
        row $p skipped 0 "$SKIP"
    done
else
    wanted tests && cuda_tests
    wanted python && python_parts
    wanted fault && fault_sticky
    wanted workers && worker_runs
    wanted memcheck && memcheck
    if wanted tf32 && step test_cuda_tf32 120 20 $RUN env PS_CUDA_TF32=1 "$TESTDIR/test_cuda"
    then
        test_row test_cuda_tf32
    fi
    wanted bench && bench
fi

{
    echo "== GPU check: $(date -u '+%Y-%m-%d %H:%M UTC'), $(($(date +%s) - START))s of ${budget}s"
    echo "gpu: ${GPU:-none} ($GPUS found)"
    echo "host: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"'), glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | cut -d' ' -f2), $(nproc 2>/dev/null) cores"
    echo "cuda toolkit: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')$( [ -z "$(command -v nvcc)" ] && echo "no nvcc on PATH")"
    echo "python: $PY${torch_line:+: $torch_line}"
    echo "ran: ${RUN:-nothing}"
    echo
    printf '%-34s %-8s %5s  %s\n' part result secs note
    cat "$ROWS"
    echo
    if [ "$failed" -ne 0 ]; then
        echo "result: FAILED ($(grep -c ' FAILED ' "$ROWS") part(s)); logs in $out/logs"
    else
        echo "result: ok ($(grep -c ' ok ' "$ROWS") ok, $(grep -c ' skipped ' "$ROWS") skipped)"
    fi
} >"$out/summary.txt"
rm -f "$ROWS"
echo
cat "$out/summary.txt"
exit $failed
