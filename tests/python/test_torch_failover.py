"""ps.torch through a lost server (issue 32): ps_launch --exec runs ps.torch
workers, a server is killed with SIGKILL mid-run, and the job goes on to
the end with the uninterrupted run's weights, bit for bit (sync):

  - with --replicas 1 (its own etcd, --coord auto) the killed primary's
    replica takes over; ps.torch's clients (which give up on a server
    silent 5 s) follow it to the new primary;
  - with --replicas 0 --restart-servers 1 and a checkpoint every round the
    killed server is restarted from its checkpoint (--restore) and the
    workers wait for it: ps_launch gives --exec workers the servers'
    restart time (PS_SERVER_TIMEOUT, --server-timeout's 60 s) instead of
    ps.torch's 5 s."""

import os
import re
import shutil
import signal
import subprocess
import time
import unittest

import pstest

try:
    import torch  # noqa: F401 (the workers import it)
    NO_TORCH = None
except ImportError as e:
    NO_TORCH = "no torch (%s; make deps installs python3-torch)" % e

STEPS = 120
KILL_AT = 40

# a worker: a small linear fit through the servers' SGD, one line a step, and
# its final weights' bytes in hex (the bitwise comparison)
SCRIPT = r'''
import sys, time, torch
import ps.torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = ps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model=model)
g = torch.Generator().manual_seed(1 + ps.torch.rank())
x = torch.randn(64, 16, generator=g)
y = x[:, :4].sum(1, keepdim=True)
for step in range(int(sys.argv[1])):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    print("step %d loss %.6f" % (step, loss.item()), flush=True)
    time.sleep(0.02)
opt.synchronize()
w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
print("weights %s" % w.numpy().tobytes().hex(), flush=True)
'''


def need_launch(test):
    def run(self):
        if NO_TORCH:
            self.skipTest(NO_TORCH)
        return test(self)
    run.__name__ = test.__name__
    return run


class TorchFailover(unittest.TestCase):
    ref = None

    @classmethod
    def setUpClass(cls):
        cls.script = os.path.join(pstest.TMP, "failover_worker.py")
        with open(cls.script, "w") as f:
            f.write(SCRIPT)

    def launch(self, tag, extra):
        """ps_launch 2 servers x 2 sync workers running the script; returns
        (process, path of its combined output)."""
        log = os.path.join(pstest.TMP, "failover-%s.log" % tag)
        env = dict(os.environ, PYTHONPATH=os.path.join(pstest.ROOT, "python"))
        env.pop("PS_SERVER_TIMEOUT", None)  # ps.torch's own 5 s, unless ps_launch says
        argv = [os.path.join(pstest.BIN, "ps_launch"), "--servers", "2", "--workers", "2",
                "--mode", "sync", "--optimizer", "sgd", "--lr", "0.05", "--gpus", "none",
                "--metrics-port", "off"] + extra + \
            ["--exec", pstest.PYTHON, self.script, str(STEPS)]
        out = open(log, "w")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        out.close()
        return p, log

    @staticmethod
    def text(log):
        with open(log, errors="replace") as f:
            return f.read()

    def finish(self, p, log, timeout=180):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait()
            self.fail("ps_launch did not end within %d s:\n%s" % (timeout, self.text(log)[-3000:]))
        t = self.text(log)
        self.assertEqual(rc, 0, t[-3000:])
        w = re.findall(r"\[worker (\d)\].*weights ([0-9a-f]+)", t)
        self.assertEqual(sorted(r for r, _ in w), ["0", "1"], t[-3000:])
        self.assertEqual(w[0][1], w[1][1], "the two workers end with different weights")
        return t, w[0][1]

    def reference(self):
        if TorchFailover.ref is None:
            p, log = self.launch("ref", [])
            TorchFailover.ref = self.finish(p, log)[1]
        return TorchFailover.ref

    def kill_at(self, p, log, step, who):
        """At worker 0's step `step`, SIGKILL the server ps_launch says it
        started as `who` ("server 0.0", "server 1"); returns its pid."""
        deadline = time.monotonic() + 120
        needle = re.compile(r"\[worker 0\].*step %d loss" % step)
        while not needle.search(self.text(log)):
            if p.poll() is not None or time.monotonic() > deadline:
                self.fail("no step %d of worker 0:\n%s" % (step, self.text(log)[-3000:]))
            time.sleep(0.05)
        m = re.findall(r"started %s \(pid (\d+)\)" % re.escape(who), self.text(log))
        self.assertTrue(m, "ps_launch named no %s" % who)
        pid = int(m[-1])
        os.kill(pid, signal.SIGKILL)
        return pid

    @need_launch
    def test_a_primary_killed_under_ps_torch_fails_over_bitwise(self):
        if not shutil.which("etcd"):
            self.skipTest("no etcd (install etcd-server: make deps)")
        ref = self.reference()
        p, log = self.launch("replicas", ["--replicas", "1", "--coord", "auto"])
        self.kill_at(p, log, KILL_AT, "server 0.0")
        t, got = self.finish(p, log)
        self.assertIn("is now the primary of group 0", t)
        self.assertEqual(got, ref, "the weights differ from the uninterrupted run's")

    @need_launch
    def test_a_server_restarted_from_its_checkpoint_under_ps_torch(self):
        ref = self.reference()
        ck = os.path.join(pstest.TMP, "failover-ck")
        p, log = self.launch("restart", ["--restart-servers", "1",
                                         "--server-arg", "--checkpoint-dir=%s" % ck,
                                         "--server-arg", "--checkpoint-every=1"])
        self.kill_at(p, log, KILL_AT, "server 1")
        t, got = self.finish(p, log)
        self.assertEqual(len(re.findall(r"started a new server 1 ", t)), 1, t[-3000:])
        self.assertIn("restored ", t)
        self.assertEqual(got, ref, "the weights differ from the uninterrupted run's")


if __name__ == "__main__":
    pstest.main()
