#!/bin/sh
# GPU check, for a machine with an NVIDIA GPU; run from anywhere in the tree.
# Builds with CUDA, runs the CUDA-vs-CPU backend tests (exact FP32, then with
# TF32 gemm), then bench/gpu_bench.sh when it exists, and ends with a summary.
# Exits non-zero when the build, a test run or the benchmark fails; a test run
# that skips (no usable device) counts as failed.  Logs go to $OUT when set.
cd "$(dirname "$0")/../.." || exit 1
logs=${OUT:-$(mktemp -d)}
mkdir -p "$logs" || exit 1
status=0
summary=""

# row STEP RESULT NOTE: one line of the closing table; anything but ok fails
row() {
    summary="$summary$(printf '%-16s %-5s %s' "$1" "$2" "$3")
"
    [ "$2" = ok ] || [ "$2" = "-" ] || status=1
}

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    head -n 1)
echo "gpu: ${gpu:-none (nvidia-smi found no GPU)}"

built=0
if make CUDA=1 -j16 >"$logs/build.log" 2>&1; then
    built=1
    row build ok ""
else
    tail -n 40 "$logs/build.log"
    row build FAIL "see $logs/build.log"
fi

# tests NAME [VAR=value...]: run build/tests/test_cuda under env
tests() {
    name=$1
    shift
    if [ "$built" != 1 ]; then
        row "$name" FAIL "not run: build failed"
        return
    fi
    env "$@" timeout -k 5 300 build/tests/test_cuda >"$logs/$name.log" 2>&1
    rc=$?
    grep -E '^(PASS|FAIL|SKIP) |^test_cuda: | error ' "$logs/$name.log"
    p=$(grep -c '^PASS ' "$logs/$name.log")
    f=$(grep -c '^FAIL ' "$logs/$name.log")
    s=$(grep -c '^SKIP ' "$logs/$name.log")
    if [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ] && [ "$p" -gt 0 ]; then
        row "$name" ok "$p passed"
    else
        row "$name" FAIL "$p passed, $f failed, $s skipped, exit $rc"
    fi
}
tests test_cuda
tests test_cuda_tf32 PS_CUDA_TF32=1

if [ ! -f bench/gpu_bench.sh ]; then
    row gpu_bench - "bench/gpu_bench.sh not there yet"
elif [ "$built" != 1 ]; then
    row gpu_bench FAIL "not run: build failed"
elif sh bench/gpu_bench.sh >"$logs/bench.log" 2>&1; then
    tail -n 30 "$logs/bench.log"
    row gpu_bench ok "log: $logs/bench.log"
else
    tail -n 30 "$logs/bench.log"
    row gpu_bench FAIL "see $logs/bench.log"
fi

echo
echo "== GPU check on ${gpu:-no GPU} =="
printf '%s' "$summary"
exit $status
