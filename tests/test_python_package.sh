#!/bin/sh
# python/pyproject.toml: the Python package builds as a wheel on its own
# (setuptools' build_meta, what `pip install ./python` runs; no network, no
# pip), the wheel holds every module of python/ps and the version the
# Makefile builds, and once unpacked outside the tree (what pip does with a
# pure wheel) it trains against libps.so and a ps_server.
# One PASS/FAIL/SKIP line per case (tests/run.sh counts them).
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
BIN=$(cd "${PS_BIN_DIR:-bin}" 2>/dev/null && pwd -P) || BIN=$ROOT/bin
LIBDIR=$ROOT/${LIB:-lib}
[ "$SAN" = 1 ] && LIBDIR=$ROOT/build-san/lib
PY=/usr/bin/python3
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_pypkg.XXXXXX") || exit 1
SERVER_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

case=python_package_builds_a_wheel_of_every_module_at_the_makefile_version
if ! $PY -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 61)' \
    2>/dev/null; then
    echo "SKIP $case: skipped: $PY has no setuptools >= 61 (Debian: python3-setuptools)"
    exit 0
fi
if [ "$SAN" = 1 ]; then
    # a sanitized libps.so cannot be loaded into a python3 that is not
    echo "SKIP $case: skipped: SAN=1 (the plain make test runs this)"
    exit 0
fi
# a copy: building writes build/ and *.egg-info next to pyproject.toml
cp -r python "$T/src" && rm -rf "$T/src/ps/__pycache__" "$T/src/ps/torch/__pycache__"
(cd "$T/src" && $PY -c 'import setuptools.build_meta as b; print(b.build_wheel("'"$T"'/dist"))') \
    >"$T/build.log" 2>&1
whl=$(ls "$T"/dist/*.whl 2>/dev/null | head -n 1)
want_version=$(sed -n 's/^VERSION *:= *//p' Makefile)
if [ -z "$whl" ]; then
    echo "FAIL $case: no wheel: $(tail -n 3 "$T/build.log" | tr '\n' ' ')"
    exit 1
fi
$PY -m zipfile -l "$whl" | awk 'NR > 1 && $1 ~ /^ps\// { print $1 }' | sort >"$T/in_wheel"
(cd python && find ps -name '*.py' | sort) >"$T/in_tree"
case "$(basename "$whl")" in
*-"$want_version"-py3-none-any.whl) version_ok=1 ;;
*) version_ok=0 ;;
esac
if ! cmp -s "$T/in_wheel" "$T/in_tree"; then
    echo "FAIL $case: the wheel's modules differ from python/ps: $(diff "$T/in_tree" "$T/in_wheel" | tr '\n' ' ')"
    exit 1
elif [ "$version_ok" != 1 ]; then
    echo "FAIL $case: $(basename "$whl") is not version $want_version (Makefile's VERSION)"
    exit 1
fi
echo "PASS $case"

case=the_unpacked_wheel_trains_against_libps_from_anywhere
mkdir -p "$T/site"
$PY -m zipfile -e "$whl" "$T/site"
"$BIN/ps_server" --bind 'tcp://127.0.0.1:*' --num-workers 1 --mode sync --lr 0.5 \
    >"$T/server.log" 2>&1 &
SERVER_PID=$!
ep=""
for _ in $(seq 200); do
    ep=$(sed -n 's/.*listening on \(.*\)$/\1/p' "$T/server.log")
    [ -n "$ep" ] && break
    sleep 0.05
done
cp examples/python_push_pull.py "$T/push_pull.py"
(cd / && env PYTHONPATH="$T/site" PS_LIBRARY="$LIBDIR/libps.so" PS_SERVERS="$ep" \
    timeout 60 $PY "$T/push_pull.py") >"$T/run.log" 2>&1
rc=$?
where=$(cd / && env PYTHONPATH="$T/site" PS_LIBRARY="$LIBDIR/libps.so" $PY -c \
    'import ps; print(ps.__file__)' 2>&1)
if [ -z "$ep" ]; then
    echo "FAIL $case: the server did not start: $(tail -n 2 "$T/server.log" | tr '\n' ' ')"
elif [ "$where" != "$T/site/ps/__init__.py" ]; then
    echo "FAIL $case: ps imported from $where"
elif [ "$rc" -eq 0 ] && grep -q "w\[0\] = 0.9990234375" "$T/run.log"; then
    echo "PASS $case"
else
    echo "FAIL $case: exit $rc: $(tail -n 3 "$T/run.log" | tr '\n' ' ')"
fi
