#!/usr/bin/python3
"""ps.Client's embedding tables against live bin/ps_server processes: the
first rows are ps.table_init's numpy formula bit for bit, sync rows are the
rank-order mean of each row's gradients (a worker's repeated ids summed in
order), rows come back in the caller's order, and bad arguments are refused
with the reason, before anything is sent."""

import threading
import unittest

import numpy as np

import pstest
import ps
from ps import table_init


class Tables(unittest.TestCase):
    def test_first_rows_are_table_init_bit_for_bit_on_every_server(self):
        _, eps = pstest.servers(2, "--num-workers", "1", "--mode", "async")
        ids = np.array([0, 1, 77, 2**63, 2**64 - 1, 12345678901], dtype=np.uint64)
        with ps.Client(servers=eps, rank=0, num_workers=1, mode="async") as c:
            c.register_table(3, 6, init="uniform", scale=0.125, seed=99)
            c.register_table(4, 6, init="normal", scale=0.5, seed=99)
            c.start()
            for key, init, scale in ((3, "uniform", 0.125), (4, "normal", 0.5)):
                rows = np.empty((len(ids), 6), np.float32)
                c.sparse_pull(key, ids, rows, 0).wait()
                want = table_init.initial_rows(99, key, ids, 6, init, scale)
                np.testing.assert_array_equal(rows.view(np.uint32), want.view(np.uint32))
            # the rows are on the servers table_init.place says
            parts = [c.server_parts(0), c.server_parts(1)]
            on0 = sum(int(np.sum(table_init.place(k, ids, 2, parts)[0] == 0)) for k in (3, 4))
            self.assertEqual(c.stats(0)["rows"] + c.stats(1)["rows"], 2 * len(ids))
            self.assertEqual(c.stats(0)["rows"], on0)

    def test_sync_rows_are_the_rank_order_mean_of_summed_repeats(self):
        W, dim, lr = 2, 3, np.float32(0.5)
        _, eps = pstest.servers(2, "--num-workers", str(W), "--mode", "sync")
        ids = [np.array([5, 9, 5, 1 << 40], np.uint64), np.array([9, 7], np.uint64)]
        grads = [np.arange(4 * dim, dtype=np.float32).reshape(4, dim) / 3 - 1,
                 np.arange(2 * dim, dtype=np.float32).reshape(2, dim) / 7 + 2]
        out, errors = {}, []

        def worker(rank):
            try:
                with ps.Client(servers=eps, rank=rank, num_workers=W, mode="sync") as c:
                    c.register_table(8, dim, init="zeros", optimizer={"optimizer": "sgd",
                                                                      "lr": 0.5})
                    c.start()
                    pull = np.array([9, 5, 9, 7, 1 << 40, 3], np.uint64)
                    rows = np.empty((len(pull), dim), np.float32)
                    c.sparse_pushpull(8, ids[rank], grads[rank], pull, rows, 0).wait()
                    out[rank] = rows
            except Exception as e:  # reported below
                errors.append("rank %d: %r" % (rank, e))

        th = [threading.Thread(target=worker, args=(r,)) for r in range(W)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        self.assertEqual(errors, [])
        # each worker's repeats summed in order, then the ranks in order
        sums = {}
        for r in range(W):
            mine = {}
            for i, g in zip(ids[r].tolist(), grads[r]):
                mine[i] = mine[i] + g if i in mine else g.copy()
            for i, g in mine.items():
                sums[i] = sums[i] + g if i in sums else g.copy()
        want = {i: np.zeros(dim, np.float32) - lr * (s / np.float32(W)) for i, s in sums.items()}
        want[3] = np.zeros(dim, np.float32)
        expect = np.stack([want[i] for i in (9, 5, 9, 7, 1 << 40, 3)])
        for r in range(W):
            np.testing.assert_array_equal(out[r], expect)

    def test_bad_table_arguments_are_refused_with_the_reason(self):
        s = pstest.Server("--num-workers", "1", "--mode", "async")
        with ps.Client(servers=s.endpoint, rank=0, num_workers=1, mode="async") as c:
            with self.assertRaises(ps.PSError) as cm:
                c.register_table(2, 0)
            self.assertIn("table 2: dim must be in [1, 65536], got 0", str(cm.exception))
            with self.assertRaises(ValueError):
                c.register_table(2, 4, init="gaussian")
            with self.assertRaises(ValueError):
                c.register_table(2, 4, optimizer={"optimizer": "lamb"})
            with self.assertRaises(ValueError):
                c.register_table(2, 4, max_rows=8, full="drop")
            c.register_table(2, 4, optimizer={"optimizer": "ftrl", "lr": 0.1}, ftrl_l1=0.5)
            c.register_table(6, 4, max_rows=2, full="refuse")
            c.start()
            # a table at its cap that refuses: a new id is refused, those there served
            two = np.empty((2, 4), np.float32)
            c.sparse_pull(6, [10, 11], two, 0).wait()
            with self.assertRaises(ps.PSError) as cm:
                c.sparse_pull(6, [12], two[:1], 0).wait()
            self.assertIn("is full here: 2 rows, its max_rows share 2", str(cm.exception))
            c.sparse_pull(6, [11, 10], two, 0).wait()
            rows = np.empty((2, 4), np.float32)
            with self.assertRaises(KeyError):
                c.sparse_pull(5, [1, 2], rows, 0)
            with self.assertRaises(ValueError):
                c.sparse_pull(2, [1, 2, 3], rows, 0)
            with self.assertRaises(TypeError):
                c.sparse_pull(2, [1, 2], rows.astype(np.float64), 0)
            with self.assertRaises(ValueError):
                c.sparse_push(2, [-1, 2], rows, 0)
            # a list of ints is taken (copied), an empty push too
            c.sparse_pull(2, [1, 2], rows, 0).wait()
            c.sparse_push(2, [], None, 0).wait()


if __name__ == "__main__":
    pstest.main()
