"""Helpers of the Python tests: live bin/ps_server processes, a scratch
directory, and a runner that prints one PASS/FAIL/SKIP line per case (as
the C tests do, for tests/run.sh to count).

Cases are the methods named test_* of unittest.TestCase classes; a case
named test_sync_pull_waits prints "PASS sync_pull_waits (0.4s)".  Every
server a case starts is stopped when the case ends, pass or fail.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
BIN = os.path.abspath(os.path.join(ROOT, os.environ.get("PS_BIN_DIR", "bin")))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
PYTHON = "/usr/bin/python3"
TMP = tempfile.mkdtemp(prefix="ps_pytest.")
_procs = []


class Server:
    """A bin/ps_server on a free 127.0.0.1 port; .endpoint once listening."""

    def __init__(self, *args, rank=0, num_servers=1):
        self.log = os.path.join(TMP, "server-%d-%d.log" % (os.getpid(), len(_procs)))
        argv = [os.path.join(BIN, "ps_server"), "--bind", "tcp://127.0.0.1:*", "--rank",
                str(rank), "--num-servers", str(num_servers), "--threads", "1"] + list(args)
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        _procs.append(self.proc)
        self.endpoint = None
        deadline = time.time() + 10
        while time.time() < deadline:
            m = re.search(r"listening on (\S+)", open(self.log).read())
            if m:
                self.endpoint = m.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("ps_server did not start: " + open(self.log).read()[-2000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def servers(n, *args):
    """n servers of one group; returns (list, "ep0,ep1,...")."""
    ss = [Server(*args, rank=r, num_servers=n) for r in range(n)]
    return ss, ",".join(s.endpoint for s in ss)


def stop_all():
    for p in _procs:
        if p.poll() is None:
            p.terminate()
    for p in _procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
    del _procs[:]


class Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.t0 = 0.0

    @staticmethod
    def _name(test):
        return test._testMethodName[len("test_"):]

    def startTest(self, test):
        super().startTest(test)
        self.t0 = time.time()

    def stopTest(self, test):
        super().stopTest(test)
        stop_all()

    def addSuccess(self, test):
        print("PASS %s (%.1fs)" % (self._name(test), time.time() - self.t0), flush=True)

    def _fail(self, test, err):
        tb = "".join(traceback.format_exception(*err))
        sys.stderr.write("---- %s\n%s" % (self._name(test), tb))
        last = str(err[1]).strip().splitlines()
        print("FAIL %s: %s" % (self._name(test), last[-1] if last else err[0].__name__),
              flush=True)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._fail(test, err)

    def addError(self, test, err):
        super().addError(test, err)
        self._fail(test, err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        print("SKIP %s: skipped: %s" % (self._name(test), reason), flush=True)


def main():
    """Run the calling module's cases (or those named in argv)."""
    mod = sys.modules["__main__"]
    loader = unittest.TestLoader()
    loader.sortTestMethodsUsing = None  # definition order
    suite = loader.loadTestsFromModule(mod)
    names = sys.argv[1:]
    if names:
        suite = unittest.TestSuite(t for group in suite for t in group
                                   if t._testMethodName[len("test_"):] in names)
    result = Result()
    try:
        suite.run(result)
    finally:
        stop_all()
        if not os.environ.get("PS_TEST_KEEP"):
            shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(0 if result.wasSuccessful() else 1)
