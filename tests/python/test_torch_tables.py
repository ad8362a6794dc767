#!/usr/bin/python3
"""ps.torch's embedding tables (issue 22) against live bin/ps_server
processes: an nn.EmbeddingBag / nn.Embedding made a server table computes
what the local module computes, bit for bit, in the forward and in the rows
after SGD steps (sync, one worker and two; the local weight starts from
ps.table_init's rows, the servers' first rows), with repeated ids,
padding_idx (its row never changes on the servers), per_sample_weights and
max mode; prefetched batches give the same as unprefetched ones; a table of
2^40 rows trains without the worker's memory growing; the declarations are
in the optimizer's state_dict; a worker restarted against restored servers
goes on from each table's clock there; a short DLRM run learns."""

import copy
import os
import re
import subprocess
import unittest

import numpy as np

import pstest
from test_torch import need_torch, run_workers

try:
    import torch
    import torch.nn as nn
    import ps
    import ps.torch
    from ps import table_init
    from ps.torch._tables import table_key
except ImportError:  # python3-torch missing: need_torch skips every case, saying so
    torch = nn = None

ROOT = pstest.ROOT
LR = 0.25
N, DIM = 40, 4


class Bag(nn.Module if torch else object):
    """One embedding module and a fixed linear read-out (no trained dense
    parameter: the rows' arithmetic alone)."""

    def __init__(self, emb):
        super().__init__()
        self.emb = emb
        self.register_buffer("c", torch.arange(1, DIM + 1, dtype=torch.float32) / 8 - 0.3)

    def forward(self, *args, **kw):
        return self.emb(*args, **kw) * self.c


def initial_weight():
    """The servers' first rows of ids 0..N-1 of the model's table."""
    key = table_key(0, "emb", DIM)
    return torch.from_numpy(table_init.initial_rows(0, key, np.arange(N), DIM, "normal", 1.0))


def loss_of(out):
    return (out * out).sum() / 2


def local_run(make, batches, W):
    """The local module from the servers' first rows, SGD on the mean of
    the W workers' gradients: [outputs of every step and worker], weight."""
    emb = make()
    with torch.no_grad():
        emb.weight.copy_(initial_weight())
        if emb.padding_idx is not None:  # torch's padding row: zeros
            emb.weight[emb.padding_idx] = 0
    m = Bag(emb)
    outs = []
    for step in batches:
        grads = []
        for args, kw in step:
            m.zero_grad()
            out = m(*args, **kw)
            loss_of(out).backward()
            outs.append(out.detach().clone())
            grads.append(emb.weight.grad.clone())
        g = grads[0]
        for h in grads[1:]:
            g = g + h
        if W > 1:
            g = g * np.float32(1.0 / W)
        with torch.no_grad():
            emb.weight.add_(g, alpha=-LR)
    return outs, emb.weight.detach()


def server_run(endpoint, make, batches, W, prefetch=False):
    """The same through the servers, W workers in threads: each worker's
    outputs, and the rows of ids 0..N-1 at the end."""

    def worker(rank):
        m = Bag(make())
        opt = torch.optim.SGD(m.parameters(), lr=LR)
        dopt = ps.torch.DistributedOptimizer(
            opt, model=m, client=ps.Client(servers=endpoint, rank=rank, num_workers=W,
                                           mode="sync"),
            tables="all", table_optimizer={"optimizer": "sgd", "lr": LR})
        outs = []
        mine = [step[rank] for step in batches]
        it = dopt.prefetching(mine, lambda b: b[0][0]) if prefetch else mine
        for args, kw in it:
            dopt.zero_grad()
            out = m(*args, **kw)
            loss_of(out).backward()
            dopt.step()
            outs.append(out.detach().clone())
        dopt.finish()
        t = m.emb.table
        rows = t.lookup(torch.arange(N), None, "cpu")[1]
        dopt.close()
        return outs, rows

    res = run_workers(worker, W)
    outs = [res[r][0][s] for s in range(len(batches)) for r in range(W)]
    for r in range(1, W):
        assert torch.equal(res[r][1], res[0][1])
    return outs, res[0][1]


def rss_kb():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def ids(*rows):
    return torch.tensor(rows, dtype=torch.int64)


@need_torch
class Tables(unittest.TestCase):
    def setUp(self):
        torch.set_num_threads(1)

    def assert_bitwise(self, a, b):
        self.assertEqual(a.shape, b.shape)
        self.assertTrue(torch.equal(a.view(torch.int32), b.view(torch.int32)),
                        "differ:\n%s\n%s" % (a, b))

    def same_as_local(self, make, batches, W, prefetch=False):
        s = pstest.Server("--num-workers", str(W), "--mode", "sync")
        got_outs, got_rows = server_run(s.endpoint, make, batches, W, prefetch)
        want_outs, want_w = local_run(make, batches, W)
        for g, w in zip(got_outs, want_outs):
            self.assert_bitwise(g, w)
        pad = make().padding_idx
        if pad is not None:
            # torch's padding row is zeros; the servers' never got a gradient
            self.assert_bitwise(got_rows[pad], initial_weight()[pad])
            keep = torch.arange(N) != pad
            got_rows, want_w = got_rows[keep], want_w[keep]
        self.assert_bitwise(got_rows, want_w)

    def test_bag_sum_with_repeated_ids_equals_local_bitwise_one_worker(self):
        b = [[((ids([1, 2, 3], [3, 3, 39], [7, 1, 1]),), {})] for _ in range(2)]
        b.append([((ids([5, 5, 5], [2, 9, 1]),), {})])
        self.same_as_local(lambda: nn.EmbeddingBag(N, DIM, mode="sum"), b, 1)

    def test_bag_mean_equals_local_bitwise_with_two_sync_workers(self):
        b = [[((ids([1, 2, 3], [3, 3, 39]),), {}), ((ids([3, 4, 5], [1, 1, 2]),), {})],
             [((ids([6, 2], [2, 2]),), {}), ((ids([2, 8], [9, 3]),), {})],
             [((ids([1, 3], [4, 4]),), {}), ((ids([0, 0], [3, 1]),), {})]]
        self.same_as_local(lambda: nn.EmbeddingBag(N, DIM, mode="mean"), b, 2)

    def test_bag_max_mode_equals_local_bitwise(self):
        b = [[((ids([1, 2, 3, 4], [3, 4, 39, 2]),), {})] for _ in range(3)]
        self.same_as_local(lambda: nn.EmbeddingBag(N, DIM, mode="max"), b, 1)

    def test_per_sample_weights_and_offsets_equal_local_bitwise(self):
        x, off = ids(1, 2, 3, 3, 9, 1, 1), ids(0, 3, 5)
        w = torch.tensor([0.5, -1.25, 2.0, 0.75, 1.5, -0.5, 3.0])
        b = [[((x, off), {"per_sample_weights": w})] for _ in range(3)]
        self.same_as_local(lambda: nn.EmbeddingBag(N, DIM, mode="sum"), b, 1)

    def test_padding_idx_row_stays_untouched_on_the_servers(self):
        b = [[((ids([1, 0, 3], [0, 0, 5]),), {})] for _ in range(3)]
        self.same_as_local(lambda: nn.EmbeddingBag(N, DIM, mode="mean", padding_idx=0), b, 1)

    def test_nn_embedding_with_padding_idx_equals_local_bitwise(self):
        b = [[((ids([1, 2, 0], [3, 3, 0]),), {})] for _ in range(3)]
        self.same_as_local(lambda: nn.Embedding(N, DIM, padding_idx=0), b, 1)

    def test_prefetched_batches_equal_unprefetched_ones_bitwise(self):
        b = [[((ids([s, s + 1, 3], [3, 2 * s, 39]),), {})] for s in range(4)]
        self.same_as_local(lambda: nn.EmbeddingBag(N, DIM, mode="sum"), b, 1, prefetch=True)
        self.same_as_local(lambda: nn.EmbeddingBag(N, DIM, mode="sum"),
                           [[st[0]] * 2 for st in b], 2, prefetch=True)

    def test_a_restarted_worker_goes_on_with_its_tables_from_the_restored_servers(self):
        """A worker stopped after 4 sync steps, its servers stopped (a last
        checkpoint) and restored, a new worker process's model loading the
        optimizer's state_dict: the 3 steps after it leave the rows bitwise
        where 7 steps without the stop leave them, nothing dropped as a
        duplicate (the rows and their clock came back with the servers)."""
        ck = os.path.join(pstest.TMP, "tables-restart")
        os.makedirs(ck, exist_ok=True)
        args = ("--num-workers", "1", "--mode", "sync", "--checkpoint-dir", ck,
                "--checkpoint-every", "1")
        make = lambda: nn.EmbeddingBag(N, DIM, mode="sum")
        b = [[((ids([1, 2, 3], [3, 3, 39], [7, 1, 1]),), {})],
             [((ids([5, 5, 5], [2, 9, 1]),), {})],
             [((ids([0, 1, 2], [4, 4, 8]),), {})],
             [((ids([39, 38, 1], [2, 2, 2]),), {})],
             [((ids([1, 2, 3], [10, 11, 12]),), {})],
             [((ids([7, 7, 9], [3, 4, 5]),), {})],
             [((ids([0, 0, 1], [39, 1, 2]),), {})]]

        def worker(endpoint, batches, state):
            m = Bag(make())
            dopt = ps.torch.DistributedOptimizer(
                torch.optim.SGD(m.parameters(), lr=LR), model=m,
                client=ps.Client(servers=endpoint, rank=0, num_workers=1, mode="sync"),
                tables="all", table_optimizer={"optimizer": "sgd", "lr": LR})
            if state is not None:
                dopt.load_state_dict(state)
            steps = [t.step for t in dopt.exchange.tables]
            for (args, kw), in batches:
                dopt.zero_grad()
                loss_of(m(*args, **kw)).backward()
                dopt.step()
            dopt.finish()
            rows = m.emb.table.lookup(torch.arange(N), None, "cpu")[1]
            saved = copy.deepcopy(dopt.state_dict())
            st = dopt.client.stats()
            dopt.close()
            return steps, rows, saved, st

        s = pstest.Server(*args)
        steps0, _, saved, _ = worker(s.endpoint, b[:4], None)
        s.stop()
        s = pstest.Server(*(args + ("--restore",)))
        steps1, rows, _, st = worker(s.endpoint, b[4:], saved)
        s.stop()
        self.assertEqual(steps0, [0])
        self.assertEqual(steps1, [4])  # each table's clock on the restored servers
        self.assertEqual(st["dup_dropped"], 0)
        self.assert_bitwise(rows, local_run(make, b, 1)[1])

    def test_a_forward_with_other_ids_than_prefetched_is_refused(self):
        s = pstest.Server("--num-workers", "1", "--mode", "async")
        m = Bag(nn.EmbeddingBag(N, DIM, mode="sum"))
        dopt = ps.torch.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=LR), model=m,
            client=ps.Client(servers=s.endpoint, rank=0, num_workers=1, mode="async"),
            tables=["emb"])
        dopt.prefetch(ids([1, 2]))
        with self.assertRaisesRegex(RuntimeError, "not the batch handed by prefetch"):
            m(ids([1, 3]))
        dopt.prefetch(ids([4]))
        with self.assertRaisesRegex(RuntimeError, "two batches are handed already"):
            dopt.prefetch(ids([5]))
        dopt.close()

    def test_bad_table_choices_are_refused_with_the_reason(self):
        m = Bag(nn.EmbeddingBag(N, DIM))
        c = ps.Client(servers="tcp://127.0.0.1:1", rank=0, num_workers=1, mode="async")
        with self.assertRaisesRegex(ValueError, "'nope' is no nn.Embedding.*its embeddings: emb"):
            ps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR), model=m,
                                          client=c, tables=["nope"])
        with self.assertRaisesRegex(ValueError, "optimizer must be one of"):
            ps.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR), model=m,
                                          client=c, tables="all", table_optimizer="rmsprop")
        with self.assertRaisesRegex(ValueError, "max_norm"):
            ps.torch.EmbeddingBag(N, DIM, max_norm=1.0)
        c.close()

    def test_small_tables_stay_local_by_default_and_big_ones_go(self):
        s = pstest.Server("--num-workers", "1", "--mode", "async")
        m = nn.ModuleDict({"small": nn.EmbeddingBag(N, DIM),
                           "big": nn.EmbeddingBag(1 << 30, DIM, device="meta")})
        dopt = ps.torch.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=LR), model=m,
            client=ps.Client(servers=s.endpoint, rank=0, num_workers=1, mode="async"))
        self.assertEqual(list(dopt.tables), ["big"])
        self.assertIsInstance(m["small"], nn.EmbeddingBag)
        self.assertEqual([p.shape for g in dopt.param_groups for p in g["params"]],
                         [torch.Size([N, DIM])])
        sd = dopt.state_dict()
        self.assertEqual(sd["ps_tables"]["big"]["num_embeddings"], 1 << 30)
        self.assertIn("--checkpoint-dir", sd["ps_tables"]["big"]["rows"])
        dopt.load_state_dict(sd)
        sd["ps_tables"]["big"]["key"] ^= 1
        with self.assertRaisesRegex(ValueError, "not one of this model's server tables"):
            dopt.load_state_dict(sd)
        dopt.close()

    def test_a_table_of_2_to_the_40_rows_is_never_materialised_on_the_worker(self):
        s = pstest.Server("--num-workers", "1", "--mode", "async")
        torch.manual_seed(3)
        m = nn.Sequential(nn.EmbeddingBag(1 << 40, 16, mode="sum", device="meta"),
                          nn.Linear(16, 1))
        dopt = ps.torch.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.05), model=m,
            client=ps.Client(servers=s.endpoint, rank=0, num_workers=1, mode="async"),
            table_optimizer="adagrad")
        before = rss_kb()
        g = torch.Generator().manual_seed(5)
        seen = set()
        for _ in range(20):
            # any int64: negative ones too (the same 64 bits as uint64)
            x = torch.randint(-(1 << 62), 1 << 62, (256, 2), generator=g)
            seen.update(x.view(-1).tolist())
            dopt.zero_grad()
            m(x).sum().backward()
            dopt.step()
        dopt.finish()
        grown_mb = (rss_kb() - before) / 1024.0
        # 2^40 x 16 floats would be 64 TiB; the batches' rows are 256 KiB
        self.assertLess(grown_mb, 64, "the worker's RSS grew %.0f MB" % grown_mb)
        self.assertEqual(dopt.client.stats(0)["rows"], len(seen))
        dopt.close()

    def test_cuda_model_rows_are_staged_to_its_device_and_equal_the_cpu_model(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device")
        outs = {}
        for dev in ("cpu", "cuda"):
            s = pstest.Server("--num-workers", "1", "--mode", "sync")
            torch.manual_seed(2)
            m = nn.Sequential(nn.EmbeddingBag(N, DIM, mode="sum"), nn.Linear(DIM, 1)).to(dev)
            dopt = ps.torch.DistributedOptimizer(
                torch.optim.SGD(m.parameters(), lr=LR), model=m,
                client=ps.Client(servers=s.endpoint, rank=0, num_workers=1, mode="sync"),
                tables="all", table_optimizer={"optimizer": "sgd", "lr": LR})
            got = []
            for k in range(4):
                x = ids([k, 1, 2], [3, 3, 39]).to(dev)
                dopt.zero_grad()
                out = m(x)
                self.assertEqual(out.device.type, dev)
                out.sum().backward()
                dopt.step()
                got.append(out.detach().cpu())
            dopt.finish()
            got.append(m[0].table.lookup(torch.arange(N), None, "cpu")[1])
            dopt.close()
            outs[dev] = got
        for a, b in zip(outs["cpu"], outs["cuda"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    def test_a_short_dlrm_run_learns(self):
        # one plain torch process on the same data reaches 0.776 (ps.torch sync
        # with 2 workers 0.791)
        # (examples/torch_dlrm.py --backend none, these flags); the floor
        # is what a model that learned nothing cannot reach
        launch = os.path.join(pstest.BIN, "ps_launch")
        args = [os.path.join(ROOT, "examples", "torch_dlrm.py"), "--steps", "150", "--rows",
                "20000", "--tables", "4", "--test", "4000"]
        out = subprocess.run([launch, "--servers", "1", "--workers", "2", "--mode", "sync",
                              "--exec", pstest.PYTHON] + args,
                             capture_output=True, text=True, timeout=240)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        aucs = [float(a) for a in re.findall(r"backend ps rank \d of 2 .* test auc ([0-9.]+)",
                                             out.stdout)]
        self.assertEqual(len(aucs), 2, out.stdout[-2000:])
        self.assertEqual(aucs[0], aucs[1])  # sync: every worker ends with the same model
        self.assertGreater(aucs[0], 0.70, out.stdout[-1000:])


if __name__ == "__main__":
    pstest.main()
