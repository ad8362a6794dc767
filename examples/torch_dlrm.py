#!/usr/bin/python3
"""A DLRM (bottom MLP, embedding bags, pairwise dot interaction, top MLP)
trained with its embedding tables on the parameter servers: the model is
plain PyTorch; ps.torch.DistributedOptimizer makes its nn.EmbeddingBag
modules server tables (never materialised here: made on the meta device)
and prefetches the next batch's rows while this one computes.

Data: synthetic-ctr (python/ps/data_ctr.py, ps_worker's rule bit for bit:
Zipf ids, one field per table) or, with --criteo FILE, Criteo's text format
(label, 13 counts, 26 hex categories, tab-separated; ids taken mod --rows;
the last tenth of the lines is the test set).

  --backend ps     through the servers: run under ps_launch --exec, e.g.
                   bin/ps_launch --servers 1 --workers 2 --mode async --exec \\
                       /usr/bin/python3 examples/torch_dlrm.py --rows 1000000
  --backend none   one PyTorch process, nn.EmbeddingBag(sparse=True)
  --backend ddp    DistributedDataParallel over gloo, --world processes

Every backend: the same data, model, initialisation (tables uniform in
+-0.05, torch's default layers from --seed), optimizers (SGD on the dense
layers; on the tables --optimizer: sparse Adagrad, row-wise Adagrad
(ps.torch.RowWiseAdagrad here, rowwise_adagrad on the servers: one state
float a row) or SGD), and each worker trains its slice of every global
batch of W x --batch samples.  --qr N: quotient-remainder tables (two
tables of rows/N and N rows whose bags are multiplied, DLRM's --qr-flag),
materialised here (small), made server tables by ps.torch's default
choice.  --plain: the script as a PyTorch user writes it, ported with one
line: materialised sparse=True tables, one torch.optim.SGD(lr=--lr) over
model.parameters(), no prefetch, no tables=, no meta device (ps.torch's
tables follow that SGD and start from the module's rows).

The test AUC is computed twice: under torch.no_grad() and with autograd on
in model.eval() (DLRM's inference() has no no_grad): the two must agree.
Each worker prints:

  torch_dlrm: backend ps rank 0 of 2 samples/s 812.3 loss 0.4711 test auc 0.7412 (grad on 0.7412) peak rss MB 231 rss after wrap MB 180

Export and serve (docs/TORCH.md): --export DIR writes the trained model
from worker 0 after the last step (ps.torch.export: the tables and dense
layers at that step, model.pt the plain model's state_dict); --eval-export
DIR then loads it into the plain model, no servers, and prints the test AUC
of the same test set, which equals the live job's:

  torch_dlrm: eval of export DIR (step 400) test auc 0.7412
"""
import argparse
import math
import os
import resource
import socket
import sys
import time

import numpy as np

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "python"))
# OpenBLAS keeps its own threads (torch.set_num_threads does not bound them)
# and they spin (sched_yield) between calls: on a host shared with servers or
# other ranks they take those processes' CPU.  --threads bounds them too,
# read before torch loads it.
_threads = [v for k, v in zip(sys.argv, sys.argv[1:]) if k == "--threads"]
os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads[-1] if _threads else "1")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ps import data_ctr  # noqa: E402

EMB_INIT = 0.05


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("ps", "none", "ddp"), default="ps")
    p.add_argument("--rows", type=int, default=100000, help="rows (id space) per table")
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--steps", type=int, default=400, help="steps per worker")
    p.add_argument("--batch", type=int, default=128, help="samples per worker and step")
    p.add_argument("--bot", default="64", help="bottom MLP hidden sizes (then --dim)")
    p.add_argument("--top", default="64", help="top MLP hidden sizes (then 1)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD on the dense layers")
    p.add_argument("--table-lr", type=float, default=0.05, help="the tables' optimizer's lr")
    p.add_argument("--optimizer", choices=("adagrad", "rowwise-adagrad", "sgd"),
                   default="adagrad", help="the tables' optimizer")
    p.add_argument("--qr", type=int, default=0, metavar="N",
                   help="quotient-remainder tables with N collisions (0: plain tables)")
    p.add_argument("--plain", action="store_true",
                   help="one SGD(--lr) over everything, materialised tables, no prefetch")
    p.add_argument("--zipf", type=float, default=data_ctr.ZIPF)
    p.add_argument("--export", metavar="DIR",
                   help="backend ps: worker 0 exports the trained model to DIR")
    p.add_argument("--eval-export", metavar="DIR",
                   help="no training: the plain model from export DIR, its test AUC")
    p.add_argument("--test", type=int, default=10000, help="synthetic-ctr test samples")
    p.add_argument("--criteo", help="a Criteo text file instead of synthetic-ctr")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--world", type=int, default=2, help="--backend ddp: processes")
    p.add_argument("--no-prefetch", action="store_true", help="ps: fetch rows in the forward")
    a = p.parse_args(argv)
    if a.tables < 1 or a.tables > data_ctr.FIELDS or a.rows < 1 or a.dim < 1:
        p.error("--tables in 1..%d, --rows and --dim at least 1" % data_ctr.FIELDS)
    if a.qr < 0 or a.qr > a.rows:
        p.error("--qr: collisions in 1..--rows (0: none)")
    if a.plain:
        a.no_prefetch = True
    return a


def mlp(sizes, relu_last):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if relu_last or i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class QREmbeddingBag(nn.Module):
    """Quotient-remainder embeddings: id i reads row i // n of weight_q and
    row i % n of weight_r (n collisions), their bags multiplied; both
    parameters read by F.embedding_bag here (ps.torch makes them tables)."""

    def __init__(self, rows, dim, collisions):
        super().__init__()
        self.collisions, self.sparse = collisions, True
        self.weight_q = nn.Parameter(torch.empty((rows + collisions - 1) // collisions, dim))
        self.weight_r = nn.Parameter(torch.empty(collisions, dim))

    def forward(self, input):
        q = torch.div(input, self.collisions, rounding_mode="floor")
        r = torch.remainder(input, self.collisions)
        return (F.embedding_bag(q, self.weight_q, mode="sum", sparse=self.sparse) *
                F.embedding_bag(r, self.weight_r, mode="sum", sparse=self.sparse))


class DLRM(nn.Module):
    def __init__(self, a, device=None):
        super().__init__()
        sizes = lambda s: [int(x) for x in s.split("-") if x]  # noqa: E731
        n = a.tables + 1
        # the dense layers first: the same draws whether the tables are here or not
        self.bot = mlp([data_ctr.DENSE] + sizes(a.bot) + [a.dim], relu_last=True)
        self.top = mlp([a.dim + n * (n - 1) // 2] + sizes(a.top) + [1], relu_last=False)
        if a.qr:
            self.emb = nn.ModuleList(QREmbeddingBag(a.rows, a.dim, a.qr)
                                     for _ in range(a.tables))
        else:
            self.emb = nn.ModuleList(nn.EmbeddingBag(a.rows, a.dim, mode="sum", sparse=True,
                                                     device=device) for _ in range(a.tables))
        if device != "meta":
            for p in self.emb.parameters():
                nn.init.uniform_(p, -EMB_INIT, EMB_INIT)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, ids):
        x = self.bot(dense)
        t = torch.stack([x] + [e(ids[:, f:f + 1]) for f, e in enumerate(self.emb)], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([x, z], dim=1)).squeeze(1)


def criteo(path, n, tables, rows):
    """The first n lines of a Criteo text file: (dense, ids, labels)."""
    dense, ids, labels = [], [], []
    with open(path) as f:
        for k, line in enumerate(f):
            if k == n:
                break
            c = line.rstrip("\n").split("\t")
            if len(c) != 40:
                raise SystemExit("torch_dlrm: %s line %d has %d columns, Criteo's have 40"
                                 % (path, k + 1, len(c)))
            labels.append(float(c[0]))
            dense.append([math.log1p(max(int(v), 0)) if v else 0.0 for v in c[1:14]])
            ids.append([int(v, 16) % rows if v else 0 for v in c[14:14 + tables]])
    if not labels:
        raise SystemExit("torch_dlrm: %s has no samples" % path)
    return (np.array(dense, np.float32), np.array(ids, np.int64), np.array(labels, np.float32))


def data(a, world):
    """(train, test), each (dense, ids, labels) tensors."""
    n = a.steps * a.batch * world
    if a.criteo:
        d, i, y = criteo(a.criteo, n + n // 9 + 1, a.tables, a.rows)
        cut = len(y) - max(1, len(y) // 10)
        tr = (d[:cut], i[:cut], y[:cut])
        te = (d[cut:], i[cut:], y[cut:])
    else:
        cdf = data_ctr.zipf_cdf(a.rows, a.zipf)
        d, i, y = data_ctr.generate(0, n + a.test, a.seed, a.tables, a.rows, a.zipf, cdf)
        i, y = i.view(np.int64), y.astype(np.float32)
        tr, te = (d[:n], i[:n], y[:n]), (d[n:], i[n:], y[n:])
    t = lambda s: tuple(torch.from_numpy(np.ascontiguousarray(x)) for x in s)  # noqa: E731
    return t(tr), t(te)


def batches(train, a, rank, world):
    d, i, y = train
    steps = min(a.steps, len(y) // (a.batch * world))
    for k in range(steps):
        lo = (k * world + rank) * a.batch
        yield d[lo:lo + a.batch], i[lo:lo + a.batch], y[lo:lo + a.batch]


def evaluate(model, test, grad=False):
    """Test AUC: under torch.no_grad(), or (grad) with autograd on and
    model.eval(), as DLRM's inference() runs."""
    d, i, y = test
    out = []
    model.eval()
    with torch.set_grad_enabled(grad):
        for lo in range(0, len(y), 4096):
            out.append(model(d[lo:lo + 4096], i[lo:lo + 4096]).detach().numpy())
    model.train()
    return data_ctr.auc(np.concatenate(out), y.numpy())


def table_optimizer(a, params):
    """The tables' torch optimizer (the local backends)."""
    if a.optimizer == "rowwise-adagrad":
        import ps.torch
        return ps.torch.RowWiseAdagrad(params, lr=a.table_lr, eps=1e-8)
    if a.optimizer == "sgd":
        return torch.optim.SGD(params, lr=a.table_lr)
    return torch.optim.Adagrad(params, lr=a.table_lr, eps=1e-8)


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def run(a, rank, world, port=None):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)  # the same dense layers on every worker and backend
    train, test = data(a, world)
    wrapped_rss = 0.0
    if a.backend == "ps" and a.plain:
        import ps.torch
        model = DLRM(a)  # as the script has it; ps.torch sends the rows, then frees them
        opt = ps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=a.lr),
                                            model=model)
        rank, world = opt.client.rank, opt.client.num_workers
        tables_opt, wrapped_rss = None, rss_mb()
    elif a.backend == "ps":
        import ps.torch
        kind = {"rowwise-adagrad": "rowwise_adagrad"}.get(a.optimizer, a.optimizer)
        topt = {"optimizer": kind, "lr": a.table_lr}
        if kind != "sgd":
            topt["eps"] = 1e-8
        if a.qr:  # small tables, materialised: ps.torch takes their rows
            model = DLRM(a)
            tables = None
        else:  # the tables are never materialised here
            model = DLRM(a, device="meta")
            tables = {"emb.%d" % f: {"init": "uniform", "scale": EMB_INIT, "seed": a.seed}
                      for f in range(a.tables)}
        opt = ps.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=a.lr), model=model, tables=tables,
            table_optimizer=topt, table_max_ids=max(a.batch, 1))
        rank, world = opt.client.rank, opt.client.num_workers
        tables_opt, wrapped_rss = None, rss_mb()
    else:
        model = DLRM(a)
        if world > 1:
            import torch.distributed as dist
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                                    rank=rank, world_size=world)
            model = nn.parallel.DistributedDataParallel(model)
        inner = model.module if world > 1 else model
        if a.plain:
            opt, tables_opt = torch.optim.SGD(model.parameters(), lr=a.lr), None
        else:
            opt = torch.optim.SGD(list(inner.bot.parameters()) + list(inner.top.parameters()),
                                  lr=a.lr)
            tables_opt = table_optimizer(a, list(inner.emb.parameters()))
    it = batches(train, a, rank, world)
    if a.backend == "ps" and not a.no_prefetch and not a.qr:
        it = opt.prefetching(it, lambda b: list(b[1].unbind(1)))
    losses, n = [], 0
    t0 = time.perf_counter()
    for d, i, y in it:
        opt.zero_grad()
        if tables_opt is not None:
            tables_opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(d, i), y)
        loss.backward()
        opt.step()
        if tables_opt is not None:
            tables_opt.step()
        losses.append(float(loss))
        n += len(y)
    dt = time.perf_counter() - t0
    table_row = ""
    if a.backend == "ps":
        opt.pull_final()
        if a.export and rank == 0:
            opt.export(a.export)  # the tables fit: dense weights in model.pt too
        st = opt.client.stats(0)  # server 0's tables: bytes a row, all included
        if st["rows"]:
            table_row = " server table bytes/row %.1f" % (st["table_bytes"] / st["rows"])
    score = evaluate(model, test)
    score_grad = evaluate(model, test, grad=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    last = losses[-max(1, len(losses) // 10):]
    print("torch_dlrm: backend %s rank %d of %d samples/s %.1f loss %.4f test auc %.4f "
          "(grad on %.4f) peak rss MB %.0f rss after wrap MB %.0f%s"
          % (a.backend, rank, world, n / dt if dt > 0 else 0.0, sum(last) / len(last), score,
             score_grad, rss, wrapped_rss or rss_mb(), table_row), flush=True)
    if a.backend == "ps":
        opt.close()


def eval_export(a):
    """The plain model (no ps) from export a.eval_export: its test AUC."""
    import json
    torch.set_num_threads(a.threads)
    _, test = data(a, int(os.environ.get("PS_NUM_WORKERS") or 1))
    model = DLRM(a)
    model.load_state_dict(torch.load(os.path.join(a.eval_export, "model.pt")))
    with open(os.path.join(a.eval_export, "manifest.json")) as f:
        step = json.load(f)["step"]
    print("torch_dlrm: eval of export %s (step %d) test auc %.4f"
          % (a.eval_export, step, evaluate(model, test)), flush=True)


def _ddp_rank(rank, a, port):
    run(a, rank, a.world, port)


def main():
    a = parse_args()
    if a.eval_export:
        eval_export(a)
    elif a.backend == "ps":
        run(a, 0, int(os.environ.get("PS_NUM_WORKERS") or os.environ.get("WORLD_SIZE") or 1))
    elif a.backend == "ddp" and a.world > 1:
        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_ddp_rank, args=(a, port), nprocs=a.world)
    else:
        run(a, 0, 1)


if __name__ == "__main__":
    main()
