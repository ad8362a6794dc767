#!/bin/sh
# What ps_worker --device cuda:0 says when the GPU cannot be had, without a
# GPU: build/tests/libfake_cudart.so (tests/fake_cudart.c) is preloaded in
# front of the CUDA runtime and fails the way a machine does: no driver
# (the runtime itself blames an "insufficient driver version"), an old
# driver, a driver without a GPU, a GPU in EXCLUSIVE_PROCESS mode that
# another worker holds.  Each message must name the cause and the remedy,
# with exit status 2 (something to fix first).  On this machine as it is,
# without that shim: when it has no GPU, the message says so.
# Skipped without the CUDA backend (no nvcc) and with SAN=1 (the shim would
# come before the sanitizer's runtime).

BIN=$(cd "${PS_BIN_DIR:-bin}" 2>/dev/null && pwd -P) || BIN=$(pwd -P)/bin
BUILD=${BUILD:-build}
FAKE=$(pwd -P)/$BUILD/tests/libfake_cudart.so
if [ "$SAN" = 1 ]; then
    echo "SKIP cuda_faults: skipped: SAN=1 (the shim cannot be preloaded before libasan)"
    exit 0
fi
if [ ! -f "$FAKE" ]; then
    echo "SKIP cuda_faults: skipped: no CUDA backend in this build (no nvcc at make time)"
    exit 0
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_cuda_faults.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
trap 'exit 1' INT TERM HUP

# worker LOG [FAULT]: ps_worker on cuda:0 alone, a one-step run; its exit status
worker() {
    if [ -n "$2" ]; then
        PS_FAKE_CUDA=$2 LD_PRELOAD=$FAKE timeout 30 "$BIN/ps_worker" --device cuda:0 \
            --servers none --data synthetic:256 --model mlp:784-16-10 --steps 1 >"$1" 2>&1
    else
        timeout 30 "$BIN/ps_worker" --device cuda:0 --servers none --data synthetic:256 \
            --model mlp:784-16-10 --steps 1 >"$1" 2>&1
    fi
}

# check NAME FAULT WANT... [-- UNWANTED...]: the worker under FAULT exits 2
# and its log holds every WANT and none of the UNWANTED
check() {
    name=$1 fault=$2
    shift 2
    log=$T/$name.log
    worker "$log" "$fault"
    rc=$?
    bad=""
    [ "$rc" -eq 2 ] || bad="$bad exit $rc, expected 2;"
    neg=0
    for w in "$@"; do
        if [ "$w" = -- ]; then
            neg=1
            continue
        fi
        if [ "$neg" -eq 0 ] && ! grep -qF -- "$w" "$log"; then
            bad="$bad no \"$w\";"
        elif [ "$neg" -eq 1 ] && grep -qF -- "$w" "$log"; then
            bad="$bad says \"$w\";"
        fi
    done
    if [ -z "$bad" ]; then
        echo "PASS $name"
    else
        echo "FAIL $name:$bad log: $(tr '\n' ' ' <"$log" | cut -c1-600)"
    fi
}

check no_driver_says_no_cuda_device_not_insufficient_driver nodriver \
    "--device cuda:0: no CUDA device: no NVIDIA driver is loaded" "--device cpu" \
    -- "insufficient"
check old_driver_says_update_the_driver olddriver \
    "the NVIDIA driver supports CUDA 12.4, this build's runtime needs CUDA" "update the driver"
check driver_without_gpu_says_no_cuda_device nodevice \
    "--device cuda:0: no CUDA device: the NVIDIA driver (CUDA 13.0) sees no usable GPU" \
    "--device cpu"
check exclusive_process_gpu_held_by_another_worker_names_mps_and_default_mode exclusive \
    "cudaSetDevice" "busy or unavailable" "EXCLUSIVE_PROCESS compute mode" \
    "nvidia-cuda-mps-control -d" "nvidia-smi -c DEFAULT"

# this machine, no shim
if command -v nvidia-smi >/dev/null 2>&1 && [ -n "$(nvidia-smi -L 2>/dev/null)" ]; then
    echo "SKIP this_machine_without_gpu_says_no_cuda_device: skipped: this machine has a GPU"
else
    check this_machine_without_gpu_says_no_cuda_device "" "--device cuda:0: no CUDA device" \
        -- "insufficient"
fi
