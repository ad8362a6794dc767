#!/bin/sh
# Install the Debian packages the project needs (as root), only those missing.
set -e
PKGS="build-essential pkg-config libzmq3-dev libmsgpack-dev libopenblas-dev zlib1g-dev libmicrohttpd-dev libcurl4-openssl-dev libjson-c-dev prometheus tmux dataset-fashion-mnist gnuplot-nox python3 python3-numpy python3-torch iproute2 clang libclang-rt-dev openssh-server slurm-wlm munge openmpi-bin"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "deps: all Debian packages present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing Debian packages:$missing; run 'make deps' as root (or: sudo apt-get install$missing)" >&2
    exit 1
fi
echo "deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing
