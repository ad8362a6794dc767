#!/bin/sh
# The Python package against live servers: every tests/python/test_*.py
# (test_client.py: the ps.Client binding; test_torch.py: ps.torch, the
# examples, ps_launch --exec; test_torch_dropin.py: PyTorch's habits through
# ps.torch and the ported scripts; test_torch_failover.py: ps.torch jobs
# through a killed server, with replicas and with --restart-servers), each
# printing PASS/FAIL/SKIP lines for
# tests/run.sh.
# Always Debian's /usr/bin/python3: that is where python3-torch lives (a
# python3 earlier on PATH may be another interpreter without it).
#
#   PS_BIN_DIR, BUILD   where the programs and build/tests/abi_layout are
#   SAN=1               libps.so is then built with ASan: loaded with libasan
#                       preloaded, or skipped when that does not work
cd "$(dirname "$0")/.." || exit 1
PY=/usr/bin/python3
BUILD=${BUILD:-build}
export BUILD PS_BIN_DIR=${PS_BIN_DIR:-bin}
LIBDIR=$( [ "$SAN" = 1 ] && echo "$BUILD/lib" || echo lib )

if [ ! -x "$PY" ]; then
    echo "SKIP python: skipped: no /usr/bin/python3 (make deps installs python3)"
    exit 0
fi
if [ ! -e "$LIBDIR/libps.so" ]; then
    echo "FAIL python: $LIBDIR/libps.so is not built (make)"
    exit 1
fi
export PS_LIBRARY="$(pwd -P)/$LIBDIR/libps.so"
if [ "$SAN" = 1 ]; then
    # an ASan library in an uninstrumented interpreter: the runtime must be
    # loaded first; leaks of the interpreter itself are not ours to report
    asan=$(cc -print-file-name=libasan.so 2>/dev/null)
    ubsan=$(cc -print-file-name=libubsan.so 2>/dev/null)
    if [ ! -e "$asan" ] ||
        ! LD_PRELOAD="$asan $ubsan" ASAN_OPTIONS=detect_leaks=0 "$PY" -c 'import sys; sys.path.insert(0, "python"); import ps' \
            >/dev/null 2>&1; then
        echo "SKIP python: skipped: SAN=1 libps.so cannot be loaded into $PY (libasan preload failed)"
        exit 0
    fi
    export LD_PRELOAD="$asan $ubsan"
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0
fi
status=0
for t in tests/python/test_*.py; do
    (cd tests/python && "$PY" "$(basename "$t")") || status=1
done
exit $status
