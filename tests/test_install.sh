#!/bin/sh
# The build as a new user meets it, and make install / uninstall:
#  - make on a machine without the Debian packages names them and `make deps`
#    before compiling anything;
#  - libps.so exports only ps_ names;
#  - make install PREFIX=<temp>: a C program (examples/push_pull.c) builds
#    with `pkg-config --cflags --libs ps` alone and runs on libps.so.0
#    against the installed ps_server; the installed Python package imports
#    from anywhere and finds the installed library;
#  - DESTDIR stages under PREFIX's paths; make uninstall leaves nothing.
# One PASS/FAIL/SKIP line per case (tests/run.sh counts them).
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
BIN=$(cd "${PS_BIN_DIR:-bin}" 2>/dev/null && pwd -P) || BIN=$ROOT/bin
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_install.XXXXXX") || exit 1
SERVER_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
    [ -n "$PS_TEST_KEEP" ] || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
failed=0
pass() { echo "PASS $1"; }
fail() {
    echo "FAIL $1: $2"
    failed=1
    [ -n "$3" ] && [ -f "$3" ] && { echo "---- $1: $3" >&2; tail -n 30 "$3" >&2; }
}
# start_server BIN: a sync ps_server for 1 worker; sets ep and SERVER_PID
start_server() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
    rm -f "$T/server.log"
    "$1" --bind 'tcp://127.0.0.1:*' --num-workers 1 --mode sync --lr 0.5 >"$T/server.log" 2>&1 &
    SERVER_PID=$!
    ep=""
    for _ in $(seq 100); do
        ep=$(sed -n 's/.*listening on \(.*\)$/\1/p' "$T/server.log" 2>/dev/null)
        [ -n "$ep" ] && return 0
        sleep 0.05
    done
}
# a make of its own: not the jobserver or variables of a `make test` around us
MAKE_BIN=$(command -v make)
mk() { /usr/bin/env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL "$MAKE_BIN" --no-print-directory "$@"; }

if [ "$SAN" = 1 ]; then
    echo "SKIP install: skipped: SAN=1 programs and libraries are not for installing (the plain make test runs this)"
    exit 0
fi

# ---- a machine without the packages: names them before compiling anything
case=build_names_missing_packages_first
PKG_CONFIG_LIBDIR=/nonexistent mk -n all >"$T/nopkg.out" 2>&1
rc=$?
mkdir -p "$T/nopc"
ln -s "$(command -v cc)" "$T/nopc/cc"
PATH=$T/nopc mk -n all >"$T/nopc.out" 2>&1
rc2=$?
if [ "$rc" -eq 0 ] || ! grep -q "missing Debian packages: libzmq3-dev libmsgpack-dev" "$T/nopkg.out" ||
    ! grep -q "make deps" "$T/nopkg.out" || grep -q "^cc " "$T/nopkg.out"; then
    fail $case "without the .pc files, make exited $rc" "$T/nopkg.out"
elif [ "$rc2" -eq 0 ] || ! grep -q "missing Debian packages: pkg-config" "$T/nopc.out"; then
    fail $case "without pkg-config, make exited $rc2" "$T/nopc.out"
else
    pass $case
fi

# ---- the shared library: versioned, and only ps_ names exported
case=libps_so_is_versioned_and_exports_only_ps_names
soname=$(objdump -p lib/libps.so 2>/dev/null | awk '/SONAME/ { print $2 }')
others=$(nm -D --defined-only lib/libps.so | awk '$3 !~ /^ps_/ && $3 != "PS_0" { print $3 }')
if [ "$soname" != libps.so.0 ] || [ "$(readlink lib/libps.so.0)" != libps.so.0.1.0 ]; then
    fail $case "soname '$soname', libps.so.0 -> $(readlink lib/libps.so.0)"
elif [ -n "$others" ]; then
    fail $case "exports $(echo $others | head -c 300)"
elif nm -D --defined-only lib/libps.so | grep -q " psc_"; then
    fail $case "exports internal psc_ names"
else
    pass $case
fi

# ---- make install into a prefix; a C user and a Python user of it
case=install_then_a_c_program_builds_with_pkg_config_and_runs
P=$T/prefix
if ! mk install PREFIX="$P" >"$T/install.out" 2>&1; then
    fail $case "make install PREFIX=$P failed" "$T/install.out"
else
    flags=$(PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config --cflags --libs ps 2>"$T/pc.err")
    # the example's source only: its own directory and the installed header
    if ! cc -std=c11 -Wall -Werror -o "$T/push_pull" examples/push_pull.c $flags \
        >"$T/cc.out" 2>&1; then
        fail $case "cc examples/push_pull.c $flags failed" "$T/cc.out"
    elif ! env -u LD_LIBRARY_PATH ldd "$T/push_pull" | grep -q "libps.so.0 => $P/lib/libps.so.0"; then
        # ps.pc carries an rpath for a prefix outside the loader's directories
        fail $case "without LD_LIBRARY_PATH the program does not load $P/lib/libps.so.0: $(ldd "$T/push_pull" | grep libps)"
    else
        start_server "$P/bin/ps_server"
        env -u LD_LIBRARY_PATH timeout 20 "$T/push_pull" "$ep" >"$T/run.out" 2>&1
        if grep -q "w1: 0.75 1.875 3.5 3" "$T/run.out"; then
            pass $case
        else
            fail $case "the installed program against the installed server" "$T/run.out"
        fi
    fi
fi

case=installed_python_package_imports_anywhere_and_finds_the_library
pydir=$(ls -d "$P"/lib/python3*/dist-packages 2>/dev/null | head -n 1)
if [ ! -x /usr/bin/python3 ]; then
    echo "SKIP $case: skipped: no /usr/bin/python3"
elif [ -z "$pydir" ]; then
    fail $case "no $P/lib/python3*/dist-packages after make install"
else
    (cd / && env -u PS_LIBRARY PYTHONPATH="$pydir" /usr/bin/python3 -c \
        'import ps, ps.torch; print(ps.__file__); print(ps.library_path)') >"$T/py.out" 2>&1
    if ! grep -qx "$pydir/ps/__init__.py" "$T/py.out" ||
        ! grep -qx "$P/lib/libps.so.0" "$T/py.out"; then
        fail $case "import ps from / with PYTHONPATH=$pydir" "$T/py.out"
    elif ! start_server "$BIN/ps_server" ||
        ! (cd / && env -u PS_LIBRARY PYTHONPATH="$pydir" PS_SERVERS="$ep" PS_MODE=sync timeout 30 \
        /usr/bin/python3 "$ROOT/examples/python_push_pull.py") >"$T/pyrun.out" 2>&1 ||
        ! grep -q "w\[0\] = " "$T/pyrun.out"; then
        fail $case "examples/python_push_pull.py on the installed package" "$T/pyrun.out"
    else
        pass $case
    fi
fi
[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
SERVER_PID=""

case=uninstall_removes_exactly_what_install_put
mk uninstall PREFIX="$P" >"$T/uninstall.out" 2>&1
left=$(find "$P" ! -type d | sed "s|^$P/||")
if [ -n "$left" ]; then
    fail $case "left behind: $(echo $left | head -c 300)" "$T/uninstall.out"
else
    pass $case
fi

case=destdir_stages_files_under_prefix_paths
S=$T/stage
if ! mk install DESTDIR="$S" PREFIX=/usr >"$T/stage.out" 2>&1; then
    fail $case "make install DESTDIR=$S PREFIX=/usr failed" "$T/stage.out"
elif [ ! -f "$S/usr/lib/python3/dist-packages/ps/client.py" ] ||
    [ ! -L "$S/usr/lib/libps.so.0" ] || [ ! -x "$S/usr/bin/ps_server" ] ||
    ! grep -qx "prefix=/usr" "$S/usr/lib/pkgconfig/ps.pc" ||
    ! grep -q "'/usr/lib'" "$S/usr/lib/python3/dist-packages/ps/_installed.py"; then
    fail $case "files or paths not as expected: $(cd "$S" && find . ! -type d | head -n 20 | tr '\n' ' ')"
else
    mk uninstall DESTDIR="$S" PREFIX=/usr >>"$T/stage.out" 2>&1
    left=$(find "$S" ! -type d)
    if [ -n "$left" ]; then
        fail $case "uninstall left: $(echo $left | head -c 300)" "$T/stage.out"
    else
        pass $case
    fi
fi
exit $failed
