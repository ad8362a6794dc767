#!/usr/bin/python3
"""PyTorch baselines for the benchmarks: the same models as ps_worker
(mlp:IN-H1-...-OUT with ReLU, or the CNN of `--model cnn`), trained with SGD
on Fashion-MNIST (or synthetic data), either in one process or with
DistributedDataParallel over gloo in W processes on this host.

Prints one line:  torch_ref: <mode> <model> W=<w> samples/s <total> loss <last>
where samples/s is the sum over the processes of (steps * batch / time of the
timed steps), timing only after the warm-up steps, like ps_worker's
training-loop figure.  Exits 0; prints "skipped: no torch" (exit 0) when torch
is missing.

  bench/torch_ref.py --model mlp:784-256-128-10 --world 1 --steps 400
  bench/torch_ref.py --model cnn --world 2 --steps 100 --warmup 10
"""
import argparse
import gzip
import os
import struct
import sys
import time


def _threads_arg():
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


# Debian's torch runs linear layers on OpenBLAS, whose own thread pool (one
# thread per core) torch.set_num_threads does not reach: "1 thread" must be in
# the environment before torch loads, or each process runs 1 + cores threads
# (as examples/torch_fashion_mnist.py does).
os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads_arg())
os.environ.setdefault("OMP_NUM_THREADS", _threads_arg())

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("torch_ref: skipped: no torch (Debian: apt-get install python3-torch)")
    sys.exit(0)

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def load_data(n_synthetic):
    x_path = os.path.join(DATA, "train-images-idx3-ubyte.gz")
    if n_synthetic == 0 and os.path.exists(x_path):
        x = read_idx(x_path).float().div_(255.0).reshape(-1, 1, 28, 28)
        y = read_idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz")).long()
        return x, y
    g = torch.Generator().manual_seed(1)
    n = n_synthetic or 60000
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x):
        x = x.reshape(x.shape[0], -1)
        for i, l in enumerate(self.layers):
            x = l(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


class CNN(nn.Module):
    """ps_worker's cnn: conv5x5x32-relu-pool, conv5x5x64-relu-pool, fc1024-relu, fc10."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 5, padding=2)
        self.c2 = nn.Conv2d(32, 64, 5, padding=2)
        self.f1 = nn.Linear(64 * 7 * 7, 1024)
        self.f2 = nn.Linear(1024, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = F.relu(self.f1(x.flatten(1)))
        return self.f2(x)


def make_model(spec):
    if spec == "cnn":
        return CNN()
    if spec.startswith("mlp:"):
        return MLP([int(s) for s in spec[4:].split("-")])
    raise SystemExit("torch_ref: --model must be mlp:IN-H1-...-OUT or cnn, got %r" % spec)


def train(rank, world, args, port, results):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if world > 1:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                                rank=rank, world_size=world)
    x, y = load_data(args.synthetic)
    model = make_model(args.model)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed)
    n = x.shape[0]
    per_rank = n // world
    order = torch.randperm(n, generator=g)[rank * per_rank:(rank + 1) * per_rank]
    steps_per_epoch = per_rank // args.batch
    total = args.warmup + args.steps
    loss_v = 0.0
    t0 = None
    for it in range(total):
        if it == args.warmup:
            t0 = time.perf_counter()
        k = it % steps_per_epoch
        idx = order[k * args.batch:(k + 1) * args.batch]
        xb, yb = x[idx], y[idx]
        # in place, torch 1.13's default: freeing the gradients each step
        # (set_to_none) makes glibc hand 13 MB back to the kernel and fault
        # it in again next backward, up to 2x slower in this VM
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        loss_v = float(loss)
    dt = time.perf_counter() - t0
    results[rank] = (args.steps * args.batch / dt, loss_v)
    if world > 1:
        dist.destroy_process_group()


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp:784-256-128-10")
    ap.add_argument("--world", type=int, default=1, help="1: one process; W > 1: DDP over gloo")
    ap.add_argument("--batch", type=int, default=64, help="per process")
    ap.add_argument("--steps", type=int, default=400, help="timed steps per process")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--synthetic", type=int, default=0, help="N random samples instead of Fashion-MNIST")
    args = ap.parse_args()
    if args.world < 1:
        raise SystemExit("torch_ref: --world must be >= 1")
    if args.world == 1:
        results = {}
        train(0, 1, args, 0, results)
    else:
        results = mp.Manager().dict()
        mp.spawn(train, args=(args.world, args, free_port(), results), nprocs=args.world, join=True)
    total = sum(r[0] for r in results.values())
    mode = "ddp-gloo" if args.world > 1 else "single"
    print("torch_ref: %s %s W=%d samples/s %.0f loss %.4f" %
          (mode, args.model, args.world, total, results[0][1]))


if __name__ == "__main__":
    main()
