#!/usr/bin/python3
"""Train ps_worker's CNN (--model cnn: conv5x5x32-relu-pool, conv5x5x64-relu-
pool, fc1024-relu, fc10) in PyTorch on Fashion-MNIST, through the parameter
servers with ps.torch, printing per-iteration throughput and the final test
accuracy.

Through the servers (PS_SERVERS, PS_RANK, PS_NUM_WORKERS from the
environment, as ps_launch --exec sets them, or --servers):

  bin/ps_server --bind tcp://127.0.0.1:5555 --num-workers 1 --mode async \\
      --optimizer momentum --lr 0.05 --momentum 0.9 &
  /usr/bin/python3 examples/torch_fashion_mnist.py --servers tcp://127.0.0.1:5555 \\
      --mode async --optimizer momentum --lr 0.05 --momentum 0.9
  bin/ps_launch --servers 2 --workers 2 --mode async --exec /usr/bin/python3 \\
      examples/torch_fashion_mnist.py --epochs 2

Servers started with --optimizer average (sync) or add (async) leave the
update to the workers: each steps the torch optimizer of --optimizer
(docs/TORCH.md).

The device is --device, else PS_DEVICE (ps_launch sets cuda:0 for a worker
it gave a GPU, cpu otherwise), else cpu.  On a GPU the model and each batch
live there, and ps.torch stages gradients and weights through pinned host
memory:

  bin/ps_launch --servers 1 --workers 2 --gpus auto --mode async --exec \\
      python3 examples/torch_fashion_mnist.py --steps 500

The same loop without the servers, as baselines: --backend none (one process,
the torch optimizer steps locally) and --backend ddp (torch.distributed,
gloo, DistributedDataParallel; rank and size from PS_RANK/PS_NUM_WORKERS or
--rank/--num-workers, rendezvous on 127.0.0.1:--ddp-port).

Data: the IDX files of --data (examples/idx_data.py, no download), pixels
scaled to [0, 1].  Each epoch is shuffled from --seed the same way on every
worker and cut into global batches of batch x workers; worker r trains on
slice r of each, so W workers x batch b see what 1 worker x batch W*b sees.
The last line is ps_worker's: "summary: time T s, N samples/s per worker,
test accuracy A", and the training thread's CPU time per step (against the
wall time it tells how long the thread waited: for the servers, or for a
core).
"""
import argparse
import os
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
# thread per core) torch.set_num_threads does not reach and which sizes
# itself when it loads: --threads must be in its environment before torch is
# imported, or "1 thread" is 1 + cores busy threads per process.
os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads_arg())
os.environ.setdefault("OMP_NUM_THREADS", _threads_arg())

import torch  # noqa: E402 (after the thread settings)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import ps.torch
except ImportError:  # run from the source tree, not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import ps.torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from idx_data import read_idx  # noqa: E402 (the IDX files, without torchvision)


class CNN(nn.Module):
    """ps_worker --model cnn, initialised as worker/model.c does: He-normal
    before a ReLU, Glorot-normal for the last layer, zero biases."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 1024)
        self.fc2 = nn.Linear(1024, 10)
        for layer in (self.conv1, self.conv2, self.fc1):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)
        nn.init.xavier_normal_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte"))
    y = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte"))
    return x.float().div_(255.0).unsqueeze(1), y.long()


def make_optimizer(args, params):
    """The torch optimizer the flags describe (with ps: run by the servers,
    or stepped by every worker when they run --optimizer average or add;
    none and ddp step it)."""
    kind = args.optimizer or os.environ.get("PS_OPTIMIZER") or "sgd"
    lr = args.lr if args.lr is not None else float(os.environ.get("PS_LR") or 0.05)
    mom = args.momentum if args.momentum is not None else float(
        os.environ.get("PS_MOMENTUM") or 0.9)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind in ("momentum", "nesterov"):
        return torch.optim.SGD(params, lr=lr, momentum=mom, nesterov=kind == "nesterov")
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=1e-8)
    raise SystemExit("--optimizer must be sgd, momentum, nesterov, adam or adagrad")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("ps", "none", "ddp"), default="ps")
    p.add_argument("--servers", help="server endpoints (default PS_SERVERS)")
    p.add_argument("--rank", type=int)
    p.add_argument("--num-workers", type=int)
    p.add_argument("--mode", choices=("sync", "async"), help="default PS_MODE or sync")
    p.add_argument("--optimizer", help="sgd|momentum|nesterov|adam|adagrad (default "
                   "PS_OPTIMIZER; with ps: checked against the servers only when given)")
    p.add_argument("--lr", type=float)
    p.add_argument("--momentum", type=float)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after N iterations (0: all)")
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--test-samples", type=int, default=0, help="evaluate on the first N (0: all)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--warmup", type=int, default=0,
                   help="leave the first N iterations out of the summary's samples/s")
    p.add_argument("--ddp-port", type=int, default=29517)
    p.add_argument("--device", help="cpu or cuda[:N] (default PS_DEVICE, else cpu)")
    p.add_argument("--push-in-backward", action="store_true",
                   help="ps: gradients leave during backward (grad_edits=False: this loop "
                        "never edits .grad between backward and step)")
    return p.parse_args()


def pick_device(args):
    """--device, else PS_DEVICE, else cpu; one torch cannot use ends the run
    with the reason and exit status 2 (something to fix first, as ps_worker)."""
    name = args.device or os.environ.get("PS_DEVICE") or "cpu"

    def refuse(why):
        sys.stderr.write("device %s: %s\n" % (name, why))
        sys.exit(2)
    try:
        dev = torch.device(name)
    except RuntimeError:
        refuse("expected cpu or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            refuse("this torch (%s) has no usable CUDA device (built without CUDA, or no GPU); "
                   "use --device cpu" % torch.__version__)
        if (dev.index or 0) >= torch.cuda.device_count():
            refuse("only %d CUDA device(s) visible" % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    elif dev.type != "cpu":
        refuse("expected cpu or cuda:N")
    return dev


def setup(args, model):
    """(model to call, optimizer to step, rank, workers, exchange or None)."""
    opt = make_optimizer(args, model.parameters())
    if args.backend == "none":
        return model, opt, 0, 1, None
    if args.backend == "ddp":
        import torch.distributed as dist
        rank = args.rank if args.rank is not None else int(os.environ.get("PS_RANK", 0))
        size = args.num_workers or int(os.environ.get("PS_NUM_WORKERS", 1))
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.ddp_port,
                                rank=rank, world_size=size)
        return nn.parallel.DistributedDataParallel(model), opt, rank, size, None
    client = ps.Client(servers=args.servers, rank=args.rank, num_workers=args.num_workers,
                       mode=args.mode)
    edits = False if args.push_in_backward else None
    given = args.optimizer or args.lr is not None or os.environ.get("PS_OPTIMIZER")
    if given:  # the update where the servers say: theirs, or this optimizer on each worker
        dopt = ps.torch.DistributedOptimizer(opt, model=model, client=client, grad_edits=edits)
    else:      # whatever the servers run
        dopt = ps.torch.DistributedOptimizer(model, None, client, grad_edits=edits)
    return dopt.model, dopt, client.rank, client.num_workers, dopt.model


def evaluate(model, x, y, dev):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            out = model(x[i:i + 1000].to(dev))
            correct += (out.argmax(1).cpu() == y[i:i + 1000]).sum().item()
    model.train()
    return correct / len(x)


def main():
    args = parse()
    torch.set_num_threads(args.threads)
    dev = pick_device(args)
    torch.manual_seed(args.seed)
    x_train, y_train = load(args.data, "train")
    x_test, y_test = load(args.data, "test")
    if args.test_samples:
        x_test, y_test = x_test[:args.test_samples], y_test[:args.test_samples]
    # the same initial weights on every device: drawn on the CPU, then moved
    net, opt, rank, workers, wrapped = setup(args, CNN().to(dev))
    per_epoch = len(x_train) // (args.batch * workers)
    total = per_epoch * args.epochs
    if args.steps:
        total = min(total, args.steps)
    tag = "[%s %d/%d] " % (args.backend, rank, workers)
    print(tag + "training %d steps (%d per epoch), batch %d per worker, on %s"
          % (total, per_epoch, args.batch, dev), flush=True)
    t_start = t_win = time.time()
    cpu_start = time.thread_time()  # this (the training) thread's CPU time
    win_loss, win_n = 0.0, 0
    for step in range(total):
        epoch, k = divmod(step, per_epoch)
        if k == 0:
            order = torch.randperm(len(x_train),
                                   generator=torch.Generator().manual_seed(args.seed + epoch))
        lo = (k * workers + rank) * args.batch
        idx = order[lo:lo + args.batch]
        opt.zero_grad()
        loss = F.cross_entropy(net(x_train[idx].to(dev, non_blocking=True)),
                               y_train[idx].to(dev, non_blocking=True))
        loss.backward()
        opt.step()
        if step + 1 == args.warmup and args.warmup < total:
            t_start, cpu_start = time.time(), time.thread_time()
        win_loss += loss.item()
        win_n += 1
        if (step + 1) % args.log_every == 0 or step + 1 == total:
            now = time.time()
            wait = 100.0 * wrapped.take_wait_ns() * 1e-9 / (now - t_win) if wrapped else 0.0
            print(tag + "epoch %d iter %d/%d loss %.4f samples/s %.0f comm-wait %.1f%%"
                  % (epoch + 1, step + 1, total, win_loss / win_n,
                     win_n * args.batch / (now - t_win), wait), flush=True)
            t_win, win_loss, win_n = now, 0.0, 0
    if wrapped is not None:
        wrapped.pull_final()  # every worker ends with the servers' weights
    train_s = time.time() - t_start
    cpu_ms = (time.thread_time() - cpu_start) * 1e3
    acc = evaluate(net, x_test, y_test, dev) if rank == 0 else None
    timed = total - args.warmup if 0 < args.warmup < total else total
    sps = timed * args.batch / train_s if train_s > 0 else 0.0
    print(tag + "summary: time %.1f s, %.0f samples/s per worker%s, training thread %.1f ms "
          "CPU per step" % (train_s, sps, ", test accuracy %.4f" % acc if acc is not None else "",
                            cpu_ms / max(timed, 1)), flush=True)
    if wrapped is not None:
        wrapped.close()
    elif args.backend == "ddp":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
