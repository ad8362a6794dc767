#!/bin/sh
# One command from a fresh Debian 12 machine (as root) to a training cluster:
# install the missing Debian packages, build, and run the multi-GPU-on-one-host
# example (2 servers, one worker per GPU or 2 CPU workers; sync then async).
# Extra arguments go to examples/multi_gpu_one_host.sh.
set -e
cd "$(dirname "$0")/.."
sh .ci/deps.sh
make -j"$(nproc)" all
exec sh examples/multi_gpu_one_host.sh "$@"
