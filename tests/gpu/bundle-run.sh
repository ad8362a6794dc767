#!/bin/sh
# run: the wrapper of a ps GPU bundle (tests/gpu/bundle.sh copies it there
# from tests/gpu/bundle-run.sh).
#
#   BUNDLE/run PROGRAM [ARGS...]  PROGRAM with the bundle on the paths: its
#                                 bin/ first on PATH, its lib/ on
#                                 LD_LIBRARY_PATH, its python/ on PYTHONPATH,
#                                 PS_LIBRARY (the ps package's libps.so) and
#                                 PS_BIN_DIR (the tests' and benchmarks')
#   BUNDLE/run --env              those variables as shell assignments:
#                                 eval "$(BUNDLE/run --env)"
#   BUNDLE/run --check            where every library of every program here
#                                 resolves; exit 1 when one does not
#
# lib/*.gz (OpenBLAS) is unpacked on first use into $TMPDIR/ps-bundle-UID/
# (one folder per bundle: the bundle itself stays as small as it was
# carried, and may be read-only).  lib/cxx (libstdc++,
# libgcc_s) joins the path only when the machine's own are too old for the
# programs, and the CUDA toolkit's lib64 only when the programs do not find
# libcublas without it (their run path names /usr/local/cuda/lib64): a
# Python with torch keeps its own.
B=$(cd "$(dirname "$0")" && pwd -P) || exit 1

gunzip_to() {
    if command -v gzip >/dev/null 2>&1; then
        gzip -dc "$1" >"$2"
    else
        python3 -c 'import gzip, shutil, sys
shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
    fi
}

L=$B/lib
dir=${TMPDIR:-/tmp}/ps-bundle-$(id -u)/$(cksum <"$B/MANIFEST" | cut -d' ' -f1)
for z in "$B"/lib/*.gz; do
    [ -f "$z" ] || continue
    so=$(basename "$z" .gz)
    if [ ! -s "$dir/$so" ]; then
        # a temp name, then a rename: runs started at once never load half a file
        if ! mkdir -p "$dir" || ! gunzip_to "$z" "$dir/$so.$$" || ! mv -f "$dir/$so.$$" "$dir/$so"
        then
            rm -f "$dir/$so.$$"
            echo "run: cannot unpack $z into $dir" >&2
            exit 1
        fi
    fi
    case ":$L:" in *":$dir:"*) ;; *) L=$L:$dir ;; esac
done

# probe PROGRAM: its error when it cannot start with LD_LIBRARY_PATH=$L
probe() {
    LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$1" --version 2>&1 >/dev/null
}
case $(probe "$B/bin/ps_server") in
*GLIBCXX* | *CXXABI* | *libstdc++* | *libgcc_s*) L=$L:$B/lib/cxx ;;
esac
case $(probe "$B/bin/ps_worker") in
*libcublas* | *libcudart* | *libcudnn*)
    for d in ${CUDA_HOME:+$CUDA_HOME/lib64 $CUDA_HOME/targets/x86_64-linux/lib} \
        $(command -v nvcc >/dev/null 2>&1 && echo "$(dirname "$(command -v nvcc)")/../lib64") \
        /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        if [ -e "$d/$(head -n 1 "$B/lib/cuda-needs" 2>/dev/null)" ]; then
            L=$L:$d
            break
        fi
    done
    ;;
esac

LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PATH=$B/bin${PATH:+:$PATH}
PYTHONPATH=$B/python${PYTHONPATH:+:$PYTHONPATH}
PS_LIBRARY=$B/lib/libps.so
PS_BIN_DIR=$B/bin
PS_BUNDLE=$B
export LD_LIBRARY_PATH PATH PYTHONPATH PS_LIBRARY PS_BIN_DIR PS_BUNDLE

case $1 in
--env)
    for v in LD_LIBRARY_PATH PATH PYTHONPATH PS_LIBRARY PS_BIN_DIR PS_BUNDLE; do
        eval "printf \"export %s='%s'\\n\" $v \"\$$v\""
    done
    exit 0
    ;;
--check)
    if ! command -v ldd >/dev/null 2>&1; then
        echo "run --check: no ldd on this machine" >&2
        exit 1
    fi
    bad=0
    for f in "$B"/bin/* "$B"/tests/* "$B"/bench/* "$B"/lib/*.so.* "$dir"/*.so*; do
        [ -f "$f" ] && [ ! -L "$f" ] || continue
        case $f in *.gz) continue ;; esac
        ldd "$f" 2>&1 | sed -n 's/^[[:space:]]*\([^ ]*\) => \(.*\) (0x.*/\1 \2/p; s/^[[:space:]]*\([^ ]*\) => not found/\1 NOT-FOUND/p' |
            sed "s|^|${f#"$B"/}: |"
    done >"${TMPDIR:-/tmp}/ps-bundle-check.$$"
    if grep -q NOT-FOUND "${TMPDIR:-/tmp}/ps-bundle-check.$$"; then
        echo "run --check: libraries not found:"
        grep NOT-FOUND "${TMPDIR:-/tmp}/ps-bundle-check.$$" | sed 's/ NOT-FOUND/ => not found/'
        bad=1
    fi
    echo "run --check: where the libraries resolve:"
    cut -d' ' -f2- "${TMPDIR:-/tmp}/ps-bundle-check.$$" | grep -v NOT-FOUND | sort -u |
        sed "s|$B/|bundle: |; s|$dir/|bundle (unpacked): |; s|^|  |"
    rm -f "${TMPDIR:-/tmp}/ps-bundle-check.$$"
    exit $bad
    ;;
'' | -h | --help)
    sed -n '2,20s/^# \{0,1\}//p' "$0"
    exit 2
    ;;
esac
exec "$@"
