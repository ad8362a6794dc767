#!/usr/bin/python3
"""ps.torch against live bin/ps_server processes: sync with 2 workers x
batch b matches 1 worker x batch 2b, worker 0's initial weights win, async
converges, gradients leave during backward last layer first, a torch
optimizer's settings map to the servers' (and train like torch's own), a
model that differs between workers is refused, bad models are refused; the
examples (a short Fashion-MNIST run learns) and ps_launch --exec end to end;
CUDA staging where a GPU is."""

import os
import re
import subprocess
import threading
import time
import unittest

import pstest

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import ps
    import ps.torch
except ImportError as e:  # python3-torch missing: every case says so
    torch = nn = None
    NO_TORCH = "no torch (%s; make deps installs python3-torch)" % e

ROOT = pstest.ROOT
FMNIST = "/usr/share/datasets/fashion-mnist"
# sync W=2 x b against W=1 x 2b: the same arithmetic up to float32 rounding
# (the mean of two means of b against one mean of 2b, and the server's sum
# in rank order), so after 6 steps every weight agrees to within
SYNC_ATOL, SYNC_RTOL = 1e-6, 1e-4


def need_torch(test):
    return test if torch is not None else unittest.skip(NO_TORCH)(test)


class Net(nn.Module if torch else object):
    """A conv layer, a hidden layer, a parameter used outside any submodule."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc1 = nn.Linear(4 * 6 * 6, 16)
        self.fc2 = nn.Linear(16, 3)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x):
        x = F.relu(self.conv(x)).flatten(1)
        return self.fc2(F.relu(self.fc1(x))) * self.scale


def data(n, seed=0):
    """n 8x8 images; the label is the largest of 3 fixed linear projections."""
    proj = torch.randn(64, 3, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))
    return x, (x.reshape(n, 64) @ proj).argmax(1)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def run_workers(fn, W):
    """fn(rank) in W threads; the first exception is raised here."""
    errors, out = [], [None] * W

    def body(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # re-raised below
            errors.append(e)

    th = [threading.Thread(target=body, args=(r,)) for r in range(W)]
    for t in th:
        t.start()
    for t in th:
        t.join(120)
    if errors:
        raise errors[0]
    return out


def train(endpoint, W, rank, batch, steps, mode, model, x, y, lr=None):
    opt = torch.optim.SGD(model.parameters(), lr=lr) if lr else None
    net = ps.torch.wrap(model, ps.Client(servers=endpoint, rank=rank, num_workers=W, mode=mode),
                        optimizer=opt)
    start = flat(model).clone()
    for s in range(steps):
        lo = s * batch * W + rank * batch
        F.cross_entropy(net(x[lo:lo + batch]), y[lo:lo + batch]).backward()
    net.pull_final()
    end = flat(model).clone()
    net.close()
    return start, end


@need_torch
class Wrapper(unittest.TestCase):
    def setUp(self):
        torch.set_num_threads(1)

    def test_sync_2_workers_batch_b_equal_1_worker_batch_2b(self):
        x, y = data(6 * 32)
        s1 = pstest.Server("--num-workers", "1", "--mode", "sync", "--lr", "0.2")
        _, one = train(s1.endpoint, 1, 0, 32, 6, "sync", Net(5), x, y)
        s2 = pstest.Server("--num-workers", "2", "--mode", "sync", "--lr", "0.2")
        # worker 1 draws other initial weights: worker 0's must win
        models = [Net(5), Net(6)]
        res = run_workers(lambda r: train(s2.endpoint, 2, r, 16, 6, "sync", models[r], x, y), 2)
        (start0, two0), (start1, two1) = res
        self.assertTrue(torch.equal(start0, start1), "worker 1 did not start from worker 0's "
                        "weights")
        self.assertTrue(torch.equal(two0, two1), "the workers end with different weights")
        moved = (two0 != start0).float().mean().item()
        self.assertGreater(moved, 0.9, "only %.0f%% of the weights moved" % (100 * moved))
        err = (two0 - one).abs()
        tol = SYNC_ATOL + SYNC_RTOL * one.abs()
        worst = (err / tol).max().item()
        print("# sync W=2 x 16 vs W=1 x 32, 6 steps: %d weights, max |diff| %.3g, worst %.3f "
              "of the tolerance" % (one.numel(), err.max().item(), worst))
        self.assertLessEqual(worst, 1.0)

    def test_worker_0_initial_weights_win(self):
        s = pstest.Server("--num-workers", "3", "--mode", "async", "--lr", "0.1")

        models = [Net(100 + r) for r in range(3)]  # every worker draws other weights

        def start(r):
            model = models[r]
            net = ps.torch.wrap(model, ps.Client(servers=s.endpoint, rank=r, num_workers=3,
                                                        mode="async"))
            w = flat(model).clone()
            net.close()
            return w

        ws = run_workers(start, 3)
        self.assertTrue(torch.equal(ws[0], flat(Net(100))))
        for r in (1, 2):
            self.assertTrue(torch.equal(ws[r], ws[0]), "worker %d" % r)

    def test_async_2_workers_converge(self):
        x, y = data(2 * 200 * 16, seed=3)
        xt, yt = data(1000, seed=4)
        s = pstest.Server("--num-workers", "2", "--mode", "async", "--lr", "0.1")
        models = [Net(7), Net(8)]

        def work(r):
            model = models[r]
            net = ps.torch.wrap(model, ps.Client(servers=s.endpoint, rank=r, num_workers=2,
                                                        mode="async"))
            losses = []
            # 3 passes: most of these tiny steps go out in sums (applied
            # as their mean: one update for several), so fewer updates
            for k in range(600):
                lo = ((k % 200) * 2 + r) * 16
                loss = F.cross_entropy(net(x[lo:lo + 16]), y[lo:lo + 16])
                loss.backward()
                losses.append(loss.item())
            net.pull_final()
            with torch.no_grad():
                acc = (net(xt).argmax(1) == yt).float().mean().item()
            net.close()
            return sum(losses[:20]) / 20, sum(losses[-20:]) / 20, acc

        res = run_workers(work, 2)
        print("# async W=2, 600 steps each: loss %.3f -> %.3f, held-out accuracy %.3f"
              % (res[0][0], res[0][1], res[0][2]))
        for first, last, acc in res:  # chance: loss ln 3 = 1.10, accuracy 1/3
            self.assertLess(last, 0.75 * first)
            self.assertGreater(acc, 0.6)

    def test_gradients_leave_during_backward_last_layer_first(self):
        s = pstest.Server("--num-workers", "1", "--mode", "async", "--lr", "0.1")
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                              nn.Linear(8, 2))
        net = ps.torch.wrap(model, ps.Client(servers=s.endpoint, mode="async"))
        ex = net.exchange
        events = []
        grad_ready = ex._grad_ready
        ex._grad_ready = lambda i: (events.append(i), grad_ready(i))
        for step in range(2):
            del events[:]
            # a hook on the first layer's output marks where backward is
            h = model[0](torch.randn(4, 8))
            h.register_hook(lambda g: events.append("first layer next"))
            model[4](model[3](model[2](model[1](h)))).sum().backward()
            # params 5..2 (layers 2 and 1, last first) are pushed before backward
            # reaches layer 0, whose params 1 and 0 follow
            self.assertEqual(len(events), 7, events)
            self.assertEqual([i // 2 for i in events[:4]], [2, 2, 1, 1], events)
            self.assertEqual(events[4], "first layer next", events)
            self.assertEqual(sorted(events[5:]), [0, 1], events)
        self.assertEqual(ex.steps, [2] * 6)
        net.close()

    def test_torch_optimizers_map_to_server_flags(self):
        p = [nn.Parameter(torch.zeros(2))]
        flags = ps.torch.server_flags
        self.assertEqual(flags(torch.optim.SGD(p, lr=0.05)),
                         "--optimizer sgd --lr 0.05 --weight-decay 0")
        self.assertEqual(flags(torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4)),
                         "--optimizer momentum --lr 0.1 --weight-decay 0.0001 --momentum 0.9")
        self.assertIn("--optimizer nesterov",
                      flags(torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)))
        self.assertEqual(flags(torch.optim.Adam(p, lr=1e-3, betas=(0.8, 0.99), eps=1e-7)),
                         "--optimizer adam --lr 0.001 --weight-decay 0 --beta1 0.8 "
                         "--beta2 0.99 --eps 1e-07")
        self.assertIn("--optimizer adagrad", flags(torch.optim.Adagrad(p, lr=0.01)))
        self.assertEqual(flags(torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01)),
                         "--optimizer adamw --lr 0.001 --weight-decay 0.01 --beta1 0.9 "
                         "--beta2 0.999 --eps 1e-08")
        for opt, word in [(torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1), "dampening"),
                          (torch.optim.Adam(p, amsgrad=True), "amsgrad"),
                          (torch.optim.AdamW(p, amsgrad=True), "amsgrad"),
                          (torch.optim.Adagrad(p, lr_decay=0.1), "lr_decay"),
                          (torch.optim.RMSprop(p), "RMSprop"),
                          (torch.optim.SGD([{"params": p}, {"params": [nn.Parameter(
                              torch.zeros(1))], "lr": 0.5}], lr=0.1), "groups")]:
            with self.assertRaises(ValueError) as cm:
                flags(opt)
            self.assertIn(word, str(cm.exception))

    def test_server_optimizer_trains_like_the_torch_one(self):
        x, y = data(5 * 32, seed=9)
        for make in (lambda ps_: torch.optim.SGD(ps_, lr=0.05, momentum=0.9, nesterov=True),
                     lambda ps_: torch.optim.Adam(ps_, lr=0.01)):
            local = Net(3)
            opt = make(local.parameters())
            for s_ in range(5):
                opt.zero_grad()
                F.cross_entropy(local(x[s_ * 32:(s_ + 1) * 32]), y[s_ * 32:(s_ + 1) * 32]).backward()
                opt.step()
            model = Net(3)
            topt = make(model.parameters())
            srv = pstest.Server("--num-workers", "1", "--mode", "sync",
                                *ps.torch.server_flags(topt).split())
            dopt = ps.torch.DistributedOptimizer(model, topt, ps.Client(servers=srv.endpoint,
                                                                        mode="sync"))
            for s_ in range(5):
                dopt.zero_grad()
                F.cross_entropy(dopt.model(x[s_ * 32:(s_ + 1) * 32]),
                                y[s_ * 32:(s_ + 1) * 32]).backward()
                dopt.step()
            dopt.pull_final()
            dopt.close()
            diff = (flat(model) - flat(local)).abs().max().item()
            self.assertLess(diff, 1e-5, "%s: servers and torch differ by %g"
                            % (type(topt).__name__, diff))
            srv.stop()

    def test_optimizer_mismatch_is_refused_naming_both(self):
        s = pstest.Server("--num-workers", "1", "--mode", "async", "--optimizer", "momentum",
                          "--lr", "0.05", "--momentum", "0.9")
        model = Net(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with self.assertRaises(ps.PSError) as cm:
            ps.torch.DistributedOptimizer(model, opt, ps.Client(servers=s.endpoint, mode="async"))
        self.assertEqual(cm.exception.code, ps.EMISMATCH)
        self.assertIn("lr: server has 0.05, worker 0 has 0.1", str(cm.exception))

    def test_a_different_model_is_refused_at_start(self):
        s = pstest.Server("--num-workers", "2", "--mode", "sync", "--lr", "0.1")

        class Swapped(nn.Module):  # the same shapes, registered in another order
            def __init__(self):
                super().__init__()
                self.fc2 = nn.Linear(8, 8)
                self.fc1 = nn.Linear(8, 8)

        def same():
            return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))

        out = {}

        def first():
            try:
                out[0] = ps.torch.wrap(same(), ps.Client(servers=s.endpoint, rank=0,
                                                          num_workers=2, mode="sync"))
            except ps.PSError as e:
                out[0] = e

        # worker 0 starts and waits at the start barrier for worker 1
        t0 = threading.Thread(target=first)
        t0.start()
        # the first hello a server accepts fixes its model: worker 0's here
        deadline = time.time() + 20
        while "hello from worker 0" not in open(s.log).read() and time.time() < deadline:
            time.sleep(0.02)
        for model, word in [(Swapped(), "another model"),
                            (nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)), "another model"),
                            (same().double(), "float64")]:
            with self.assertRaises((ps.PSError, TypeError)) as cm:
                ps.torch.wrap(model, ps.Client(servers=s.endpoint, rank=1, num_workers=2,
                                               mode="sync", hello_timeout_ms=3000))
            self.assertIn(word, str(cm.exception))
            if isinstance(cm.exception, ps.PSError):
                self.assertEqual(cm.exception.code, ps.EMISMATCH)
                self.assertIn("same parameter names, shapes and order", str(cm.exception))
        # worker 0 stopped waiting at the first refusal, naming worker 1 and why
        t0.join(30)
        self.assertIsInstance(out.get(0), ps.PSError)
        self.assertEqual(out[0].code, ps.EMISMATCH)
        self.assertIn("worker 1 was refused at hello", str(out[0]))
        self.assertIn("model: server has fingerprint", str(out[0]))

    def test_bad_models_and_clients_are_refused(self):
        s = pstest.Server("--num-workers", "1", "--mode", "async", "--lr", "0.1")
        c = ps.Client(servers=s.endpoint)
        with self.assertRaises(ValueError) as cm:
            ps.torch.wrap(nn.ReLU(), c)
        self.assertIn("no parameters", str(cm.exception))
        c = ps.Client(servers=s.endpoint)
        c.register(0, 4)
        with self.assertRaises(ValueError) as cm:
            ps.torch.wrap(Net(1), c)
        self.assertIn("fresh client", str(cm.exception))
        c.close()


class FakeCudart:
    """cudaHostRegister/Unregister as the driver keeps them: a range locks
    the whole pages it touches, which must not overlap those of one
    registered before, by us or by `foreign` (else 712, already registered);
    a failure stays as the thread's last error until cleared."""

    def __init__(self, page=4096, foreign=(), fail_with=0):
        self.page, self.fail_with = page, fail_with
        self.registered = {}          # address -> bytes
        self.foreign = list(foreign)  # (address, bytes) locked by someone else
        self.calls, self.last_error = 0, 0

    def register(self, addr, size, flags):
        self.calls += 1
        rc = self.fail_with or (1 if flags else 0)
        lo = addr - addr % self.page
        hi = -(-(addr + size) // self.page) * self.page
        if not rc and any(a < hi and lo < a + n
                          for a, n in list(self.registered.items()) + self.foreign):
            rc = 712
        if rc:
            self.last_error = rc
            return rc
        self.registered[lo] = hi - lo
        return 0

    def unregister(self, addr):
        return 0 if self.registered.pop(addr, None) is not None else 1

    def clear(self):
        self.last_error = 0

    def covers(self, addr, size):
        return all(any(a <= b < a + n for a, n in self.registered.items())
                   for b in range(addr, addr + size, 64))


@need_torch
class Pinning(unittest.TestCase):
    """ps.torch page-locks the exchange's buffers for the GPU's copies
    (ps.torch._exchange._Pinner), checked against FakeCudart: no GPU needed."""

    def pinner(self, rt):
        from ps.torch._exchange import _Pinner
        return _Pinner(rt.register, rt.unregister, rt.clear, page=rt.page)

    def test_small_buffers_sharing_pages_register_each_page_once(self):
        rt = FakeCudart()
        pin = self.pinner(rt)
        # 64-byte aligned buffers as the exchange allocates them: 40 of 200
        # bytes (four to a page), then one over three pages
        base, bufs = 16 * 4096 + 64, []
        for k in range(40):
            bufs.append((base + k * 256, 200))
        bufs.append((base + 40 * 256 + 64, 3 * 4096))
        for addr, n in bufs:
            pin.pin(addr, n)
            self.assertEqual(rt.last_error, 0, "a registration failed at %#x" % addr)
        self.assertEqual(pin.error, 0)
        for addr, n in bufs:
            self.assertTrue(rt.covers(addr, n), "%#x + %d is not locked" % (addr, n))
        # 40 * 256 bytes span pages 16..18; the last buffer adds 19..21: one
        # call per run of new pages, no page twice
        self.assertEqual(sum(rt.registered.values()), 6 * 4096)
        self.assertEqual(rt.calls, 4)

    def test_the_arena_is_registered_once_and_its_buffers_need_nothing_more(self):
        rt = FakeCudart()
        pin = self.pinner(rt)
        arena, size = 1 << 20, 64 * 4096
        pin.pin(arena, size)
        for k in range(100):
            pin.pin(arena + 64 + k * 1000, 900)
        self.assertEqual(rt.calls, 1)
        self.assertEqual(rt.registered, {arena: size})

    def test_pages_locked_by_someone_else_clear_the_error_and_pinning_goes_on(self):
        rt = FakeCudart(foreign=[(5 * 4096, 4096)])
        pin = self.pinner(rt)
        pin.pin(4 * 4096 + 128, 2 * 4096)   # pages 4..6, 5 is torch's
        self.assertEqual(rt.last_error, 0, "the 712 was left for torch's next launch check")
        self.assertEqual(pin.error, 0)
        pin.pin(8 * 4096, 100)
        self.assertEqual(rt.registered, {8 * 4096: 4096})

    def test_a_failed_registration_is_cleared_and_ends_pinning(self):
        rt = FakeCudart(fail_with=2)  # cudaErrorMemoryAllocation
        pin = self.pinner(rt)
        pin.pin(4096, 10)
        pin.pin(3 * 4096, 10)
        self.assertEqual((rt.last_error, pin.error, rt.calls), (0, 2, 1))

    def test_unpin_all_unregisters_exactly_what_was_registered(self):
        rt = FakeCudart()
        pin = self.pinner(rt)
        for k in range(10):
            pin.pin(k * 3 * 4096 + 64, 5000)
        self.assertEqual(len(rt.registered), 10)
        pin.unpin_all()
        self.assertEqual((rt.registered, rt.last_error), ({}, 0))


@need_torch
class EndToEnd(unittest.TestCase):
    def test_fashion_mnist_short_run_learns(self):
        if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")):
            self.skipTest("no Fashion-MNIST in %s (make deps installs dataset-fashion-mnist)"
                          % FMNIST)
        s = pstest.Server("--num-workers", "1", "--mode", "async", "--optimizer", "momentum",
                          "--lr", "0.05", "--momentum", "0.9")
        out = subprocess.run([pstest.PYTHON, os.path.join(ROOT, "examples/torch_fashion_mnist.py"),
                              "--servers", s.endpoint, "--mode", "async", "--steps", "100",
                              "--test-samples", "2000",
                              "--optimizer", "momentum", "--lr", "0.05", "--log-every", "50"],
                             capture_output=True, text=True, timeout=240)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        m = re.search(r"summary: .* ([0-9.]+) samples/s per worker, test accuracy ([0-9.]+)",
                      out.stdout)
        self.assertIsNotNone(m, out.stdout)
        print("# Fashion-MNIST CNN, 100 steps of 64 through 1 server: %s samples/s, test "
              "accuracy %s (first 2000 test images)" % (m.group(1), m.group(2)))
        self.assertGreater(float(m.group(2)), 0.65)
        self.assertEqual(len(re.findall(r"iter \d+/100 loss .* samples/s", out.stdout)), 2)

    def test_python_push_pull_example_prints_w0_after_one_step(self):
        s = pstest.Server("--num-workers", "1", "--mode", "async", "--lr", "0.5")
        env = dict(os.environ, PS_SERVERS=s.endpoint, PS_MODE="async")
        out = subprocess.run([pstest.PYTHON, os.path.join(ROOT, "examples/python_push_pull.py")],
                             capture_output=True, text=True, timeout=60, env=env, cwd="/")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("worker 0 of 1: w[0] = 0.9990234375", out.stdout)

    def test_ps_launch_exec_runs_python_workers_that_fit_w_near_1(self):
        launch = os.path.join(pstest.BIN, "ps_launch")
        helptext = subprocess.run([launch, "--help"], capture_output=True, text=True).stdout
        if "--exec" not in helptext:
            self.skipTest("ps_launch has no --exec yet")
        out = subprocess.run([launch, "--servers", "2", "--workers", "2", "--mode", "async",
                              "--lr", "0.5", "--exec",
                              pstest.PYTHON, os.path.join(ROOT, "examples/python_push_pull.py")],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        for r in (0, 1):
            # async: the fit's end depends on how the pushes interleaved; near 1
            m = re.search(r"\[worker %d\].*worker %d of 2: w\[0\] = ([0-9.e+-]+)" % (r, r),
                          out.stdout)
            self.assertIsNotNone(m, out.stdout[-2000:])
            self.assertLess(abs(float(m.group(1)) - 1.0), 0.05, m.group(0))

    def test_cuda_parameters_are_staged_through_pinned_memory(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device")
        x, y = data(4 * 32, seed=11)
        s = pstest.Server("--num-workers", "1", "--mode", "sync", "--lr", "0.2")
        _, cpu_end = train(s.endpoint, 1, 0, 32, 4, "sync", Net(5), x, y)
        s2 = pstest.Server("--num-workers", "1", "--mode", "sync", "--lr", "0.2")
        model = Net(5).cuda()
        net = ps.torch.wrap(model, ps.Client(servers=s2.endpoint, mode="sync"))
        for k in range(4):
            F.cross_entropy(net(x[k * 32:(k + 1) * 32].cuda()), y[k * 32:(k + 1) * 32].cuda()
                            ).backward()
        net.pull_final()
        gpu_end = flat(model).cpu()
        net.close()
        self.assertLess((gpu_end - cpu_end).abs().max().item(), 1e-4)


if __name__ == "__main__":
    pstest.main()
