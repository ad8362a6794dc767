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

    def test_assign_sets_rows_exactly_and_zeroes_their_state_past_the_wire_type(self):
        """sparse_assign: float32 rows as given (the bf16 wire narrows
        gradients, not these), state zeroed (the adagrad step after it is
        the first), rows made on the partitions holding them, an id twice
        refused, and past --max-memory (a worker's share larger than it) a
        refusal that changes nothing."""
        _, eps = pstest.servers(2, "--num-workers", "1", "--mode", "async",
                                "--wire-dtype", "bf16")
        ids = np.array([3, 1 << 50, 17, 99], np.uint64)
        rows = (np.arange(16, dtype=np.float32).reshape(4, 4) + 1) / 3
        with ps.Client(servers=eps, rank=0, num_workers=1, mode="async",
                       wire_dtype="bf16") as c:
            c.register_table(5, 4, init="zeros", optimizer={"optimizer": "adagrad", "lr": 0.5,
                                                            "eps": 1e-8})
            c.start()
            got = np.empty((4, 4), np.float32)
            c.sparse_pull(5, ids[:2], got[:2], 0).wait()  # two rows exist before
            c.sparse_push(5, ids[:1], np.ones((1, 4), np.float32), 0).wait()
            c.sparse_assign(5, ids, rows).wait()
            c.sparse_pull(5, ids, got, 1).wait()
            np.testing.assert_array_equal(got.view(np.uint32), rows.view(np.uint32))
            g = np.full((1, 4), 2.0, np.float32)  # bf16 holds 2.0 exactly
            c.sparse_push(5, ids[:1], g, 1).wait()
            c.sparse_pull(5, ids[:1], got[:1], 2).wait()
            h = g * g  # the state from zero: the push before the assign is gone
            want = rows[0] - np.float32(0.5) * g[0] / (np.sqrt(h[0]) + np.float32(1e-8))
            np.testing.assert_array_equal(got[0].view(np.uint32), want.view(np.uint32))
            with self.assertRaises(ps.PSError) as cm:
                c.sparse_assign(5, [7, 7], np.zeros((2, 4), np.float32)).wait()
            self.assertIn("id 7 given twice", str(cm.exception))
        s = pstest.Server("--num-workers", "1", "--mode", "async", "--max-memory", "4M",
                          "--table-memory-per-worker", "64M")
        with ps.Client(servers=s.endpoint, rank=0, num_workers=1, mode="async") as c:
            c.register_table(6, 64, init="zeros")
            c.start()
            many = np.arange(1 << 16, dtype=np.uint64)
            with self.assertRaises(ps.PSError) as cm:
                c.sparse_assign(6, many, np.ones((1 << 16, 64), np.float32)).wait()
            self.assertIn("max-memory", str(cm.exception))
            self.assertEqual(c.stats(0)["rows"], 0)

    def test_a_tables_hyper_parameters_change_from_a_step_and_its_name_is_in_the_logs(self):
        """HYPER with a table's key: sync rounds of that table from the step
        given use the new lr (the dense optimizer stays); the reply says what
        the table runs; the declaration's name is in the server's log."""
        s = pstest.Server("--num-workers", "1", "--mode", "sync", "--optimizer", "sgd",
                          "--lr", "0.1")
        with ps.Client(servers=s.endpoint, rank=0, num_workers=1, mode="sync") as c:
            c.register_table(9, 2, name="emb_l.3", init="zeros",
                             optimizer={"optimizer": "sgd", "lr": 0.5})
            c.start()
            now = c.hyper(table=9)
            self.assertEqual((now["optimizer"], now["lr"]), ("sgd", 0.5))
            self.assertEqual(c.hyper(table=9, change={"lr": 0.25}, from_step=1)["lr"], 0.25)
            self.assertAlmostEqual(c.hyper()["lr"], 0.1, places=6)  # the dense one stays
            g = np.ones((1, 2), np.float32)
            row = np.empty((1, 2), np.float32)
            for step in range(3):
                c.sparse_pushpull(9, [4], g, [4], row, step).wait()
            # step 0 at 0.5, steps 1 and 2 at 0.25
            self.assertEqual(row[0, 0], np.float32(-0.5) - np.float32(0.25) - np.float32(0.25))
            with self.assertRaises(ps.PSError) as cm:
                c.hyper(table=9, change={"optimizer": "adam", "lr": 0.1})
            self.assertIn("table 'emb_l.3'", str(cm.exception))
            with self.assertRaises(ps.PSError):
                c.hyper(table=12345, change={"lr": 0.1})
        s.stop()
        log = open(s.log).read()
        self.assertIn("table 'emb_l.3' (key 9) declared by worker 0", log)
        self.assertIn("changed the optimizer of table 'emb_l.3' (key 9) (sgd)", log)


if __name__ == "__main__":
    pstest.main()
