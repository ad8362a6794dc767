#!/bin/sh
# Simulated hosts with shaped links (bench/multihost.sh --smoke): network
# namespaces joined by a bridge, tc tbf at 1 Gbit/s, a server host and a
# worker host of 2 workers; f32, bf16 (--wire-dtype) and --local-aggregate 2
# each train 20 steps across the link, and the last two must cut the bytes
# the worker host sends.  Needs root, iproute2 and tbf: SKIP otherwise.
# Leaves no namespace, process or shared-memory directory behind.
cd "$(dirname "$0")/.." || exit 1
exec sh bench/multihost.sh --smoke
