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


class Rich(nn.Module if "nn" in globals() else object):
    """Tables three ways, each a TableWeight once wrapped: a materialised
    sparse nn.EmbeddingBag (its rows go to the servers at start), a
    ps.torch.Embedding on the meta device with a padding row (declared
    initializer; plain: an nn.Embedding), and a weight vector read by
    indexing."""

    def __init__(self, plain=False):
        super().__init__()
        torch.manual_seed(5)
        self.lin = nn.Linear(2, DIM)
        self.bag = nn.EmbeddingBag(N, DIM, mode="sum", sparse=True)
        self.emb = (nn.Embedding if plain else ps.torch.Embedding)(N, DIM, padding_idx=0)
        self.bias = nn.Parameter(torch.randn(N) * 0.1)

    def forward(self, x, ids):
        return (self.lin(x) + self.bag(ids) + self.emb(ids).sum(1)).sum(1) + self.bias[ids].sum(1)


def batch(k):
    g = torch.Generator().manual_seed(k)
    return torch.rand(8, 2, generator=g), torch.randint(0, N // 2, (8, 2), generator=g)


def train(server, steps, tables_from=None, start=0, make_opt=None, table_optimizer=None,
          before=None):
    """steps sync steps of Net from step start, then pull_final; before(k,
    opt) runs before step k."""
    m = Net()
    opt = ps.torch.DistributedOptimizer(
        (make_opt or (lambda p: torch.optim.SGD(p, lr=LR)))(m.parameters()), model=m,
        client=ps.Client(servers=server, rank=0, num_workers=1, mode="sync"),
        tables={"emb": {"init": "uniform", "scale": 0.1, "seed": 4}},
        table_optimizer=table_optimizer or {"optimizer": "adagrad", "lr": 0.1},
        tables_from=tables_from)
    for k in range(start, start + steps):
        if before is not None:
            before(k, opt)
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

    def test_tables_as_table_weights_load_into_the_plain_model(self):
        s = pstest.Server("--num-workers", "1", "--mode", "sync", "--optimizer", "sgd",
                          "--lr", str(LR))
        m = Rich()
        opt = ps.torch.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=LR), model=m,
            client=ps.Client(servers=s.endpoint, rank=0, num_workers=1, mode="sync"),
            tables=["bag", "emb", "bias"])
        for name in ("bag.weight", "emb.weight", "bias"):
            self.assertIsInstance(dict(m.named_parameters())[name], ps.torch.TableWeight)
        for k in range(3):
            x, i = batch(k)
            opt.zero_grad()
            m(x, i).sum().backward()
            opt.step()
        opt.pull_final()
        path = os.path.join(pstest.TMP, "exp-tableweights")
        man = opt.export(path)
        t = {e["name"]: e for e in man["torch"]["tables"]}
        self.assertEqual({n: t[n]["param"] for n in t},
                         {"bag": "bag.weight", "emb": "emb.weight", "bias": "bias"})
        self.assertTrue(all(e["in_state_dict"] for e in man["tables"]))
        sd = torch.load(os.path.join(path, "model.pt"))
        self.assertFalse(any(v.is_meta for v in sd.values()))
        plain = Rich(plain=True)
        plain.load_state_dict(sd)  # strict: every entry, of its shape
        self.assertEqual(tuple(plain.bias.shape), (N,))
        self.assertEqual(float(plain.emb.weight[0].abs().sum()), 0.0)  # the padding row
        x, i = batch(50)
        i[0, 0] = 0
        with torch.no_grad():
            want = m(x, i)
            torch.testing.assert_close(plain(x, i), want, rtol=0, atol=0)
        # a reader gives the padding row as the model's lookups do: zeros
        with ps.torch.Reader(path, servers=s.endpoint) as rd:
            got = rd.lookup({"emb": np.array([0, 1, 0])})["emb"].numpy()
        zero = np.zeros(DIM, np.float32)
        np.testing.assert_array_equal(got, np.stack([zero, plain.emb.weight[1].detach().numpy(), zero]))
        opt.close()
        # a warm start with the tables' state reset (their step 0): the
        # materialised modules' own rows are not sent over the imported ones
        s2 = pstest.Server("--num-workers", "1", "--mode", "sync", "--optimizer", "sgd",
                           "--lr", str(LR), "--import", path, "--import-state", "reset")
        m2 = Rich()
        opt2 = ps.torch.DistributedOptimizer(
            torch.optim.SGD(m2.parameters(), lr=LR), model=m2,
            client=ps.Client(servers=s2.endpoint, rank=0, num_workers=1, mode="sync"),
            tables=["bag", "emb", "bias"], tables_from=path)
        with torch.no_grad():
            torch.testing.assert_close(m2(x, i), want, rtol=0, atol=0)
        opt2.close()

    def test_tables_from_keeps_adamw_and_rowwise_adagrad_state(self):
        """A job exports at step K with the state of the servers' AdamW (a
        dense kind with two state arrays) and of its row-wise adagrad table
        (one float a row); a new job on servers that imported it takes step
        K as the first job did, bit for bit."""
        make = lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)  # noqa: E731
        flags = ps.torch.server_flags(make([nn.Parameter(torch.zeros(1))])).split()
        self.assertEqual(flags[:2], ["--optimizer", "adamw"])
        topt = {"optimizer": "rowwise_adagrad", "lr": 0.1}
        K = 3
        s = pstest.Server("--num-workers", "1", "--mode", "sync", *flags)
        path = os.path.join(pstest.TMP, "exp-adamw-rowwise")
        exported = []
        m, opt = train(s.endpoint, K + 1, make_opt=make, table_optimizer=topt,
                       before=lambda k, o: k == K and exported.append(o.export(path)))
        man = exported[0]
        self.assertEqual(man["step"], K)
        self.assertEqual(man["optimizer"]["kind"], "adamw")
        d = man["dense"][0]
        self.assertEqual(len(d["state"]), 2)
        e = next(e for e in man["tables"] if e["name"] == "emb")
        self.assertEqual(e["optimizer"]["kind"], "rowwise_adagrad")
        st = np.load(os.path.join(path, e["state0"]))
        self.assertEqual(st.shape, (e["rows"],))
        self.assertTrue((st >= 0).all() and (st > 0).any())
        x, i = batch(99)
        with torch.no_grad():
            want = m(x, i)
        opt.close()
        s2 = pstest.Server("--num-workers", "1", "--mode", "sync", *flags, "--import", path)
        m2, opt2 = train(s2.endpoint, 1, tables_from=path, start=K, make_opt=make,
                         table_optimizer=topt)
        with torch.no_grad():
            torch.testing.assert_close(m2(x, i), want, rtol=0, atol=0)
        torch.testing.assert_close(m2.lin.weight, m.lin.weight, rtol=0, atol=0)
        opt2.close()

    def test_a_checkpoint_export_gets_the_live_exports_state_dict(self):
        """ps_export --checkpoint-dir writes no model.pt (checkpoints keep no
        names); add_state_dict with the job's spec (here its live export's
        folder) and the plain model writes the one the live export has."""
        ck = os.path.join(pstest.TMP, "ckpt-sd")
        s = pstest.Server("--num-workers", "1", "--mode", "sync", "--optimizer", "sgd",
                          "--lr", str(LR), "--checkpoint-dir", ck, "--checkpoint-every", "2")
        m, opt = train(s.endpoint, 4)
        live = os.path.join(pstest.TMP, "exp-sd-live")
        opt.export(live)
        spec = ps.torch.serving_spec(opt)
        x, i = batch(99)
        with torch.no_grad():
            out = m(x, i)
        opt.close()
        s.stop()  # a clean stop checkpoints the last step
        off = os.path.join(pstest.TMP, "exp-sd-ckpt")
        subprocess.run([os.path.join(pstest.BIN, "ps_export"), "--checkpoint-dir", ck,
                        "--out", off], check=True, timeout=60, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        self.assertFalse(os.path.exists(os.path.join(off, "model.pt")))
        want = torch.load(os.path.join(live, "model.pt"))
        for k, sp in enumerate((live, spec)):
            if k:  # again, from the spec the live job gave
                os.remove(os.path.join(off, "model.pt"))
            man = ps.torch.add_state_dict(off, sp, model=Net())
            self.assertEqual(man["source"], "checkpoint")
            self.assertEqual([t["param"] for t in man["torch"]["tables"]], ["emb.weight"])
            got = torch.load(os.path.join(off, "model.pt"))
            self.assertEqual(list(got), list(want))
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
        plain = Net()
        plain.load_state_dict(got)  # strict
        with torch.no_grad():
            torch.testing.assert_close(plain(x, i), out, rtol=0, atol=0)

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
