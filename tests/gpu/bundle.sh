#!/bin/sh
# Put the build into one folder that runs on a machine with only glibc, the
# NVIDIA driver and the CUDA toolkit (make gpu-bundle runs this; so does
# tests/test_gpu_bundle.sh, into a scratch folder):
#
#   bin/      ps_server ps_worker ps_launch ps_keygen
#   lib/      libps.so, and every shared library those and the tests load
#             that is neither glibc's nor CUDA's (libzmq and what it needs,
#             msgpack-c, OpenBLAS and its gfortran runtime, zlib, ...);
#             libraries over 8 MiB travel gzipped (OpenBLAS: 36 MiB, 11
#             gzipped), unpacked by `run` where they are first needed
#   lib/cxx/  libstdc++ and libgcc_s, used only where the machine's own are
#             older than this build needs (they need this glibc or newer,
#             and a Python with torch must keep its own when it can)
#   tests/    test_cuda, test_train, libfake_cudart.so (tests/fake_cudart.c)
#   bench/    the benchmark programs (not repl_bench: it needs etcd)
#             (bin/, tests/ and bench/ without debug information: strip
#             --strip-debug keeps the symbols)
#   python/   the ps package (pure Python over libps.so)
#   run       the wrapper: `run PROGRAM ARGS` runs PROGRAM with the above on
#             the paths (tests/gpu/bundle-run.sh)
#   MANIFEST  what was built, where and with what, and what the machine must
#             have: glibc, the CUDA libraries (the device's own, matching its
#             driver: libcublas alone is 600 MB with libcublasLt) and cuDNN
#             (libcudnn.so.9, with its engines beside it)
#
#   sh tests/gpu/bundle.sh --out DIR [--archs "sm_80 sm_90 + PTX compute_90"]
#   environment: BUILD (build), BIN (bin), LIB (lib), NVCC (for the MANIFEST)
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
LIB=${LIB:-lib}
out="" archs=""
while [ $# -gt 0 ]; do
    case $1 in
    --out) out=$2; shift 2 ;;
    --archs) archs=$2; shift 2 ;;
    *) echo "bundle.sh: unknown argument '$1' (--out DIR [--archs TEXT])" >&2; exit 2 ;;
    esac
done
if [ -z "$out" ]; then
    echo "bundle.sh: --out DIR is required" >&2
    exit 2
fi
die() {
    echo "bundle.sh: $*" >&2
    exit 1
}
for f in "$BIN/ps_server" "$BIN/ps_worker" "$BIN/ps_launch" "$BIN/ps_keygen" "$LIB/libps.so"; do
    [ -e "$f" ] || die "$f is not built (make first)"
done
command -v ldd >/dev/null 2>&1 || die "ldd not found (it lists the libraries to carry)"

# never carried: glibc (the machine's loader must match it), the loader's
# own, and CUDA's (the device's toolkit and driver)
system_lib() {
    case $1 in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | \
        libdl.so.* | librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libnsl.so.*) return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnvidia-*) return 0 ;;
    # cuDNN: 0.1 MB itself, but it loads its engines (hundreds of MB) from
    # its own folder at run time; the device's toolkit has them
    libcudnn.so.* | libcudnn_*.so.*) return 0 ;;
    esac
    return 1
}

# a folder replaced must be an earlier bundle (or empty): --out is removed first
if [ -d "$out" ] && [ ! -f "$out/MANIFEST" ] && [ -n "$(ls -A "$out")" ]; then
    die "$out is not empty and not a bundle: give a new folder"
fi
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib/cxx" "$out/tests" "$out/bench" "$out/python" ||
    die "cannot make $out"
cp -p "$BIN/ps_server" "$BIN/ps_worker" "$BIN/ps_launch" "$BIN/ps_keygen" "$out/bin/" || exit 1
so=$(readlink -f "$LIB/libps.so")
cp -p "$so" "$out/lib/" || exit 1
soname=$(objdump -p "$so" 2>/dev/null | sed -n 's/^ *SONAME *//p')
[ -n "$soname" ] || soname=libps.so.0
ln -sf "$(basename "$so")" "$out/lib/$soname"
ln -sf "$soname" "$out/lib/libps.so"
for t in test_cuda test_train libfake_cudart.so; do
    [ -e "$BUILD/tests/$t" ] && cp -p "$BUILD/tests/$t" "$out/tests/"
done
# the benchmark programs (stripped below with the others)
for b in "$BUILD"/bench/*_bench; do
    case $b in */repl_bench) continue ;; esac # replicas: it needs etcd, not carried
    [ -x "$b" ] && cp -p "$b" "$out/bench/"
done
# our programs without their DWARF (their symbols stay, for backtraces): the
# bundle travels to the device machine, where its size counts
if command -v strip >/dev/null 2>&1; then
    for f in "$out"/bin/* "$out"/tests/* "$out"/bench/*; do
        [ -f "$f" ] && strip --strip-debug "$f" 2>/dev/null
    done
fi
cp -R python/ps "$out/python/" || exit 1
find "$out/python" -name __pycache__ -prune -exec rm -rf {} + 2>/dev/null
cp -p tests/gpu/bundle-run.sh "$out/run" && chmod 755 "$out/run" || exit 1

# every library an ELF here loads, by the name it asks for; "not found" stops
elfs=$(find "$out/bin" "$out/tests" "$out/bench" "$out/lib" -maxdepth 1 -type f \
    ! -name '*.py' | sort)
needs=$(for f in $elfs; do ldd "$f" 2>/dev/null | sed "s|^|$f: |"; done)
missing=$(echo "$needs" | grep 'not found')
[ -z "$missing" ] || die "libraries not found here, so they cannot be carried:
$missing"
cuda_needs=""
echo "$needs" | sed -n 's/^[^:]*: *\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' | sort -u >"$out/.libs"
while read -r name path; do
    if system_lib "$name"; then
        case $name in libcud* | libcublas*) cuda_needs="$cuda_needs $name" ;; esac
        continue
    fi
    case $name in
    libstdc++.so.* | libgcc_s.so.*) dest=$out/lib/cxx/$name ;;
    *) dest=$out/lib/$name ;;
    esac
    [ -e "$dest" ] || [ -e "$dest.gz" ] || cp -L "$path" "$dest" || die "cannot copy $path"
done <"$out/.libs"
rm -f "$out/.libs"
# the big ones travel gzipped (the carry to a device is bounded)
for f in "$out"/lib/*.so*; do
    [ -L "$f" ] && continue
    if [ "$(wc -c <"$f")" -gt 8388608 ] && ! [ "$(basename "$f")" = "$(basename "$so")" ]; then
        gzip -6 -n "$f" || die "cannot gzip $f"
    fi
done

# newest symbol VERSION_ (GLIBC_, GLIBCXX_) FILES... need
newest() {
    _v=$1
    shift
    for f in "$@"; do
        [ -f "$f" ] || continue
        case $f in *.gz) gzip -dc "$f" >"$out/.probe" && f=$out/.probe ;; esac
        objdump -T "$f" 2>/dev/null | grep -o "${_v}[0-9.]*"
    done | sort -uV | tail -n 1
    rm -f "$out/.probe"
}
glibc_need=$(newest GLIBC_ $elfs "$out"/lib/*.so*)
cxx_glibc_need=$(newest GLIBC_ "$out"/lib/cxx/*)
cxx_need=$(newest GLIBCXX_ $elfs "$out"/lib/*.so*)
{
    echo "ps GPU bundle, made $(date -u '+%Y-%m-%d %H:%M UTC') by tests/gpu/bundle.sh"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built on: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"'), $(${CC:-cc} --version 2>/dev/null | head -n 1)"
    echo "nvcc: $("${NVCC:-/usr/local/cuda/bin/nvcc}" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p')"
    if [ -z "$cuda_needs" ]; then
        echo "cuda code: none (built without the CUDA backend)"
    else
        echo "cuda code: ${archs:-not said (bundle.sh --archs)}"
    fi
    echo "needs glibc: ${glibc_need#GLIBC_} or newer; libstdc++ with ${cxx_need:-any}, else lib/cxx (which needs glibc ${cxx_glibc_need#GLIBC_})"
    echo "needs from the machine's CUDA:$(echo "$cuda_needs" | tr ' ' '\n' | sort -u | tr '\n' ' ')"
    echo "carried libraries:"
    (cd "$out/lib" && ls -1 | grep -v '^cxx$' | sed 's/^/  /'; ls -1 cxx | sed 's/^/  cxx\//')
    echo "size: $(du -sk "$out" | cut -f1) KiB"
} >"$out/MANIFEST"
# one name a line; empty without the CUDA backend (run looks for the first)
for n in $cuda_needs; do echo "$n"; done | sort -u >"$out/lib/cuda-needs"
echo "bundle.sh: $out, $(du -sh "$out" | cut -f1); needs glibc ${glibc_need#GLIBC_} and, from the machine's CUDA: $(tr '\n' ' ' <"$out/lib/cuda-needs")"
