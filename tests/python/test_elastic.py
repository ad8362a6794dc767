#!/usr/bin/python3
"""Elastic jobs from Python (docs/TORCH.md "Elastic jobs"): num_workers
"MIN:MAX", Client.members() and join(), and ps.torch's ElasticSampler,
whose split is a partition of the data among the members of each epoch."""

import unittest

import numpy as np

import pstest
import ps

try:
    import torch
    import ps.torch
except ImportError:
    torch = None


class Elastic(unittest.TestCase):
    def tearDown(self):
        pstest.stop_all()

    def test_num_workers_min_max_is_an_elastic_client(self):
        (s,), eps = pstest.servers(1, "--num-workers", "2:3", "--mode", "async")
        with ps.Client(servers=eps, rank=2, num_workers="2:3", mode="async") as c:
            self.assertEqual((c.num_workers_min, c.num_workers), (2, 3))
            self.assertTrue(c.elastic)
            c.register(5, 8)
            c.start()
            self.assertEqual(c.members()[:2], (0, 1))  # rank 2, the only member: index 0
            c.init(5, np.zeros(8, np.float32)).wait()
            self.assertGreaterEqual(c.join(), 0)
        with self.assertRaises(ValueError):
            ps.Client(servers=eps, num_workers="3:2")
        env = {"PS_NUM_WORKERS": "1:4", "PS_SERVERS": eps}
        c = ps.Client(env=env)
        self.assertEqual((c.num_workers_min, c.num_workers), (1, 4))
        c.close()

    def test_a_fixed_job_refuses_join(self):
        (s,), eps = pstest.servers(1, "--num-workers", "1", "--mode", "async")
        with ps.Client(servers=eps, num_workers=1, mode="async") as c:
            self.assertFalse(c.elastic)
            c.register(5, 4)
            c.start()
            c.init(5, np.zeros(4, np.float32)).wait()
            self.assertEqual(c.members(), (0, 1, 0))
            with self.assertRaises(ps.PSError) as e:
                c.join()
            self.assertIn("elastic job", str(e.exception))

    @unittest.skipIf(torch is None, "no torch")
    def test_distributed_optimizer_follows_the_membership_at_a_step_boundary(self):
        # async, MIN 1: worker 1 trains alone; worker 0 joins (its hello) and
        # leaves; each change reaches the callback at the next step boundary
        s = pstest.Server("--num-workers", "1:2", "--mode", "async", "--optimizer", "sgd",
                          "--lr", "0.1")
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dopt = ps.torch.DistributedOptimizer(
            model, opt, ps.Client(servers=s.endpoint, rank=1, num_workers="1:2", mode="async"))
        seen = []
        dopt.on_membership_change(lambda rank, size: seen.append((rank, size)))
        self.assertEqual(dopt.membership()[:2], (0, 1))
        x = torch.randn(8, 4)

        def step():
            dopt.zero_grad()
            dopt.model(x).sum().backward()
            dopt.step()
        step()
        other = ps.Client(servers=s.endpoint, rank=0, num_workers="1:2", mode="async")
        for i, (name, p) in enumerate(model.named_parameters()):  # the same model
            other.register(ps.torch.param_key(i, name, p.shape), p.numel())
        other.start()
        step()
        self.assertEqual(seen, [(1, 2)])  # rank 1 is now the second of two
        other.leave()
        step()
        self.assertEqual(seen, [(1, 2), (0, 1)])
        self.assertEqual(dopt.membership()[:2], (0, 1))
        other.close()
        dopt.close()

    @unittest.skipIf(torch is None, "no torch")
    def test_elastic_sampler_splits_each_epoch_among_the_members(self):
        from ps.torch import ElasticSampler
        data = list(range(103))
        view = {"size": 3}
        for epoch, size in ((0, 3), (1, 2), (2, 4)):
            view["size"] = size
            seen = []
            for r in range(size):
                smp = ElasticSampler(data, seed=7, membership=lambda r=r: (r, view["size"], 0))
                smp.set_epoch(epoch)
                idx = list(smp)
                self.assertEqual(len(idx), len(smp))
                seen += idx
            # every index, and only the padding twice
            self.assertEqual(set(seen), set(data))
            self.assertEqual(len(seen), -(-len(data) // size) * size)
            # drop_last: the shares are disjoint
            shares = []
            for r in range(size):
                smp = ElasticSampler(data, seed=7, drop_last=True,
                                     membership=lambda r=r: (r, view["size"], 0))
                smp.set_epoch(epoch)
                shares += list(smp)
            self.assertEqual(len(shares), len(set(shares)))
            self.assertEqual(len(shares), len(data) // size * size)
        smp = ElasticSampler(data, membership=lambda: (-1, 2, 5))
        with self.assertRaises(RuntimeError):
            smp.set_epoch(0)


if __name__ == "__main__":
    pstest.main()
