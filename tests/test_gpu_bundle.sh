#!/bin/sh
# The GPU bundle (make gpu-bundle: tests/gpu/bundle.sh) needs nothing of
# Debian's but glibc: a bundle made from this build runs in a namespace
# where every library it carries is hidden from the system's library folder
# (a GPU machine without Debian's libzmq, msgpack-c, OpenBLAS, gfortran,
# libsodium, zlib or libstdc++), with an environment of PATH=/usr/bin:/bin
# and nothing else (env -i): its wrapper's --check resolves every library
# of every program into the bundle, glibc or CUDA; a server and a CPU worker
# train; the Python package pushes and pulls; CUDA programs load (and say
# "no CUDA device" where there is none).  Without user namespaces the
# hiding part is skipped and the rest runs under env -i alone.
BUILD=${BUILD:-build}
BIN=${PS_BIN_DIR:-bin}
if [ "$SAN" = 1 ]; then
    echo "SKIP gpu_bundle: skipped: SAN=1 (a sanitized build is not bundled)"
    exit 0
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_bundle.XXXXXX") || exit 1
T=$(cd "$T" && pwd -P)
trap 'rm -rf "$T"' EXIT
trap 'exit 1' INT TERM HUP
B=$T/bundle
mkdir -p "$T/tmp"

if ! BUILD=$BUILD BIN=$BIN LIB=$(dirname "$BIN")/lib sh tests/gpu/bundle.sh --out "$B" \
    >"$T/bundle.log" 2>&1; then
    echo "FAIL bundle_is_made: $(tail -n 3 "$T/bundle.log" | tr '\n' ' ')"
    exit 1
fi
cuda=0
[ -s "$B/lib/cuda-needs" ] && cuda=1

# ---- what it holds, and its size
bad=""
kib=$(du -sk "$B" | cut -f1)
[ "$kib" -lt 32768 ] || bad="$bad $kib KiB, over 32 MiB;"
for l in libps.so.0 libzmq.so.5 libmsgpackc.so.2 libopenblas.so.0.gz libgfortran.so.5 \
    libsodium.so.23 libz.so.1 cxx/libstdc++.so.6 cxx/libgcc_s.so.1; do
    [ -e "$B/lib/$l" ] || bad="$bad no lib/$l;"
done
for l in libc.so.6 libm.so.6 libcudart.so.13 libcublas.so.13 libcuda.so.1 libcudnn.so.9; do
    [ -e "$B/lib/$l" ] && bad="$bad carries $l (the machine's own must be used);"
done
for f in bin/ps_server bin/ps_worker bin/ps_launch python/ps/__init__.py python/ps/torch/_exchange.py \
    run MANIFEST; do
    [ -e "$B/$f" ] || bad="$bad no $f;"
done
if [ "$cuda" = 1 ]; then
    for f in tests/test_cuda tests/test_train tests/libfake_cudart.so; do
        [ -e "$B/$f" ] || bad="$bad no $f;"
    done
    grep -qx 'libcudart.so.13\|libcudart.so.1[0-9]' "$B/lib/cuda-needs" ||
        bad="$bad lib/cuda-needs does not name libcudart;"
    # built with cuDNN: the machine's is named, none is carried
    if ldd "$BIN/ps_worker" 2>/dev/null | grep -q 'libcudnn\.so'; then
        grep -qx 'libcudnn\.so\.[0-9]*' "$B/lib/cuda-needs" ||
            bad="$bad lib/cuda-needs does not name libcudnn;"
        ls "$B/lib" | grep -q '^libcudnn' && bad="$bad carries cuDNN;"
    fi
fi
if [ -z "$bad" ]; then
    echo "PASS bundle_holds_its_libraries_not_glibc_or_cuda_and_is_small ($kib KiB)"
else
    echo "FAIL bundle_holds_its_libraries_not_glibc_or_cuda_and_is_small:$bad"
fi

# ---- in a clean environment: one script, run in the namespace when it can
gpu=0
command -v nvidia-smi >/dev/null 2>&1 && [ -n "$(nvidia-smi -L 2>/dev/null)" ] && gpu=1
numpy=0
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import numpy' 2>/dev/null && numpy=1
cat >"$T/inside.sh" <<'EOF'
# inside.sh B T HIDE GPU CUDA NUMPY ROOT: the checks, printing PASS/FAIL/SKIP lines
B=$1 T=$2 HIDE=$3 GPU=$4 CUDA=$5 NUMPY=$6 ROOT=$7
L=/usr/lib/x86_64-linux-gnu
if [ "$HIDE" = 1 ]; then
    # every library the bundle carries, by its name up to ".so" (libzmq:
    # libzmq.so.5, libzmq.so, libzmq.a...), leaves the system's folder: a
    # folder of links to all the rest is mounted over it
    stems=$(cd "$B/lib" && ls -1 *.so* cxx/* | sed 's|^cxx/||; s/\.so.*//' | sort -u |
        grep -v '^libps$' | sed 's/[.+]/\\&/g' | tr '\n' '|')
    mkdir -p "$T/orig" "$T/farm" &&
        mount --bind "$L" "$T/orig" &&
        find "$T/orig" -mindepth 1 -maxdepth 1 -printf '%f\n' |
        grep -v -E "^(${stems%|})\.(so|a)" | sed "s|^|$T/orig/|" | xargs ln -s -t "$T/farm" &&
        mount --bind "$T/farm" "$L" || { echo "FAIL clean_namespace_is_made"; exit 1; }
    hidden=""
    for l in libzmq.so.5 libmsgpackc.so.2 libopenblas.so.0 libgfortran.so.5 libsodium.so.23 \
        libz.so.1 libstdc++.so.6; do
        [ -e "$L/$l" ] && hidden="$hidden $l is still there;"
    done
    if [ -n "$hidden" ]; then
        echo "FAIL debian_libraries_are_hidden:$hidden"
    elif "$B/bin/ps_server" --version >"$T/bare.log" 2>&1; then
        echo "FAIL debian_libraries_are_hidden: ps_server ran without the bundle's libraries"
    elif ! grep -q "libzmq.so.5" "$T/bare.log"; then
        echo "FAIL debian_libraries_are_hidden: ps_server failed, but not for libzmq: $(cat "$T/bare.log")"
    else
        echo "PASS debian_libraries_are_hidden (ps_server alone: $(head -c 120 "$T/bare.log"))"
    fi
else
    echo "SKIP debian_libraries_are_hidden: skipped: no user and mount namespaces here (unshare -rm)"
fi

# from here on, env -i: PATH and a scratch TMPDIR, nothing else
E="env -i PATH=/usr/bin:/bin HOME=$T TMPDIR=$T/tmp"

# --check: every library of every program resolves, none to a hidden one
if $E "$B/run" --check >"$T/check.log" 2>&1; then
    wrong=$(grep -E 'lib(zmq|msgpackc|openblas|gfortran|sodium)\.so' "$T/check.log" | grep -v 'bundle')
    if [ -z "$wrong" ]; then
        echo "PASS bundle_check_resolves_every_library_into_the_bundle_glibc_or_cuda"
    else
        echo "FAIL bundle_check_resolves_every_library_into_the_bundle_glibc_or_cuda: $wrong"
    fi
else
    echo "FAIL bundle_check_resolves_every_library_into_the_bundle_glibc_or_cuda: $(grep -A3 'not found' "$T/check.log" | tr '\n' ' ' | cut -c1-400)"
fi

# server NAME: a server of the bundle on a free port: sets ep ("" when it
# did not start) and srv
server() {
    $E timeout 60 "$B/run" ps_server --bind 'tcp://127.0.0.1:*' --mode async --lr 0.5 \
        >"$T/$1.log" 2>&1 &
    srv=$!
    ep="" i=0
    while [ -z "$ep" ] && [ "$i" -lt 100 ]; do
        ep=$(sed -n 's/.*listening on \(.*\)$/\1/p' "$T/$1.log")
        [ -n "$ep" ] || { sleep 0.1; i=$((i + 1)); }
    done
}
stop() {
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
}

# a server and a CPU worker
server server
if [ -z "$ep" ]; then
    echo "FAIL server_and_cpu_worker_train_from_the_bundle: no server: $(tail -n 2 "$T/server.log")"
else
    $E timeout 60 "$B/run" ps_worker --servers "$ep" --mode async --device cpu \
        --model mlp:784-32-10 --data synthetic:1024 --batch 32 --steps 20 >"$T/worker.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q "summary:" "$T/worker.log"; then
        echo "PASS server_and_cpu_worker_train_from_the_bundle"
    else
        echo "FAIL server_and_cpu_worker_train_from_the_bundle: exit $rc: $(tail -n 2 "$T/worker.log" | tr '\n' ' ')"
    fi
fi
stop

# the Python package over the bundle's libps.so, outside the source tree
# (Debian's numpy, whose OpenBLAS is hidden too, takes the bundle's)
if [ "$NUMPY" != 1 ]; then
    echo "SKIP python_package_pushes_and_pulls_from_the_bundle: skipped: no /usr/bin/python3 with numpy"
else
    server pyserver
    cp "$ROOT/examples/python_push_pull.py" "$T/push_pull.py"
    (cd "$T" && $E PS_SERVERS="$ep" PS_MODE=async timeout 60 "$B/run" /usr/bin/python3 push_pull.py \
        >"$T/python.log" 2>&1)
    rc=$?
    stop
    where=$(cd "$T" && $E timeout 60 "$B/run" /usr/bin/python3 -c \
        'import ps, ps._lib; print(ps.__file__, ps._lib.path)' 2>&1)
    # 10 steps of w -= 0.5 (w - 1) from 0: 1 - 2^-10
    if [ "$where" != "$B/python/ps/__init__.py $B/lib/libps.so" ]; then
        echo "FAIL python_package_pushes_and_pulls_from_the_bundle: ps and libps.so from $where"
    elif [ "$rc" -eq 0 ] && grep -q "w\[0\] = 0.9990234375" "$T/python.log"; then
        echo "PASS python_package_pushes_and_pulls_from_the_bundle"
    else
        echo "FAIL python_package_pushes_and_pulls_from_the_bundle: exit $rc: $(tail -n 3 "$T/python.log" | tr '\n' ' ')"
    fi
fi

# CUDA programs: they load (libcudart and cuBLAS from the machine's CUDA)
if [ "$CUDA" != 1 ]; then
    echo "SKIP cuda_programs_load_from_the_bundle: skipped: built without the CUDA backend"
else
    $E timeout 120 "$B/run" "$B/tests/test_cuda" fill_sets_every_element >"$T/cuda.log" 2>&1
    rc=$?
    $E timeout 60 "$B/run" ps_worker --servers none --device cuda:0 --model mlp:784-32-10 \
        --data synthetic:256 --steps 2 >"$T/gpu_worker.log" 2>&1
    wrc=$?
    if [ "$rc" -ne 0 ] || grep -q '^FAIL' "$T/cuda.log" || ! grep -q '^\(PASS\|SKIP\) ' "$T/cuda.log"; then
        echo "FAIL cuda_programs_load_from_the_bundle: test_cuda exit $rc: $(tail -n 2 "$T/cuda.log" | tr '\n' ' ')"
    elif [ "$GPU" = 1 ] && [ "$wrc" -ne 0 ]; then
        echo "FAIL cuda_programs_load_from_the_bundle: ps_worker on cuda:0 exit $wrc: $(tail -n 1 "$T/gpu_worker.log")"
    elif [ "$GPU" = 0 ] && { [ "$wrc" -ne 2 ] || ! grep -q "no CUDA device" "$T/gpu_worker.log"; }; then
        echo "FAIL cuda_programs_load_from_the_bundle: ps_worker on cuda:0 without a GPU: exit $wrc: $(tail -n 1 "$T/gpu_worker.log")"
    else
        echo "PASS cuda_programs_load_from_the_bundle ($(grep -m1 '^\(PASS\|SKIP\) ' "$T/cuda.log" | cut -c1-60))"
    fi
fi
EOF

if unshare -rm true 2>/dev/null; then
    unshare -rm sh "$T/inside.sh" "$B" "$T" 1 "$gpu" "$cuda" "$numpy" "$(pwd -P)"
else
    sh "$T/inside.sh" "$B" "$T" 0 "$gpu" "$cuda" "$numpy" "$(pwd -P)"
fi
