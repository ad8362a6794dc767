#!/usr/bin/python3
"""ps.Client against live bin/ps_server processes, with the exact
expectations of tests/test_client.c: async sums exactly, sync is
w - lr*mean(g) summed in rank order, bounded staleness blocks only beyond
the bound, mismatches are refused at start; plus what only the binding can
get wrong: the struct layouts, buffers taken without a copy and refused when
they are not contiguous float32, errors as exceptions with libps's text, the
GIL released while waiting, closing."""

import ctypes
import socket
import subprocess
import threading
import time
import unittest
import urllib.request

import numpy as np

import pstest
import ps
from ps import _lib

try:
    import torch
except ImportError:  # the torch cases of this file need it; the rest does not
    torch = None

WAIT = 10  # s: bound on anything that must complete


def wait_done(req, secs=WAIT):
    t = time.time() + secs
    while time.time() < t:
        if req.done():
            return True
        time.sleep(0.002)
    return False


def grad_val(rank, n, step):
    """Mixed magnitudes, so the float32 sum depends on its order (as
    grad_val in tests/test_client.c)."""
    i = np.arange(n, dtype=np.uint64)
    x = ((rank * 7919 + i * 104729 + step * 1299709) * 2654435761) & 0xFFFFFFFF
    m = (x >> 8).astype(np.float64) / float(1 << 24)
    e = ((x >> 3) % 24).astype(np.int64) - 12
    sign = np.where(x & 1, -1.0, 1.0)
    return (sign * np.ldexp(1.0 + m, e)).astype(np.float32)


class Layout(unittest.TestCase):
    def test_struct_layout_matches_the_c_headers(self):
        out = subprocess.run([pstest.BUILD + "/tests/abi_layout"], check=True,
                             capture_output=True, text=True).stdout
        structs = {"ps_request": _lib.RequestStruct, "ps_opt_config": _lib.OptConfig,
                   "ps_client_options": _lib.ClientOptions, "ps_stats": _lib.Stats,
                   "ps_table_options": _lib.TableOptions,
                   "ps_barrier_info": _lib.BarrierInfo}
        seen = set()
        for line in out.splitlines():
            w = line.split()
            if w[0] in structs:
                self.assertEqual(ctypes.sizeof(structs[w[0]]), int(w[1]), "sizeof " + w[0])
                seen.add(w[0])
            elif "." in w[0]:
                s, f = w[0].split(".")
                desc = getattr(structs[s], f)
                self.assertEqual((desc.offset, desc.size), (int(w[1]), int(w[2])), w[0])
                seen.add(w[0])
            elif w[0] == "opt_param":
                field, flag, default, is_int = _lib.OPT_PARAMS[int(w[1])]
                self.assertEqual((field, flag, is_int), (w[2], w[3], w[5] == "1"), line)
                self.assertAlmostEqual(default, float(w[4]), delta=abs(default) * 1e-7)
            elif w[0] == "opt_kinds":
                self.assertEqual([int(v) for v in w[1:]],
                                 [k for k, name in enumerate(_lib.OPT_KINDS) if name])
            elif w[0] == "modes":
                self.assertEqual((int(w[1]), int(w[2])), (ps.SYNC, ps.ASYNC))
            elif w[0] == "table_inits":
                self.assertEqual([int(v) for v in w[1:4]], list(range(len(_lib.TABLE_INITS))))
                self.assertEqual(int(w[5]), _lib.OPT_FTRL)
                self.assertEqual(int(w[7]), _lib.OPT_ROWWISE_ADAGRAD)
            elif w[0] == "error":
                self.assertEqual(getattr(ps, w[1][3:]), int(w[2]), line)
            elif w[0] == "err_text_max":
                self.assertEqual(_lib.ERR_TEXT_MAX, int(w[1]))
        # every field of every mirrored struct was compared
        for s, cls in structs.items():
            for f, _ in cls._fields_:
                self.assertIn(s + "." + f, seen)
        self.assertEqual(len(_lib.OPT_PARAMS), sum(1 for l in out.splitlines()
                                                   if l.startswith("opt_param ")))


class Metrics(unittest.TestCase):
    def test_client_serves_its_metrics_when_ps_metrics_port_asks(self):
        s = pstest.Server("--mode", "async")
        with socket.socket() as k:  # a free port
            k.bind(("127.0.0.1", 0))
            port = k.getsockname()[1]
        with ps.Client(servers=s.endpoint, mode="async") as c:
            self.assertIsNone(c.metrics_url)  # off unless asked
        with ps.Client(servers=s.endpoint, mode="async",
                       env={"PS_METRICS_PORT": str(port)}) as c:
            self.assertEqual(c.metrics_url, "http://127.0.0.1:%d/metrics" % port)
            c.register(3, 10)
            c.start()
            c.init(3, np.zeros(10, np.float32)).wait()
            for step in range(2):
                c.push(3, np.ones(10, np.float32), step).wait()
            page = urllib.request.urlopen(c.metrics_url, timeout=WAIT).read().decode()
        self.assertIn('ps_client_requests_total{rank="0",mode="async",type="push"} 2\n', page)
        self.assertIn('ps_client_wait_seconds_total{rank="0",mode="async"} ', page)


class Semantics(unittest.TestCase):
    def test_async_pushes_from_threads_sum_exactly(self):
        W, K, n = 3, 20, 3000
        s = pstest.Server("--num-workers", str(W), "--mode", "async", "--lr", "0.5")
        init = (np.arange(n) % 17 - 8).astype(np.float32)
        errors = []

        def worker(rank):
            try:
                with ps.Client(servers=s.endpoint, rank=rank, num_workers=W, mode="async") as c:
                    c.register(11, n)
                    c.start()
                    c.init(11, init).wait()
                    g = np.empty(n, np.float32)
                    for k in range(K):
                        # multiples of 1/8: every partial sum is exact in any order
                        g[:] = (rank + 1) * (np.arange(n) % 5 + 1) * (k % 3 + 1) / 8.0
                        c.push(11, g, k).wait()
            except Exception as e:  # reported below
                errors.append("rank %d: %r" % (rank, e))

        th = [threading.Thread(target=worker, args=(r,)) for r in range(W)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        self.assertEqual(errors, [])
        with ps.Client(servers=s.endpoint, rank=0, num_workers=W, mode="async") as c:
            c.register(11, n)
            c.start()
            dst = np.zeros(n, np.float32)
            self.assertEqual(c.pull(11, dst, 0).wait(), W * K)
        total = sum((r + 1) * (np.arange(n) % 5 + 1) * (k % 3 + 1) / 8.0
                    for r in range(W) for k in range(K))
        want = (init.astype(np.float64) - 0.5 * total).astype(np.float32)
        np.testing.assert_array_equal(dst, want)

    def test_sync_pull_waits_for_all_and_is_the_rank_order_mean(self):
        W, n, lr = 2, 1000, np.float32(0.1)
        _, eps = pstest.servers(2, "--num-workers", str(W), "--mode", "sync", "--lr", "0.1")
        # 400 floats a chunk: 3 chunks over 2 servers
        cs = [ps.Client(servers=eps, rank=r, num_workers=W, mode="sync", chunk_size=1600)
              for r in range(W)]
        try:
            for c in cs:
                c.register(7, n)
                c.start()
            w = (np.arange(n) * 0.001 - 0.5).astype(np.float32)
            cs[0].init(7, w).wait()
            for t in range(3):
                g = [grad_val(r, n, t) for r in range(W)]
                # sum in rank order, divide by W, one SGD step: float32 throughout
                # torch's w.add_(mean, alpha=-lr): one fused multiply-add
                want = (w.astype(np.float64) - lr.astype(np.float64) *
                        ((g[0] + g[1]) / np.float32(W)).astype(np.float64)).astype(np.float32)
                last = [1, 0, 1][t]
                cs[1 - last].push(7, g[1 - last], t).wait()
                dst = [np.zeros(n, np.float32) for _ in range(W)]
                pull = cs[0].pull(7, dst[0], t + 1)
                time.sleep(0.1)
                self.assertFalse(pull.done(), "step %d: the pull of version %d completed "
                                 "before every worker pushed" % (t, t + 1))
                cs[last].push(7, g[last], t).wait()
                self.assertGreaterEqual(pull.wait(), t + 1)
                cs[1].pull(7, dst[1], t + 1).wait()
                for r in range(W):
                    np.testing.assert_array_equal(dst[r], want, "step %d rank %d" % (t, r))
                w = want
        finally:
            for c in cs:
                c.close()

    def test_staleness_blocks_only_beyond_the_bound(self):
        for K in (0, 2):
            s = pstest.Server("--num-workers", "2", "--mode", "async", "--max-staleness",
                              str(K), "--lr", "0.5")
            n = 16
            g = np.ones(n, np.float32)
            a = ps.Client(servers=s.endpoint, rank=0, num_workers=2, mode="async", max_staleness=K)
            b = ps.Client(servers=s.endpoint, rank=1, num_workers=2, mode="async", max_staleness=K)
            with a, b:
                for c in (a, b):
                    c.register(1, n)
                    c.start()
                a.init(1, np.zeros(n, np.float32)).wait()
                for t in range(K + 1):  # worker 0 runs K+1 steps ahead
                    a.push(1, g, t).wait()
                dst = np.zeros(n, np.float32)
                near = a.pull(1, dst, K)
                self.assertTrue(wait_done(near, 2), "K=%d: pull within the bound blocked" % K)
                far = a.pull(1, dst, K + 1)
                time.sleep(0.15)
                self.assertFalse(far.done(), "K=%d: pull beyond the bound did not wait" % K)
                b.push(1, g, 0).wait()
                self.assertEqual(far.wait(), K + 2)
                self.assertEqual(dst[0], np.float32(-0.5 * (K + 2)))
            s.stop()

    def test_mismatch_is_refused_at_start_with_both_values(self):
        s = pstest.Server("--num-workers", "2", "--mode", "sync", "--optimizer", "sgd",
                          "--lr", "0.05")
        cases = [
            (dict(mode="async"), "mode"),
            (dict(mode="sync", num_workers=3), "worker"),
            (dict(mode="sync", expect={"optimizer": "adam"}), "adam"),
            (dict(mode="sync", expect={"lr": 0.1}), "0.05"),
        ]
        for kw, word in cases:
            kw.setdefault("num_workers", 2)
            with ps.Client(servers=s.endpoint, rank=0, hello_timeout_ms=3000, **kw) as c:
                c.register(0, 10)
                with self.assertRaises(ps.PSError) as cm:
                    c.start()
                self.assertEqual(cm.exception.code, ps.EMISMATCH, str(cm.exception))
                self.assertIn(word, str(cm.exception))


class WireDtype(unittest.TestCase):
    def test_bf16_wire_is_the_rank_order_mean_of_rounded_gradients_on_a_float32_master(self):
        """As tests/test_client.c: the servers widen each rounded gradient, sum
        in rank order on float32 weights, and a pull returns them rounded."""
        W, n, lr = 2, 1000, np.float32(0.1)
        _, eps = pstest.servers(2, "--num-workers", str(W), "--mode", "sync", "--lr", "0.1",
                                "--wire-dtype", "bf16")

        def bf16(x):  # round to nearest even, as proto/ps_dtype.c (no NaN here)
            u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
            r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            return r.astype(np.uint32).view(np.float32)

        cs = [ps.Client(servers=eps, rank=r, num_workers=W, mode="sync", chunk_size=1600,
                        env={"PS_WIRE_DTYPE": "bf16"}) for r in range(W)]
        try:
            for c in cs:
                c.register(7, n)
                c.start()
            w = (np.arange(n) * 0.001 - 0.5).astype(np.float32)
            cs[0].init(7, w).wait()
            for t in range(3):
                g = [grad_val(r, n, t) for r in range(W)]
                w = w - lr * ((bf16(g[0]) + bf16(g[1])) / np.float32(W))
                for r in range(W):
                    cs[r].push(7, g[r], t).wait()
                for r in range(W):
                    dst = np.zeros(n, np.float32)
                    cs[r].pull(7, dst, t + 1).wait()
                    np.testing.assert_array_equal(dst, bf16(w), "step %d rank %d" % (t, r))
        finally:
            for c in cs:
                c.close()
        # a float32 client against these servers: refused, naming both
        with ps.Client(servers=eps, rank=0, num_workers=W, mode="sync",
                       hello_timeout_ms=3000) as c:
            c.register(7, n)
            with self.assertRaises(ps.PSError) as cm:
                c.start()
            self.assertEqual(cm.exception.code, ps.EMISMATCH, str(cm.exception))
            self.assertIn("bf16", str(cm.exception))
        with self.assertRaises(ValueError):
            ps.Client(servers=eps, wire_dtype="f8")


class Binding(unittest.TestCase):
    def setUp(self):
        self.s = pstest.Server("--num-workers", "1", "--mode", "async", "--lr", "0.5")
        self.c = ps.Client(servers=self.s.endpoint, mode="async")
        self.c.register(0, 8)
        self.c.start()
        self.c.init(0, np.zeros(8, np.float32)).wait()

    def tearDown(self):
        self.c.close()

    def test_bad_buffers_are_refused_with_a_clear_error(self):
        c = self.c
        bad = [
            (np.zeros(8), TypeError, "float64"),
            (np.zeros(16, np.float32)[::2], ValueError, "contiguous"),
            (np.zeros(9, np.float32), ValueError, "registered with 8"),
            (np.zeros(8, np.int32), TypeError, "int32"),
            ([0.0] * 8, TypeError, "no array"),
            ("eight", TypeError, "no array"),
            (None, TypeError, "no array"),
        ]
        if torch is not None:
            bad += [(torch.zeros(8, dtype=torch.float64), TypeError, "float64"),
                    (torch.zeros(4, 4).t(), ValueError, "contiguous"),
                    (torch.zeros(9), ValueError, "registered with 8")]
        for arr, exc, word in bad:
            for post in (lambda a: c.push(0, a, 0), lambda a: c.pull(0, a, 0)):
                with self.assertRaises(exc) as cm:
                    post(arr)
                self.assertIn(word, str(cm.exception))
        ro = np.zeros(8, np.float32)
        ro.setflags(write=False)
        with self.assertRaises(ValueError) as cm:
            c.pull(0, ro, 0)
        self.assertIn("read-only", str(cm.exception))
        with self.assertRaises(KeyError):
            c.push(5, np.zeros(8, np.float32), 0)
        # and the client still works
        c.push(0, ro, 0).wait()
        dst = np.zeros(8, np.float32)
        self.assertEqual(c.pull(0, dst, 1).wait(), 1)
        np.testing.assert_array_equal(dst, np.zeros(8, np.float32))

    def test_numpy_torch_and_buffers_are_used_in_place(self):
        import array
        if torch is None:
            self.skipTest("no torch (make deps installs python3-torch)")
        c = self.c
        g = torch.full((2, 4), 2.0)
        c.push(0, g, 0).wait()
        dst = torch.zeros(8)
        ptr = dst.data_ptr()
        c.pull(0, dst, 1).wait()
        self.assertEqual(dst.data_ptr(), ptr)
        self.assertTrue(torch.equal(dst, torch.full((8,), -1.0)))  # 0 - 0.5*2
        a = array.array("f", [0.0] * 8)
        c.pull(0, a, 1).wait()
        self.assertEqual(list(a), [-1.0] * 8)
        v = np.zeros((2, 4), np.float32)
        c.pushpull(0, np.ones(8, np.float32), v, 1).wait()
        np.testing.assert_array_equal(v, np.full((2, 4), -1.5, np.float32))

    def test_request_errors_carry_libps_text(self):
        c = ps.Client(servers=self.s.endpoint, rank=0, num_workers=2, hello_timeout_ms=2000)
        c.register(0, 8)
        with self.assertRaises(ps.PSError) as cm:
            c.start()
        e = cm.exception
        self.assertEqual((e.code, e.name), (ps.EMISMATCH, "PS_EMISMATCH"))
        self.assertIn("start:", str(e))
        self.assertGreater(len(e.message), 20)
        c.close()
        with self.assertRaises(ps.PSError) as cm:
            c.push(0, np.zeros(8, np.float32), 0)
        self.assertEqual(cm.exception.code, ps.ECLOSED)
        with self.assertRaises(ps.PSError) as cm:
            ps.Client(servers="tcp://127.0.0.1", rank=0)
        self.assertIn("tcp://HOST:PORT", str(cm.exception))

    def test_settings_come_from_the_environment_like_ps_worker(self):
        ep = self.s.endpoint
        cases = [
            ({"PS_SERVERS": ep}, (0, 1)),
            ({"PS_SERVERS": ep, "PS_RANK": "1", "PS_NUM_WORKERS": "3"}, (1, 3)),
            ({"PS_SERVERS": ep, "SLURM_PROCID": "2", "SLURM_NTASKS": "4"}, (2, 4)),
            ({"PS_SERVERS": ep, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
             (1, 2)),
            ({"PS_SERVERS": ep, "PMI_RANK": "3", "PMI_SIZE": "5"}, (3, 5)),
            ({"PS_SERVERS": ep, "PS_RANK": "0", "SLURM_PROCID": "7", "PS_NUM_WORKERS": "2",
              "SLURM_NTASKS": "8"}, (0, 2)),
        ]
        for env, (rank, size) in cases:
            with ps.Client(env=env) as c:
                self.assertEqual((c.rank, c.num_workers, c.servers), (rank, size, ep))
        # ps_worker's defaults and variables, from libps's settings table
        with ps.Client(env={"PS_SERVERS": ep}) as c:
            self.assertEqual((c.mode, c.max_staleness, c.chunk_bytes), (ps.SYNC, 0, 4 << 20))
            self.assertEqual((c.options.request_timeout_ms, c.options.hello_timeout_ms,
                              c.options.heartbeat_ms, c.options.server_timeout_ms, c.shm),
                             (5000, 10000, 1000, 60000, True))
        with ps.Client(env={"PS_SERVERS": ep, "PS_SERVER_TIMEOUT": "2.5", "PS_SHM": "off",
                            "PS_HEARTBEAT": "250", "PS_MODE": "async",
                            "PS_MAX_STALENESS": "4"}) as c:  # seconds, as --server-timeout
            self.assertEqual((c.options.server_timeout_ms, c.shm, c.options.heartbeat_ms),
                             (2500, False, 250))
            self.assertEqual((c.mode, c.max_staleness), (ps.ASYNC, 4))
        with ps.Client(env={"PS_SERVERS": ep, "PS_MODE": "async"}, mode="sync") as c:
            self.assertEqual(c.mode, ps.SYNC)  # the argument wins
        self.assertEqual(ps.RANK_ENV, ("PS_RANK", "RANK", "SLURM_PROCID",
                                       "OMPI_COMM_WORLD_RANK", "PMI_RANK"))
        with ps.Client(env={"PS_SERVERS": ep, "PS_MODE": "sync", "PS_CHUNK_SIZE": "1M",
                            "PS_OPTIMIZER": "adam", "PS_LR": "0.001"}) as c:
            self.assertEqual((c.mode, c.max_staleness, c.chunk_bytes), (ps.SYNC, 0, 1 << 20))
            self.assertEqual(c.options.expect.kind, 5)
            self.assertAlmostEqual(c.options.expect.lr, 0.001, places=6)
        for env, word in [({}, "PS_SERVERS"),
                          ({"PS_SERVERS": ep, "PS_RANK": "2", "PS_NUM_WORKERS": "2"}, "rank"),
                          ({"PS_SERVERS": ep, "PS_RANK": "x"}, "PS_RANK"),
                          ({"PS_SERVERS": ep, "PS_MODE": "bsp"}, "mode")]:
            with self.assertRaises(ValueError) as cm:
                ps.Client(env=env)
            self.assertIn(word, str(cm.exception))

    def test_waiting_releases_the_gil(self):
        s = pstest.Server("--num-workers", "2", "--mode", "sync", "--lr", "0.5")
        a = ps.Client(servers=s.endpoint, rank=0, num_workers=2, mode="sync")
        b = ps.Client(servers=s.endpoint, rank=1, num_workers=2, mode="sync")
        with a, b:
            for c in (a, b):
                c.register(0, 8)
                c.start()
            a.init(0, np.zeros(8, np.float32)).wait()
            a.push(0, np.ones(8, np.float32), 0).wait()
            dst = np.zeros(8, np.float32)
            pull = a.pull(0, dst, 1)  # waits for worker 1's push
            ticks = []
            th = threading.Thread(target=pull.wait)
            th.start()
            t_end = time.time() + 0.3
            while time.time() < t_end:  # Python runs while the other thread waits in C
                ticks.append(1)
            self.assertTrue(th.is_alive())
            b.push(0, np.ones(8, np.float32), 0).wait()
            th.join(WAIT)
            self.assertFalse(th.is_alive())
            self.assertGreater(len(ticks), 1000)
            self.assertEqual(pull.version, 1)

    def test_close_completes_pending_requests(self):
        s = pstest.Server("--num-workers", "2", "--mode", "sync", "--lr", "0.5")
        with ps.Client(servers=s.endpoint, rank=0, num_workers=2, mode="sync") as c:
            c.register(0, 8)
            c.start()
            c.init(0, np.zeros(8, np.float32)).wait()
            c.push(0, np.ones(8, np.float32), 0).wait()
            dst = np.zeros(8, np.float32)
            pull = c.pull(0, dst, 1)  # never answered: worker 1 does not exist
            self.assertFalse(pull.done())
        self.assertTrue(c.closed)
        self.assertTrue(pull.done())
        with self.assertRaises(ps.PSError) as cm:
            pull.wait()
        self.assertEqual(cm.exception.code, ps.ECLOSED)
        c.close()  # idempotent


if __name__ == "__main__":
    pstest.main()
