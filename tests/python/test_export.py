"""The model leaves the servers (docs/TORCH.md "Export and serve"):
ps.torch.export writes the plain model's state_dict beside the tables'
files, which the model without ps loads; the DLRM example's eval of an
export prints the live job's test AUC; a Reader looks rows up by table
name while the job runs and is refused pushes; tables_from= starts a new
job from an export on servers that imported it."""

import json
import os
import re
import subprocess
import unittest

import numpy as np

import pstest
from test_torch import need_torch

try:
    import torch
    import torch.nn as nn
    import ps
    import ps.torch
    from ps import table_init
except ImportError:  # need_torch skips
    pass

N, DIM, LR = 50, 4, 0.2


class Net(nn.Module if "nn" in globals() else object):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.lin = nn.Linear(2, DIM)
        self.emb = nn.EmbeddingBag(N, DIM, mode="sum")
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x, ids):
        return (self.lin(x) * self.scale + self.emb(ids)).sum(1)


def batch(k):
    g = torch.Generator().manual_seed(k)
    return torch.rand(8, 2, generator=g), torch.randint(0, N // 2, (8, 2), generator=g)


def train(server, steps, tables_from=None):
    m = Net()
    opt = ps.torch.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=LR), model=m,
        client=ps.Client(servers=server, rank=0, num_workers=1, mode="sync"),
        tables={"emb": {"init": "uniform", "scale": 0.1, "seed": 4}},
        table_optimizer={"optimizer": "adagrad", "lr": 0.1}, tables_from=tables_from)
    for k in range(steps):
        x, i = batch(k)
        opt.zero_grad()
        m(x, i).sum().backward()
        opt.step()
    opt.pull_final()
    return m, opt


@need_torch
class ExportTest(unittest.TestCase):
    def test_the_plain_model_loads_the_export(self):
        s = pstest.Server("--num-workers", "1", "--mode", "sync", "--optimizer", "sgd",
                          "--lr", str(LR))
        m, opt = train(s.endpoint, 4)
        path = os.path.join(pstest.TMP, "exp-plain")
        man = opt.export(path)
        self.assertEqual(man["step"], 4)
        self.assertTrue(os.path.exists(os.path.join(path, "model.pt")))
        self.assertFalse(os.path.exists(path + ".torch-partial"))
        plain = Net()
        plain.load_state_dict(torch.load(os.path.join(path, "model.pt")))  # strict
        # the dense layers are the servers' (what the job pulled at the end)
        torch.testing.assert_close(plain.lin.weight, m.lin.weight, rtol=0, atol=0)
        self.assertEqual(float(plain.scale), 2.0)
        # the table: rows made on the servers are theirs, the rest their initializer
        t = next(e for e in man["tables"] if e["name"] == "emb")
        self.assertTrue(t["in_state_dict"])
        ids = np.load(os.path.join(path, t["ids"]))
        rows = np.load(os.path.join(path, t["weights"]))
        w = plain.emb.weight.detach().numpy()
        np.testing.assert_array_equal(w[ids.astype(np.int64)], rows)
        rest = np.setdiff1d(np.arange(N), ids.astype(np.int64))
        self.assertGreater(len(rest), 0)
        np.testing.assert_array_equal(
            w[rest], table_init.initial_rows(4, t["key"], rest.astype(np.uint64), DIM,
                                             "uniform", 0.1))
        # the same outputs as the job's model
        x, i = batch(99)
        with torch.no_grad():
            torch.testing.assert_close(plain(x, i), m(x, i), rtol=0, atol=0)
        # a reader by name, while the servers run; refused a push
        with ps.torch.Reader(path, servers=s.endpoint) as rd:
            got = ps.torch.lookup(rd, {"emb": ids[:5].astype(np.int64)})["emb"].numpy()
            np.testing.assert_array_equal(got, rows[:5])
            self.assertEqual(rd.version, 4)
            lin = Net()
            self.assertEqual(rd.load_dense(lin), 4)
            torch.testing.assert_close(lin.lin.bias, m.lin.bias, rtol=0, atol=0)
            with self.assertRaises(ps.PSError) as cm:
                rd.client.sparse_push(t["key"], [1], np.zeros(DIM, np.float32), 0)
            self.assertIn("reader", str(cm.exception))
        opt.close()

    def test_tables_from_starts_a_new_job_where_the_export_left(self):
        s = pstest.Server("--num-workers", "1", "--mode", "sync", "--optimizer", "sgd",
                          "--lr", str(LR))
        m, opt = train(s.endpoint, 3)
        path = os.path.join(pstest.TMP, "exp-warm")
        opt.export(path)
        x, i = batch(7)
        with torch.no_grad():
            want = m(x, i)
        opt.close()
        # servers that did not import it are told so
        s2 = pstest.Server("--num-workers", "1", "--mode", "sync", "--optimizer", "sgd",
                           "--lr", str(LR))
        with self.assertRaises(RuntimeError) as cm:
            train(s2.endpoint, 0, tables_from=path)
        self.assertIn("ps_server --import", str(cm.exception))
        s3 = pstest.Server("--num-workers", "1", "--mode", "sync", "--optimizer", "sgd",
                           "--lr", str(LR), "--import", path, num_servers=1)
        m3, opt3 = train(s3.endpoint, 0, tables_from=path)
        with torch.no_grad():
            torch.testing.assert_close(m3(x, i), want, rtol=0, atol=0)
        opt3.close()

    def test_the_dlrm_eval_of_an_export_is_the_live_auc(self):
        launch = os.path.join(pstest.BIN, "ps_launch")
        exp = os.path.join(pstest.TMP, "exp-dlrm")
        args = [os.path.join(pstest.ROOT, "examples", "torch_dlrm.py"), "--steps", "40",
                "--rows", "3000", "--tables", "3", "--test", "2000", "--batch", "64"]
        out = subprocess.run([launch, "--servers", "2", "--workers", "2", "--mode", "sync",
                              "--exec", pstest.PYTHON] + args + ["--export", exp],
                             capture_output=True, text=True, timeout=240)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        live = re.findall(r"backend ps rank 0 of 2 .* test auc ([0-9.]+)", out.stdout)
        self.assertEqual(len(live), 1, out.stdout[-2000:])
        with open(os.path.join(exp, "manifest.json")) as f:
            man = json.load(f)
        self.assertEqual(man["step"], 40)
        self.assertIn("one round", man["consistency"])
        ev = subprocess.run([pstest.PYTHON] + args + ["--eval-export", exp],
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PS_NUM_WORKERS="2"))
        self.assertEqual(ev.returncode, 0, ev.stdout[-2000:] + ev.stderr[-2000:])
        got = re.findall(r"eval of export .* \(step 40\) test auc ([0-9.]+)", ev.stdout)
        self.assertEqual(got, live, ev.stdout)


if __name__ == "__main__":
    pstest.main()
