#!/bin/sh
# gpu_bench: for a machine with an NVIDIA GPU (run by tests/gpu/check.sh).
# Samples/s of the MLP and the CNN on cuda:0: compute only (ps_worker
# --servers none) against through 1 server, async and sync, with 1 worker and
# with 2 workers sharing the GPU; the overlap ratio is compute-only samples/s
# over through-servers samples/s (1.00 = communication fully hidden).  With
# PyTorch installed, the same models in PyTorch (same layers, batch, SGD,
# FP32 without TF32, timed steps after warm-up; ours leave out the first
# fifth of their steps, --warmup) and ours over PyTorch, the
# CNN also at batch 256; our CNN with cuDNN turned off (PS_CUDNN=0) beside
# it; 2 workers sharing the GPU over 1; comm-wait of 1 async worker; and
# ps.torch's CNN (examples/torch_fashion_mnist.py) on the GPU through 1
# server against the same loop alone (--backend none), alternating.
# Exits 0 with "skipped: no CUDA device" where nvidia-smi finds no GPU.
# The last two lines say how each half went, for tests/gpu/check.sh:
#   gpu_bench: ours: ok | FAILED: why | skipped: why
#   gpu_bench: pytorch: ok: figures | FAILED: why | skipped: why
#   gpu_bench: ps.torch: ok: ratio | FAILED: why | skipped: why
#   GPU_MLP_STEPS (2000)  GPU_CNN_STEPS (600)  GPU_REPS (2)  GPU_DATA (Fashion-MNIST dir)
#   GPU_DEVICE (cuda:0; "cpu" only to try the script itself on a machine without a GPU)
#   BENCH_TIMEOUT (300): seconds any one server, worker or PyTorch run may take
#   GPU_DEADLINE: epoch seconds after which no run starts (0: none)
#   PYTHON (python3): the interpreter whose torch is measured
#   GPU_TORCH_DATA: Fashion-MNIST IDX files for the ps.torch part (default
#   GPU_DATA; skipped when there are none)  GPU_TORCH_STEPS (300)
cd "$(dirname "$0")/.." || exit 1
PYTHON=${PYTHON:-python3}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
if [ "${GPU_DEVICE:-cuda:0}" != cpu ] && { ! command -v nvidia-smi >/dev/null 2>&1 ||
    [ -z "$(timeout 20 nvidia-smi -L 2>/dev/null)" ]; }; then
    echo "gpu_bench: skipped: no CUDA device"
    echo "gpu_bench: ours: skipped: no CUDA device (nvidia-smi lists no GPU)"
    echo "gpu_bench: pytorch: skipped: no CUDA device"
    exit 0
fi
. bench/lib.sh
bench_init

MLP=mlp:784-256-128-10
MLP_STEPS=${GPU_MLP_STEPS:-2000}
CNN_STEPS=${GPU_CNN_STEPS:-600}
REPS=${GPU_REPS:-2}
DATA=${GPU_DATA:-/usr/share/datasets/fashion-mnist}
DEVICE=${GPU_DEVICE:-cuda:0}
BATCH=64
LR=0.05
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -f "$DATA/train-images-idx3-ubyte" ]; then
    DATA=synthetic:60000
fi
echo "gpu: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
echo "host: $(machine_line)"
echo "data: $DATA, batch $BATCH, MLP $MLP_STEPS steps, CNN $CNN_STEPS steps, best of $REPS"

# no evaluation inside the timed loop: enough epochs, evaluation never due;
# a log line every quarter of the run (its comm-wait)
FLAGS="--device $DEVICE --lr $LR --epochs 1000 --eval-every 1000000000"

# measure KIND W MODEL STEPS [BATCH]: samples/s per worker; KIND none|async|sync
# (nothing past the deadline)
measure() {
    in_time || return 1
    # the first fifth is warm-up (cuDNN's plans, kernels loaded on first use),
    # left out of the summary as PyTorch's timing below leaves out its own
    _b=${5:-$BATCH} _le=$(($4 / 4 > 0 ? $4 / 4 : 1)) _wu=$(($4 / 5))
    if [ "$1" = none ]; then
        run_workers "$2" none --model "$3" --data "$DATA" --steps "$4" --batch "$_b" \
            --log-every "$_le" --warmup "$_wu" $FLAGS
        return
    fi
    start_servers 1 "$2" "$1" --lr "$LR" || return 1
    _v=$(run_workers "$2" "$1" --model "$3" --data "$DATA" --steps "$4" --batch "$_b" \
        --log-every "$_le" --warmup "$_wu" $FLAGS)
    _rc=$?
    stop_servers
    [ "$_rc" -eq 0 ] && echo "$_v"
    return $_rc
}

# GPU_DEADLINE (epoch seconds, from tests/gpu/check.sh): no run starts within
# 20 s of it, so the tables of what ran are printed before the check's limit
DEADLINE=${GPU_DEADLINE:-0}
late=0
in_time() { [ "$DEADLINE" -eq 0 ] || [ "$(date +%s)" -lt $((DEADLINE - 20)) ]; }
fail=0
best() { eval "echo \${R_$1:-0}"; }
record() {
    if [ -z "$2" ]; then
        if in_time; then fail=1; else late=1; fi
        return
    fi
    eval "R_$1=\$(fmax \"\$(best $1)\" \"$2\")"
}

if ! out=$(measure none 1 $MLP 20); then
    echo "gpu_bench: ps_worker cannot train on $DEVICE (built without CUDA? run make CUDA=1):" >&2
    tail -n 5 "$WORK/worker0.log" >&2
    echo "gpu_bench: ours: FAILED: ps_worker cannot train on $DEVICE: $(grep -m1 error "$WORK/worker0.log" | cut -c1-160)"
    echo "gpu_bench: pytorch: skipped: not reached"
    exit 1
fi

# comm_wait: the mean comm-wait % of worker 0's log lines of the last run
comm_wait() {
    sed -n 's/.*comm-wait \([0-9.]*\)%.*/\1/p' "$WORK/worker0.log" |
        awk '{ s += $1; n++ } END { if (n) printf "%.1f", s / n }'
}
for model in mlp cnn; do
    if [ "$model" = mlp ]; then spec=$MLP steps=$MLP_STEPS; else spec=cnn steps=$CNN_STEPS; fi
    r=0
    while [ "$r" -lt "$REPS" ]; do
        for w in 1 2; do
            for kind in none async sync; do
                record "${model}_${kind}_$w" "$(measure $kind $w $spec $steps)"
                [ "$w$kind" = 1async ] && eval "CW_$model=\"\${CW_$model:-}\${CW_$model:+ }$(comm_wait)\""
            done
        done
        if [ "$model" = cnn ]; then
            record cnn_none_1_b256 "$(measure none 1 cnn $((steps / 4)) 256)"
            record cnn_async_1_b256 "$(measure async 1 cnn $((steps / 4)) 256)"
            record cnn_nocudnn_1 "$(export PS_CUDNN=0; measure none 1 cnn "$steps")"
            record cnn_nocudnn_1_b256 "$(export PS_CUDNN=0; measure none 1 cnn $((steps / 4)) 256)"
            for how in find fastest; do
                record "cnn_${how}_1" "$(export PS_CUDNN_ALGO=$how; measure none 1 cnn "$steps")"
                record "cnn_${how}_1_b256" \
                    "$(export PS_CUDNN_ALGO=$how; measure none 1 cnn $((steps / 4)) 256)"
            done
        fi
        r=$((r + 1))
    done
done

echo
echo "| model | workers on $DEVICE | mode | compute-only samples/s per worker | through 1 server samples/s per worker | overlap ratio compute/servers |"
echo "| --- | ---: | --- | ---: | ---: | ---: |"
for model in mlp cnn; do
    for w in 1 2; do
        for kind in async sync; do
            awk -v m="$model" -v w="$w" -v k="$kind" -v c="$(best "${model}_none_$w")" \
                -v s="$(best "${model}_${kind}_$w")" 'BEGIN {
                printf "| %s | %d | %s | %.0f | %.0f | %s |\n", m, w, k, c, s,
                    (s > 0 ? sprintf("%.3f", c / s) : "-") }'
        done
    done
done

echo
echo "| model | batch | compute-only | through 1 server, async | ratio servers/compute | comm-wait % (1 async worker, per run) | 2 async workers / 1, samples/s |"
echo "| --- | ---: | ---: | ---: | ---: | --- | ---: |"
for model in mlp cnn; do
    eval "_cw=\${CW_$model:-}"
    awk -v m="$model" -v c="$(best "${model}_none_1")" -v a="$(best "${model}_async_1")" \
        -v a2="$(best "${model}_async_2")" -v cw="$_cw" -v b="$BATCH" 'BEGIN {
        printf "| %s | %d | %.0f | %.0f | %s | %s | %s |\n", m, b, c, a,
            (c > 0 ? sprintf("%.3f", a / c) : "-"), cw, (a > 0 ? sprintf("%.2f", 2 * a2 / a) : "-") }'
done
awk -v c="$(best cnn_none_1_b256)" -v a="$(best cnn_async_1_b256)" 'BEGIN {
    printf "| cnn | 256 | %.0f | %.0f | %s | | |\n", c, a, (c > 0 ? sprintf("%.3f", a / c) : "-") }'
echo
echo "CNN compute-only samples/s: cuDNN with its heuristics' algorithms (the default), with"
echo "the deterministic ones timed (PS_CUDNN_ALGO=find), with any timed (fastest), and"
echo "PS_CUDNN=0 (im2col + GEMM per image):"
echo
echo "| batch | cuDNN heuristic | find | fastest | PS_CUDNN=0 | heuristic / PS_CUDNN=0 |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: |"
for b in 64 256; do
    sfx=$([ $b = 256 ] && echo _b256)
    awk -v b="$b" -v c="$(best "cnn_none_1$sfx")" -v n="$(best "cnn_nocudnn_1$sfx")" \
        -v f="$(best "cnn_find_1$sfx")" -v x="$(best "cnn_fastest_1$sfx")" 'BEGIN {
        printf "| %d | %.0f | %.0f | %.0f | %.0f | %s |\n", b, c, f, x, n,
            (n > 0 ? sprintf("%.2f", c / n) : "-") }'
done

# PyTorch, when it is there
torch_status=""
if ! in_time; then
    late=1
    torch_status="skipped: out of the check's time"
elif timeout 60 "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    timeout -k 5 "$BENCH_TIMEOUT" "$PYTHON" - "$BATCH" "$LR" "$MLP_STEPS" "$CNN_STEPS" \
        >"$WORK/torch.out" 2>"$WORK/torch.err" <<'EOF'
import sys, time
import torch
import torch.nn as nn
batch, lr, mlp_steps, cnn_steps = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = True
dev = torch.device("cuda:0")
def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))
def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(7 * 7 * 64, 1024), nn.ReLU(), nn.Linear(1024, 10))
def bench(name, make, steps, batch=batch):
    torch.manual_seed(1)
    model = make().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    lossf = nn.CrossEntropyLoss()
    # batches come from host memory each step, as ps_worker's do
    xs = [torch.rand(batch, 1, 28, 28).pin_memory() for _ in range(16)]
    ys = [torch.randint(0, 10, (batch,)).pin_memory() for _ in range(16)]
    def step(i):
        x = xs[i % 16].to(dev, non_blocking=True)
        y = ys[i % 16].to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        return loss
    for i in range(50):
        step(i)
    torch.cuda.synchronize()
    best = 0.0
    for rep in range(2):
        t0 = time.perf_counter()
        for i in range(steps):
            loss = step(i)
        loss.item()
        torch.cuda.synchronize()
        best = max(best, steps * batch / (time.perf_counter() - t0))
    print(f"torch {name} {best:.0f}")
bench("mlp", mlp, mlp_steps)
bench("cnn", cnn, cnn_steps)
bench("cnn_b256", cnn, max(cnn_steps // 4, 10), 256)
EOF
    torch_rc=$?
    if [ $torch_rc -eq 0 ]; then
        echo
        echo "PyTorch $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null), same layers and batch, SGD, FP32 (TF32 off), one process:"
        echo
        echo "| model | PyTorch samples/s | ours compute-only samples/s | ours / PyTorch | ours through 1 server (async) | that / PyTorch |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: |"
        for model in mlp cnn cnn_b256; do
            base=${model%_b256} sfx=${model#"$base"}
            t=$(sed -n "s/^torch $model \([0-9]*\)$/\1/p" "$WORK/torch.out")
            awk -v m="$model" -v t="${t:-0}" -v c="$(best "${base}_none_1$sfx")" \
                -v a="$(best "${base}_async_1$sfx")" 'BEGIN {
                if (t <= 0) { printf "| %s | - | %.0f | - | %.0f | - |\n", m, c, a; exit }
                printf "| %s | %.0f | %.0f | %.2f | %.0f | %.2f |\n", m, t, c, c / t, a, a / t }'
            torch_status="$torch_status${torch_status:+, }$model $(awk -v t="${t:-0}" \
                -v c="$(best "${base}_none_1$sfx")" 'BEGIN { if (t > 0) printf "%.2f", c / t; else printf "-" }')"
        done
        torch_status="ok: ours / PyTorch compute-only: $torch_status"
    else
        echo
        echo "PyTorch run failed:"
        tail -n 5 "$WORK/torch.err"
        torch_status="FAILED: $( [ $torch_rc -eq 124 ] && echo "timed out after ${BENCH_TIMEOUT}s" ||
            tail -n 1 "$WORK/torch.err" | cut -c1-160)"
    fi
else
    echo
    echo "PyTorch with CUDA not available ($PYTHON: no torch, or one without CUDA): no PyTorch comparison."
    torch_status="skipped: $PYTHON has no torch with CUDA"
fi

# ps.torch's CNN on the GPU (examples/torch_fashion_mnist.py): through 1
# server (async, the server's SGD) against the same loop alone (--backend
# none, torch's SGD), alternating; the median of the per-pair ratios
TDATA=${GPU_TORCH_DATA:-$DATA}
if [ "${torch_rc:-1}" -ne 0 ]; then
    torch_ps_status="skipped: no PyTorch with CUDA"
elif [ ! -f "$TDATA/train-images-idx3-ubyte" ] && [ ! -f "$TDATA/train-images-idx3-ubyte.gz" ]; then
    torch_ps_status="skipped: no Fashion-MNIST IDX files (GPU_TORCH_DATA)"
else
    TSTEPS=${GPU_TORCH_STEPS:-300}
    EXA="examples/torch_fashion_mnist.py --device $DEVICE --data $TDATA --steps $TSTEPS
        --warmup $((TSTEPS / 5)) --batch $BATCH --optimizer sgd --lr $LR --log-every 1000000
        --test-samples 100"
    ratios="" alone_all="" ps_all="" r=0
    while [ "$r" -lt "$REPS" ] && in_time; do
        timeout -k 5 "$BENCH_TIMEOUT" "$PYTHON" $EXA --backend none >"$WORK/pt_alone.log" 2>&1
        t_alone=$(summary_sps "$WORK/pt_alone.log")
        t_ps=""
        if start_servers 1 1 async --lr "$LR"; then
            timeout -k 5 "$BENCH_TIMEOUT" "$PYTHON" $EXA --backend ps --servers "$PS_SERVERS" \
                --rank 0 --num-workers 1 --mode async >"$WORK/pt_ps.log" 2>&1
            t_ps=$(summary_sps "$WORK/pt_ps.log")  # (stop_servers uses $p)
            stop_servers
        fi
        if [ -z "$t_alone" ] || [ -z "$t_ps" ]; then
            fail=1
            echo "ps.torch on $DEVICE failed; the logs end:" >&2
            tail -n 3 "$WORK/pt_alone.log" "$WORK/pt_ps.log" >&2
            break
        fi
        alone_all="$alone_all $t_alone" ps_all="$ps_all $t_ps"
        ratios="$ratios $(awk -v a="$t_alone" -v p="$t_ps" 'BEGIN { printf "%.3f", p / a }')"
        r=$((r + 1))
    done
    med() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END {
        if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
    if [ -n "$ratios" ]; then
        echo
        echo "ps.torch CNN on $DEVICE, batch $BATCH, $TSTEPS steps ($((TSTEPS / 5)) warm-up), $r pairs alternating, medians:"
        echo
        echo "| the loop alone samples/s | through 1 server (async) samples/s | ratio (median of pairs) |"
        echo "| ---: | ---: | ---: |"
        echo "| $(med $alone_all) | $(med $ps_all) | $(med $ratios) |"
        torch_ps_status="ok: ps.torch through 1 server / alone: $(med $ratios)"
    elif ! in_time; then
        torch_ps_status="skipped: out of the check's time"
    else
        torch_ps_status="FAILED: see the log"
    fi
fi

echo
if [ "$fail" -ne 0 ]; then
    echo "gpu_bench: some runs failed (see the messages above)"
    echo "gpu_bench: ours: FAILED: some runs failed (a worker's log is above)"
    echo "gpu_bench: pytorch: $torch_status"
    echo "gpu_bench: ps.torch: $torch_ps_status"
    exit 1
fi
echo "gpu_bench: done"
if [ "$late" = 1 ]; then
    echo "gpu_bench: ours: ok (partial: the runs after the deadline left out, their cells 0)"
else
    echo "gpu_bench: ours: ok"
fi
echo "gpu_bench: pytorch: $torch_status"
echo "gpu_bench: ps.torch: $torch_ps_status"
