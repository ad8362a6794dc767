#!/bin/sh
# Train Fashion-MNIST on this host with 2 parameter servers and one worker per
# GPU (2 CPU workers when there is no GPU), first in sync then in async mode,
# and compare the two: test accuracy, throughput, and loss/throughput plots
# over wall time.
#
# usage: examples/multi_gpu_one_host.sh [--mode sync|async|both] [--model SPEC]
#            [--epochs E] [--out DIR] [worker flags...]
#
#   --mode    sync, async or both (default both: sync first)
#   --model   mlp:784-256-128-10 (default) or cnn
#   --epochs  passes over the data (default 2)
#   --out     where logs, CSVs and plots go (default out/)
#   anything else goes to the workers, e.g. --batch 128 --lr 0.1 --steps 500
#   (after the script's own --log-every 20, so a later --log-every wins)
#
# Writes OUT/MODE.log (the whole output), OUT/MODE-worker0.csv (worker 0's
# --log-csv), OUT/loss.png and OUT/throughput.png (with gnuplot).  Exits
# non-zero when a run fails.  Environment: PS_BIN_DIR (default bin/ next to
# this directory), PS_DATA (default /usr/share/datasets/fashion-mnist, from
# the Debian package dataset-fashion-mnist).

me=multi_gpu_one_host
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
BIN=${PS_BIN_DIR:-$root/bin}

usage() {
    sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
}
die() {
    echo "$me: $*" >&2
    exit 2
}

mode=both model=mlp:784-256-128-10 epochs=2 out=out have_data=0
# Take our flags wherever they are; keep the rest, in order, in "$@".
n=$#
while [ "$n" -gt 0 ]; do
    a=$1
    shift
    n=$((n - 1))
    case $a in
    --mode | --model | --epochs | --out)
        [ "$n" -gt 0 ] || die "$a needs a value"
        v=$1
        shift
        n=$((n - 1))
        ;;
    --mode=* | --model=* | --epochs=* | --out=*)
        v=${a#*=}
        a=${a%%=*}
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        case $a in --data | --data=*) have_data=1 ;; esac
        set -- "$@" "$a"
        continue
        ;;
    esac
    case $a in
    --mode) mode=$v ;;
    --model) model=$v ;;
    --epochs) epochs=$v ;;
    --out) out=$v ;;
    esac
done

case $mode in
sync | async) modes=$mode ;;
both) modes="sync async" ;;
*) die "--mode must be sync, async or both, got '$mode'" ;;
esac
case $epochs in
'' | *[!0-9]* | 0) die "--epochs must be a positive integer, got '$epochs'" ;;
esac
[ -n "$out" ] || die "--out must not be empty"
[ -x "$BIN/ps_launch" ] || die "$BIN/ps_launch not found; build with make (or set PS_BIN_DIR)"

data=${PS_DATA:-/usr/share/datasets/fashion-mnist}
if [ "$have_data" = 0 ]; then
    case $data in
    synthetic:*) ;;
    *)
        [ -d "$data" ] || die "Fashion-MNIST not found in $data: install the Debian package" \
            "dataset-fashion-mnist (make deps), or set PS_DATA=DIR (or synthetic:N)"
        ;;
    esac
    set -- --data "$data" "$@"
fi

# One worker per GPU, found the way ps_launch --gpus auto finds them.
gpus=0
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -cv '^$\|^-1$\|^NoDevFiles$')
elif [ -d /proc/driver/nvidia/gpus ]; then
    gpus=$(ls /proc/driver/nvidia/gpus | wc -l)
fi
if [ "$gpus" -eq 0 ] && [ -z "${CUDA_VISIBLE_DEVICES+set}" ] && command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if [ "$gpus" -gt 0 ]; then
    workers=$gpus what="$gpus GPU workers"
else
    workers=2 what="2 CPU workers"
fi

mkdir -p "$out" || exit 1
summary=""
for m in $modes; do
    log=$out/$m.log
    csv=$out/$m-worker0.csv
    rm -f "$csv" "$out/$m.rc"
    echo "== $me: $m: 2 servers, $what, $model, $epochs epochs"
    # ps_launch's status survives the pipe to tee through a file
    {
        "$BIN/ps_launch" --servers 2 --workers "$workers" --gpus auto --mode "$m" \
            -- --model "$model" --epochs "$epochs" --log-every 20 --log-csv "$csv" "$@"
        echo $? >"$out/$m.rc"
    } 2>&1 | tee "$log"
    rc=$(cat "$out/$m.rc" 2>/dev/null || echo 1)
    rm -f "$out/$m.rc"
    if [ "$rc" -ne 0 ]; then
        echo "$me: the $m run failed (ps_launch exit status $rc); see $log" >&2
        exit 1
    fi
    # worker 0's test accuracy; throughput summed over the workers
    acc=$(sed -n 's/^\[worker 0\] .*summary:.*test accuracy \([0-9.]*\).*/\1/p' "$log" | tail -n 1)
    rate=$(sed -n 's/^\[worker [0-9]*\] .*summary:.* \([0-9.]*\) samples\/s.*/\1/p' "$log" |
        awk '{ s += $1 } END { if (NR) printf "%.0f", s }')
    echo "== $me: $m: test accuracy ${acc:-?}, ${rate:-?} samples/s over $workers workers"
    summary="$summary$(printf '%-6s %-9s %s' "$m" "${acc:-?}" "${rate:-?}")
"
done

echo
printf '%-6s %-9s %s\n' mode accuracy samples/s
printf '%s' "$summary"
echo

if ! command -v gnuplot >/dev/null 2>&1; then
    echo "$me: gnuplot not found (apt-get install gnuplot-nox); skipping $out/loss.png and $out/throughput.png"
    exit 0
fi
if gnuplot -e "outdir='$out'; modes='$modes'" "$here/plot.gnuplot"; then
    echo "$me: wrote $out/loss.png and $out/throughput.png"
else
    echo "$me: gnuplot failed; no plots" >&2
    exit 1
fi
