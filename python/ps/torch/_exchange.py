"""The hooks that tie torch parameters to libps's exchange (include/ps_exchange.h).

The exchange is the C machinery ps_worker trains with: per tensor a front
weight buffer (what forward reads), a back buffer that pulls fill, two
gradient buffers, and the rules of DESIGN.md "Overlap on the worker".  This
module only calls it at the right moments:

- step() (push_rest) writes each parameter's .grad into the exchange's
  gradient buffer and calls ps_exchange_grad_ready, which posts the push
  and the pull of the next version, first layer first: what .grad holds
  then (several backward passes summed, clipped) is what the servers get.
  With push_mode "backward" (grad_edits=False, and wrap()) a gradient hook
  per parameter (param.register_hook: called with the parameter's gradient
  of this backward the moment autograd has made it, last layer first)
  pushes instead: the gradient the optimizer would see (.grad plus this one)
  while backward goes on with the earlier layers; a backward beyond the
  declared ones is refused there, before it pushes.  The hooks also count
  backward passes (synchronize() after step() then has nothing new);
- a forward pre-hook per module that owns parameters calls
  ps_exchange_before_use for them: sync waits for that layer's next version
  only (so early layers compute while later layers' pulls are in flight),
  async takes whatever has landed;
- after either call the parameter's .data is pointed at the exchange's
  current front buffer: a torch tensor over that memory (no copy).  The
  swapped-out buffer is what the next pull fills.

Where the update runs (`update`): "server" (the servers' optimizer: the
weights come from them), "worker-sync" (the servers average the round's
gradients; the front holds that mean, which step() copies into .grad for the
user's optimizer; the parameters keep memory of their own) and
"worker-async" (the servers add the weight deltas workers push; the weights
come from them, and step() pushes what the user's optimizer changed).

Memory: every buffer a parameter's .data may point at is this module's own
torch memory (the exchange's back buffers are handed in:
ps_exchange_set_back), or, with a server on this host, the shared-memory
arena, mapped here a second time through its memfd (_Arena).  So tensors
the user holds (a state_dict) stay valid after close() frees the exchange.

On a GPU the exchange still works in host memory (its host backend) and the
parameters keep their GPU storage: gradients go to pinned host memory on a
side stream and are handed to the exchange once that copy is done (checked
in later hooks, and all at the end of backward); new weights are copied to
the GPU on the current stream, ordered after the kernels that read the old
ones and before those that read the new ones.  The exchange's memory is
page-locked with cudaHostRegister (see _pinning._Pinner).
"""

import ctypes
import mmap
import os
import sys
import time
import zlib

import torch

from .. import _lib
from ..client import Client, PSError
from .._lib import lib
from . import _context
from ._pinning import _Pinner, _cudart_clear_error

_ECLOSED = _lib.ERRORS.index("ECLOSED")
_EMISMATCH = _lib.ERRORS.index("EMISMATCH")

# the wrapper's barrier ids (2^61 and up: ps.Client.barrier)
_JOIN_BARRIER = (1 << 61) + 1


def param_key(index, name, shape):
    """The key of parameter `index`: its position in the high half (so the
    servers' model fingerprint covers the order) and a CRC of its name and
    shape in the low half (so two workers whose models differ only in names
    or in the order of equal-shaped parameters are refused too)."""
    tag = "%s:%s" % (name, "x".join(str(d) for d in shape))
    return (index << 32) | zlib.crc32(tag.encode())


def _host_view(ptr, shape):
    """A float32 tensor over memory at ptr that C owns (the arena when it
    cannot be mapped here): valid until close."""
    n = 1
    for d in shape:
        n *= d
    arr = (ctypes.c_float * n).from_address(ptr)
    return torch.frombuffer(arr, dtype=torch.float32).view(shape)


class _Arena:
    """The client's shared-memory arena mapped a second time, here: views
    over this mapping keep it alive (torch holds the mmap object) after the
    exchange unmapped its own and closed the arena.  Both mappings are the
    same pages, so what the servers write is seen here.  The arena is a
    memfd that libps keeps open (common/ps_shm.h): it is found among this
    process's file descriptors by the inode of the mapping; an arena in
    /dev/shm (an older libps) by its path."""

    def __init__(self, base, size):
        self.map = None
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= base < hi and len(parts) >= 6:
                    self.lo, self.hi = lo, hi
                    offset, inode, path = int(parts[2], 16), int(parts[4]), parts[5]
                    break
            else:
                raise OSError("the arena at %#x is no file mapping" % base)
        fd = -1
        if path.startswith("/dev/shm/"):
            fd = os.open(path, os.O_RDWR)
        else:
            for name in os.listdir("/proc/self/fd"):
                try:
                    if os.stat("/proc/self/fd/" + name).st_ino == inode and \
                            "memfd:" in os.readlink("/proc/self/fd/" + name):
                        fd = os.open("/proc/self/fd/" + name, os.O_RDWR)
                        break
                except OSError:
                    continue
            if fd < 0:
                raise OSError("no open file of this process is the arena at %#x (%s)"
                              % (base, path))
        try:
            self.map = mmap.mmap(fd, self.hi - self.lo, offset=offset)
        finally:
            os.close(fd)
        self.size = size

    def holds(self, ptr, nbytes):
        return self.lo <= ptr and ptr + nbytes <= self.hi

    def view(self, ptr, shape):
        n = 1
        for d in shape:
            n *= d
        return torch.frombuffer(self.map, dtype=torch.float32, count=n,
                                offset=ptr - self.lo).view(shape)


class _Hook:
    """A hook that deepcopy and pickle drop: a copy of a wrapped module (or
    a saved one) is a plain module, and the copy's forward must not drive
    the original's exchange."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    def __deepcopy__(self, memo):
        return _noop

    def __reduce__(self):
        return (_noop_factory, ())


def _noop(*args):
    del args


def _noop_factory():
    return _noop


class Exchange:
    """Parameters trained through the servers (see ps.torch.wrap and
    ps.torch.DistributedOptimizer)."""

    def __init__(self, named_params, client=None, expect=None, module=None, init_from_rank0=True,
                 update="server", wait_timeout=600.0, wire_dtype=None, tables=()):
        if client is None:
            client = Client(expect=expect)
        elif expect:
            client.expect(**expect)
        if client.started or client._counts:
            raise ValueError("wrap a fresh client: the wrapper registers the model's parameters "
                             "and starts it (this one is %s)"
                             % ("started" if client.started else "already holding tensors"))
        if update not in ("server", "worker-sync", "worker-async", "auto"):
            raise ValueError("update must be server, worker-sync, worker-async or auto")
        self.client = client
        # auto: as the servers run (average: worker-sync, add: worker-async,
        # else server), known once they said hello
        self.update = update
        self.weights_from_servers = update != "worker-sync"
        self.names, self.params = [], []
        for name, p in named_params:
            if not p.requires_grad:
                continue
            if p.dtype != torch.float32:
                raise TypeError("parameter %r is %s; the servers train float32: call "
                                "model.float() before wrapping"
                                % (name, str(p.dtype).replace("torch.", "")))
            if p.device.type not in ("cpu", "cuda"):
                raise TypeError("parameter %r is on %s; ps.torch trains CPU and CUDA tensors"
                                % (name, p.device))
            if p.is_sparse:
                raise TypeError("parameter %r is sparse; ps.torch trains dense tensors" % name)
            self.names.append(name)
            self.params.append(p)
        self.tables = list(tables)    # ps.torch._tables._Table: rows on the servers
        self.samples_per_step = 0     # counted by every end_step (metrics)
        if not self.params and not self.tables:
            raise ValueError("the model has no parameters that require grad")
        self.cuda = any(p.device.type == "cuda" for p in self.params)
        n = len(self.params)
        self.keys = [param_key(i, nm, tuple(p.shape))
                     for i, (nm, p) in enumerate(zip(self.names, self.params))]
        self.steps = [0] * n          # the step of each parameter's next push
        self.pushed = [False] * n     # pushed since the last step() (or backward, by hooks)
        self.passes = [0] * n         # backward passes seen since the last push
        self._front = [0] * n         # the front buffer's address each param now uses
        self._views = {}              # buffer address -> tensor over it
        self._own = []                # the buffers we gave the exchange
        self._arena = None
        self._x = self._b = None
        self._hooks = []
        # what the optimizer sets (ps.torch.DistributedOptimizer)
        self.push_mode = "backward"   # backward (hooks push) | step (step() pushes)
        self.passes_per_step = 1
        self.no_sync_depth = 0
        self.on_step_start = None     # called before the first push or forward of a step
        self.auto_step = False        # every backward is a step (wrap without step())
        self._in_step = False         # begin_step ran for the step under way
        self._told_writes = False
        self._gver = [None] * n       # .grad (id, version) at the end of the last backward
        self.backwards = 0            # backward passes that reached a parameter, ever
        self._zver = [None] * n       # .grad (id, version) as zero_grad left it: all zeros
        self._wver = [p._version for p in self.params]  # weights as we last left them
        self._end_queued = False
        self.left = False             # out of the servers' rounds: pull_final, join, close
        self.wait_timeout = wait_timeout
        if self.cuda:
            self._cuda_init()
        try:
            if wire_dtype is not None:
                rc = lib.ps_client_set_wire_dtype(client._ptr, wire_dtype)
                if rc:
                    raise PSError(rc, "", "wire dtype")
            self._open(init_from_rank0)
            if self.update == "auto":
                self._decide(self.client.hyper()["optimizer"])
            self._resume()
        except BaseException:
            client.close()  # it cannot start again: say hello with a fresh one
            raise
        self._attach(module)

    # ---- set-up ----

    def _open(self, init_from_rank0):
        b, x = ctypes.c_void_p(), ctypes.c_void_p()
        rc = lib.ps_backend_host_create(ctypes.byref(b))
        if rc:
            raise PSError(rc, "", "host backend")
        self._b = b
        rc = lib.ps_exchange_adopt(self.client._ptr, ctypes.byref(self.client.options), b,
                                   ctypes.byref(x))
        if rc:
            lib.ps_backend_host_destroy(b)
            raise PSError(rc, "", "exchange")
        self._x = x
        # from now on closing the client closes the exchange (and, first,
        # gives the parameters their own memory back)
        self.client._handle.closer = self._close_c
        self.client._handle.interrupter = lambda ptr, x=x: lib.ps_exchange_interrupt(x)
        self.client._handle.before_close = self._depart  # closing (or exit) leaves first
        lib.ps_exchange_set_wait_timeout(x, int(self.wait_timeout * 1000) if self.wait_timeout
                                         else 0)
        for i, (name, p) in enumerate(zip(self.names, self.params)):
            if not p.data.is_contiguous():
                p.data = p.data.contiguous()
            pin = p.device.type == "cuda"
            if pin:
                w = torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
                w.copy_(p.data)
            elif self.weights_from_servers:
                w = p.data
            else:  # the parameters keep their own memory; the front holds means
                w = p.data.clone()
            back = torch.empty(p.shape, dtype=torch.float32, pin_memory=pin)
            g = torch.zeros(p.shape, dtype=torch.float32, pin_memory=pin)
            self._own += [w, back, g]
            for t in (w, back, g):
                self._views[t.data_ptr()] = t
            self._front[i] = w.data_ptr()
            rc = lib.ps_exchange_add(x, self.keys[i], p.numel(), w.data_ptr(), g.data_ptr(), i)
            if rc == 0:
                rc = lib.ps_exchange_set_back(x, i, back.data_ptr())
            if rc:
                raise PSError(rc, _lib.last_error(self.client._ptr), "parameter %r" % name)
            self.client._counts[self.keys[i]] = p.numel()  # for the client's own requests
        for k, t in enumerate(self.tables):
            t.add(self, k)
        if init_from_rank0:
            lib.ps_exchange_set_init(x, 1 if self.client.rank == 0 else 0)
        rc = lib.ps_exchange_start(x)
        if rc:
            raise self._start_error(rc)
        self.client.started = True
        base, size = ctypes.c_void_p(), ctypes.c_size_t()
        lib.ps_client_shm_region(self.client._ptr, ctypes.byref(base), ctypes.byref(size))
        if base.value and size.value:
            try:
                self._arena = _Arena(base.value, size.value)
            except OSError:  # views over C's mapping then: valid until close only
                self._arena = None
            if self.cuda:  # lock the arena once, whole
                self._pinner.pin(base.value, size.value)

    def _start_error(self, rc):
        msg = _lib.last_error(self.client._ptr) or _lib.strerror(rc)
        if rc == _EMISMATCH and "was refused at hello" in msg:
            msg += ("; this worker and the servers agree, the one named does not: fix it (every "
                    "worker wraps the same model and settings) and start it again")
        elif rc == _EMISMATCH and "model" in msg:
            shown = ", ".join("%s %s" % (nm, tuple(p.shape))
                              for nm, p in list(zip(self.names, self.params))[:4])
            msg += ("; the servers hold another model than this worker's: every worker must "
                    "wrap the same model, with the same parameter names, shapes and order "
                    "(model.named_parameters()); this one has %d: %s%s"
                    % (len(self.params), shown, ", ..." if len(self.params) > 4 else ""))
        return PSError(rc, msg, "start")

    def _decide(self, kind):
        """update='auto': the servers run `kind`."""
        self.update = {"average": "worker-sync", "add": "worker-async"}.get(kind, "server")
        if self.update == "worker-sync":
            # the parameters keep memory of their own; the front holds means
            self.weights_from_servers = False
            for p in self.params:
                if p.device.type == "cpu":
                    p.data = p.data.clone()

    def _resume(self):
        """Go on from the servers' clock (a worker restarted against servers
        that ran on, or were restored, pushes nothing they take for a
        duplicate), with the servers' weights."""
        reqs = [self.client.clock(k) for k in self.keys]
        treqs = [self.client.clock(t.key) for t in self.tables]
        self.steps = [r.wait() for r in reqs]
        tsteps = [r.wait() for r in treqs]
        for i in range(len(self.params)):
            if self.weights_from_servers:
                self._take_front(i, force=True)
            elif self.steps[i] == 0:
                # worker-sync: the servers hold rank 0's first weights until
                # the first round makes them a mean gradient
                self._copy_in(self.params[i].data, i)
        self._wver = [p._version for p in self.params]
        # each table's own clock on the servers (the smallest over its
        # partitions): the same as the tensors' but after a crash between
        # two pushes, and the only one a model of tables alone has
        for t, step in zip(self.tables, tsteps):
            t.step = step

    def _attach(self, module):
        for i, p in enumerate(self.params):
            self._hooks.append(p.register_hook(_Hook(lambda g, i=i: self._on_grad(i, g))))
        self.module = module
        if module is None:
            return
        index = {id(p): i for i, p in enumerate(self.params)}
        # parameters no module's pre-hook reached in the first forward (used
        # by a parent, functionally) are handled by the root's pre-hook
        self._uncovered = list(range(len(self.params)))
        self._seen = set()
        self._first = True
        if self.weights_from_servers:
            for mod in module.modules():
                own = [index[id(p)] for p in mod._parameters.values()
                       if p is not None and id(p) in index]
                if own:
                    self._hooks.append(mod.register_forward_pre_hook(
                        _Hook(lambda m, inp, own=own: self._before_use(own))))
        self._hooks.append(module.register_forward_pre_hook(_Hook(lambda m, inp:
                                                                  self._root_pre())))
        self._hooks.append(module.register_forward_hook(_Hook(lambda m, inp, out:
                                                              self._root_post())))

    def _root_pre(self):
        if self._x is None:
            raise PSError(_ECLOSED, "the exchange is closed", "forward")
        if torch.is_grad_enabled():
            self.begin_step()
        if self.weights_from_servers and not self._first:
            self._before_use(self._uncovered)

    def _root_post(self):
        if self._first:
            self._first = False
            self._uncovered = [i for i in range(len(self.params)) if i not in self._seen]

    def begin_step(self):
        """Once per step, before its first forward (with grad) or push:
        weights written in place since the last step go to the servers from
        rank 0 (check_writes), then the optimizer's checks
        (hyper-parameters that changed)."""
        if not self._in_step:
            self._in_step = True
            if self.weights_from_servers:
                self.check_writes()
            if self.on_step_start is not None:
                self.on_step_start()

    def check_writes(self):
        """Weights written in place after wrapping (load_state_dict,
        nn.init): rank 0's go to the servers (after the requests in flight),
        so every worker goes on from them; another worker's are replaced by
        the servers' at its next pull (said once)."""
        written = self.writes_since()
        if written and self.client.rank == 0:
            self.assign(written)
        elif written and not self._told_writes:
            self._told_writes = True
            sys.stderr.write("ps.torch[%d]: weights written in place after wrapping "
                             "(load_state_dict?) are replaced by the servers' from the next "
                             "step: rank 0's writes are what the servers take\n"
                             % self.client.rank)
        self.note_weights()

    # ---- the hooks ----

    def _check(self, rc, what):
        if rc:
            raise PSError(rc, _lib.last_error(self.client._ptr) if rc != _ECLOSED else "",
                          what + " (the reason is in libps's log line above)")

    def _before_use(self, idx):
        x = self._x
        if x is None:
            raise PSError(_ECLOSED, "the exchange is closed", "forward")
        for i in idx:
            self._seen.add(i)
            self._check(lib.ps_exchange_before_use(x, i), "before use of %r" % self.names[i])
            self._take_front(i)

    def _on_grad(self, i, grad):
        if self._x is None:
            return None
        if grad.is_sparse:
            from ._tables import WAY_OUT
            raise TypeError("parameter %r got a sparse gradient; ps.torch pushes dense ones: %s"
                            % (self.names[i], WAY_OUT))
        if not self._end_queued:  # once per backward: note .grad after it
            self._end_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        if self.update == "worker-async" or self.push_mode != "backward" or self.no_sync_depth:
            return None
        if self.pushed[i]:
            # another backward after this step's gradient had left: the
            # servers applied (or averaged) the earlier one alone
            raise RuntimeError(
                "parameter %r got a gradient from another backward() before step(), but its "
                "gradient of this step had already gone to the servers (grad_edits=False pushes "
                "during backward), which take it alone: for gradient accumulation say "
                "backward_passes_per_step=k, or put the backward passes that only accumulate "
                "in `with optimizer.no_sync():`, or leave grad_edits at its default (gradients "
                "go at step())" % self.names[i])
        self.passes[i] += 1
        if self.passes[i] < self.passes_per_step:
            return None
        self.begin_step()
        # what the optimizer would see: .grad after this backward adds to it
        # (wrap()'s loops have no zero_grad: each backward's own gradient; a
        # .grad that zero_grad left as it was adds nothing: a copy is cheaper)
        acc = None if self.auto_step else self.params[i].grad
        if acc is not None and (id(acc), acc._version) == self._zver[i]:
            acc = None
        if self.cuda and grad.is_cuda:
            self._push(i, grad if acc is None else acc + grad)
        else:
            self._push(i, grad, acc)
        return None

    def _push(self, i, grad, acc=None):
        """Push grad (+ acc, when given, on the CPU) as parameter i's
        gradient of its next step."""
        self.passes[i] = 0
        self.pushed[i] = True
        if self.cuda and grad.is_cuda:
            self._stage_grad(i, grad)
            return
        dst = self._view(lib.ps_exchange_grad(self._x, i), grad.shape)
        if acc is None:
            dst.copy_(grad)
        else:
            torch.add(acc, grad, out=dst)
        self._grad_ready(i)

    def _grad_ready(self, i):
        self._check(lib.ps_exchange_grad_ready(self._x, i, self.steps[i]),
                    "push of %r at step %d" % (self.names[i], self.steps[i]))
        self.steps[i] += 1
        if self.weights_from_servers:
            self._take_front(i)

    def _view(self, ptr, shape):
        t = self._views.get(ptr)
        if t is None:
            nbytes = 4
            for d in shape:
                nbytes *= d
            if self._arena is not None and self._arena.holds(ptr, nbytes):
                t = self._arena.view(ptr, tuple(shape))
            else:
                t = _host_view(ptr, tuple(shape))
            self._views[ptr] = t
            if self.cuda:
                self._pinner.pin(ptr, nbytes)
        return t

    def _take_front(self, i, force=False):
        """Point parameter i at the exchange's front buffer if it moved."""
        ptr = lib.ps_exchange_weights(self._x, i)
        if ptr == self._front[i] and not force:
            return
        self._front[i] = ptr
        p = self.params[i]
        host = self._view(ptr, p.shape)
        if p.device.type == "cuda":
            self._upload(i, host, p.data)
        else:
            p.data = host

    def _copy_in(self, dst, i):
        """The front of parameter i (weights, or a mean gradient) into dst."""
        host = self._view(lib.ps_exchange_weights(self._x, i), dst.shape)
        if dst.is_cuda:
            self._upload(i, host, dst)
        else:
            dst.copy_(host)

    def _end_of_backward(self):
        self._end_queued = False
        self.backwards += 1
        if self.cuda:
            self._drain(block=True)
        self.note_grads()
        if self.auto_step:
            self.end_step()

    def note_grads(self):
        """.grad as it is now is what the pushes so far saw: an edit from
        here on is one (edited_after_backward)."""
        self._gver = [None if p.grad is None else (id(p.grad), p.grad._version)
                      for p in self.params]

    # ---- steps (what DistributedOptimizer.step calls) ----

    def edited_after_backward(self):
        """Parameters whose .grad changed since the end of the last backward
        (clip_grad_norm_, GradScaler.unscale_, p.grad = ...): their version
        counters moved.  (Writes through .grad.data are not seen.)"""
        out = []
        for i, p in enumerate(self.params):
            seen = self._gver[i]
            now = None if p.grad is None else (id(p.grad), p.grad._version)
            if seen is not None and now != seen:
                out.append(i)
        return out

    def push_rest(self):
        """Push, as this step's gradient, the .grad of every parameter that
        was not pushed in backward (zeros for one without a gradient, as
        Horovod does: sync rounds need every worker's push)."""
        for i, p in enumerate(self.params):
            if self.pushed[i]:
                continue
            g = p.grad
            if g is None:
                g = torch.zeros_like(p)
            self._push(i, g)
        if self.cuda:
            self._drain(block=True)

    def note_zeroed(self):
        """zero_grad just ran: .grad as it is now holds zeros."""
        self._zver = [None if p.grad is None else (id(p.grad), p.grad._version)
                      for p in self.params]

    def end_step(self):
        for t in self.tables:
            t.push()
        lib.ps_exchange_step_done(self._x, self.samples_per_step)
        self.pushed = [False] * len(self.params)
        self.passes = [0] * len(self.params)
        self._in_step = False

    def means_into_grads(self):
        """worker-sync: wait for each parameter's mean gradient of the round
        and put it in .grad."""
        for i, p in enumerate(self.params):
            self._check(lib.ps_exchange_before_use(self._x, i), "mean of %r" % self.names[i])
            if p.grad is None:
                p.grad = torch.empty_like(p)
            self._copy_in(p.grad, i)

    def stage_deltas(self):
        """worker-async, before the optimizer steps: the weights as they are
        (on the GPU a copy; else into the gradient buffers, where the deltas
        will be)."""
        if self.cuda:
            return [p.detach().clone() for p in self.params]
        for i, p in enumerate(self.params):
            self._view(lib.ps_exchange_grad(self._x, i), p.shape).copy_(p.detach())
        return None

    def push_deltas(self, before):
        """worker-async, after the optimizer stepped: push what it changed
        (the new weights less those saved by stage_deltas)."""
        for i, p in enumerate(self.params):
            if before is not None:
                self._push(i, p.detach() - before[i])
                continue
            buf = self._view(lib.ps_exchange_grad(self._x, i), p.shape)
            torch.sub(p.detach(), buf, out=buf)
            self.passes[i] = 0
            self.pushed[i] = True
            self._grad_ready(i)
        if self.cuda:
            self._drain(block=True)

    def take_weights(self):
        """Without module hooks: the weights the last push leads to, for the
        next forward (sync: waited for; async: if they landed)."""
        for i in range(len(self.params)):
            self._check(lib.ps_exchange_before_use(self._x, i), "before use of %r" % self.names[i])
            self._take_front(i)

    def writes_since(self):
        """Parameters whose weights were written in place since we last left
        them (load_state_dict, nn.init, an optimizer stepping them)."""
        return [i for i, p in enumerate(self.params) if p._version != self._wver[i]]

    def note_weights(self):
        self._wver = [p._version for p in self.params]

    def assign(self, idx):
        """Write parameters idx's weights to the servers (rank 0's loaded
        weights), after the requests in flight."""
        self.finish()
        reqs = []
        for i in idx:
            p = self.params[i]
            src = p.detach().cpu().contiguous() if p.is_cuda else p.detach()
            reqs.append(self.client.assign(self.keys[i], src))
        for r in reqs:
            r.wait()

    # ---- CUDA staging ----

    def _cuda_init(self):
        self._stream = torch.cuda.Stream()
        self._staged = []                      # (param index, event): copies in flight
        self._uploaded = [None] * len(self.params)
        try:
            rt = torch.cuda.cudart()
            self._pinner = _Pinner(rt.cudaHostRegister, rt.cudaHostUnregister,
                                   _cudart_clear_error())
        except (AttributeError, RuntimeError):  # no binding: nothing is pinned
            self._pinner = _Pinner(None, None, None)
            self._pinner.error = -1

    def _stage_grad(self, i, grad):
        dst = self._view(lib.ps_exchange_grad(self._x, i), grad.shape)
        ready = torch.cuda.Event()
        ready.record()  # after the kernels that made grad, on the current stream
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(ready)
            dst.copy_(grad, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        grad.record_stream(self._stream)
        self._staged.append((i, done))
        self._drain(block=False)

    def _drain(self, block):
        """Hand staged gradients whose copy is done to the exchange, in order."""
        while self._staged:
            i, ev = self._staged[0]
            if not block and not ev.query():
                return
            ev.synchronize()
            self._staged.pop(0)
            # the pull posted now may land in the buffer an upload reads
            if self._uploaded[i] is not None:
                self._uploaded[i].synchronize()
            self._grad_ready(i)

    def _upload(self, i, host, dst):
        # the current stream: after the kernels that read the old values,
        # before those that read these
        dst.copy_(host, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._uploaded[i] = ev

    # ---- end ----

    def finish(self):
        """Wait for every request in flight and take what landed."""
        if self.cuda:
            self._drain(block=True)
        self._check(lib.ps_exchange_finish(self._x), "finish")
        if self.weights_from_servers:
            for i in range(len(self.params)):
                self._take_front(i)

    def pull_final(self, what="pull_final"):
        """After the last step, on every worker, whatever its step count
        (join: DDP's Join, hvd.join()): this worker leaves the servers' live
        sets (sync rounds and barriers go on without it: a worker with more
        steps finishes them), waits until every worker has done the same,
        then takes the servers' final weights (where they hold them) and the
        workers' mean of the model's floating buffers (a collective).
        Once: a second call does nothing."""
        if self.left:
            return
        self.finish()
        self.client.leave()
        self.left = True
        self._wait_barrier(_JOIN_BARRIER, what)
        self._check(lib.ps_exchange_pull_final(self._x), "final pull")
        if self.weights_from_servers:
            for i in range(len(self.params)):
                self._take_front(i, force=True)
            self.note_weights()
        if self.module is not None:
            _context.average_buffers(self.module, self.client)

    def join(self):
        """Uneven step counts: this worker is done (pull_final)."""
        self.pull_final("join")

    def _depart(self):
        """Closing without pull_final: after an error (one being handled,
        or the uncaught one the process ends with) leave the live sets at
        once, so the others' rounds go on and this process ends now;
        otherwise pull_final, as DDP's Join does for a worker out of data."""
        if self.left or self._x is None or not self.client.started:
            return
        failing = sys.exc_info()[0] is not None or getattr(sys, "last_value", None) is not None
        if failing:
            self.left = True
            try:
                self.client.leave(timeout=1.0)  # a server may be what failed
                sys.stderr.write("ps.torch[%d]: left the servers' rounds after an error: the "
                                 "other workers go on without this one\n" % self.client.rank)
            except (PSError, OSError) as e:  # Ctrl-C closed the client's requests
                sys.stderr.write("ps.torch[%d]: ending after an error without leaving the "
                                 "servers' rounds (%s)\n" % (self.client.rank, e))
            return
        try:
            self.pull_final("close")
        except (PSError, RuntimeError, OSError) as e:
            sys.stderr.write("ps.torch[%d]: closing without the final weights: %s\n"
                             % (self.client.rank, e))

    def _wait_barrier(self, bid, what):
        """Barrier bid: say whom it waits for after 5 s and then every 10 s,
        give up after the wait timeout (as the exchange's start and final
        barriers do)."""
        r = self.client.barrier_post(bid)
        t0 = time.monotonic()
        note = t0 + 5.0
        while not r.wait_for(0.2):
            now = time.monotonic()
            if self.wait_timeout and now - t0 > self.wait_timeout:
                raise PSError(_lib.ERRORS.index("ETIMEDOUT"), "gave up after %.0f s (the wait "
                              "timeout) waiting for worker(s) %s to end too (pull_final(), "
                              "join(), close() or the end of its script)"
                              % (self.wait_timeout, self._missing()), "%s barrier" % what)
            if now >= note:
                sys.stderr.write("ps.torch[%d]: done (%s); waiting for worker(s) %s to end too "
                                 "(pull_final(), join(), close() or the end of its script)\n"
                                 % (self.client.rank, what, self._missing()))
                note = now + 10.0

    def _missing(self):
        try:
            _, who = self.client.barrier_info()
        except PSError:
            return "(server 0 did not say)"
        return ", ".join(str(r) for r in who) or "(none: it completes)"

    def take_wait_ns(self):
        """Time the training thread was blocked on the servers since the
        last call (the comm-wait figure), in ns."""
        return lib.ps_exchange_take_wait_ns(self._x)

    def _close_c(self, client_ptr):
        """The client's closer (after _depart): give the parameters memory of
        their own, then close the exchange (which closes the C client)."""
        del client_ptr  # the exchange owns it
        x, self._x = self._x, None
        if x is None:
            return
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.cuda:
            torch.cuda.synchronize()
        for p in self.params:
            if p.device.type == "cpu" and self.weights_from_servers:
                p.data = p.data.clone()
        if self.cuda:  # before the exchange frees that memory
            self._pinner.unpin_all()
        lib.ps_exchange_close(x)
        lib.ps_backend_host_destroy(self._b)
        # views over the arena keep their own mapping; the others are ours
        self._views.clear()
        self._own = []
        self._arena = None

    def close(self):
        self.client.close()

    @property
    def closed(self):
        return self._x is None
