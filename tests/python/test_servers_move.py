#!/usr/bin/python3
"""Servers added and removed while ps.torch trains (docs/OPERATIONS.md
"Servers added and removed"): the DistributedOptimizer's requests follow
the moved chunks through libps, and a sync run ends with the weights of
the same run without the moves, bit for bit."""

import os
import subprocess
import unittest

import pstest

try:
    import torch
    import ps
    import ps.torch
except ImportError:
    torch = None

TOKEN = "python-test-admin-token-0123456789"


def token_file():
    path = os.path.join(pstest.TMP, "admin.token")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(path, 0o600)
    return path


def ps_servers(eps, *args):
    return subprocess.Popen([os.path.join(pstest.BIN, "ps_servers"), "--servers", eps,
                             "--admin-token-file", token_file()] + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@unittest.skipIf(torch is None, "no torch")
class ServersMove(unittest.TestCase):
    def tearDown(self):
        pstest.stop_all()

    def train(self, moves):
        flags = ["--num-workers", "1", "--mode", "sync", "--optimizer", "sgd", "--lr", "0.1",
                 "--admin-token-file", token_file()]
        ss, eps = pstest.servers(2, *flags)
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dopt = ps.torch.DistributedOptimizer(
            model, opt, ps.Client(servers=eps, rank=0, num_workers=1, mode="sync"))
        g = torch.Generator().manual_seed(5)
        said = []
        tool = None
        for step in range(40):
            if moves and step == 10:  # a third server joins while steps go on
                added = pstest.Server(*flags, "--added", rank=2, num_servers=2)
                tool = ps_servers(eps, "add", added.endpoint)
            if moves and step == 25:
                said.append(tool.communicate(timeout=60)[0])
                self.assertEqual(tool.returncode, 0, said[-1])
                tool = ps_servers(eps, "remove", "1")
            x = torch.randn(16, 32, generator=g)
            y = torch.randint(0, 10, (16,), generator=g)
            dopt.zero_grad()
            torch.nn.functional.cross_entropy(dopt.model(x), y).backward()
            dopt.step()
        if moves:
            said.append(tool.communicate(timeout=60)[0])
            self.assertEqual(tool.returncode, 0, said[-1])
            ss[1].proc.wait(20)  # the removed server exits by itself, 0
            self.assertEqual(ss[1].proc.returncode, 0)
        w = [p.detach().clone() for p in dopt.model.parameters()]
        dopt.close()
        return w, said

    def test_sync_weights_equal_a_run_without_moves(self):
        want, _ = self.train(False)
        pstest.stop_all()
        got, said = self.train(True)
        self.assertIn("added slot 2", said[0])
        self.assertIn("removed slot 1", said[1])
        for a, b in zip(want, got):
            self.assertTrue(torch.equal(a, b))


if __name__ == "__main__":
    pstest.main()
