"""The hooks that tie a torch.nn.Module to libps's exchange (include/ps_exchange.h).

The exchange is the C machinery ps_worker trains with: per tensor a front
weight buffer (what forward reads), a back buffer that pulls fill, two
gradient buffers, and the rules of DESIGN.md "Overlap on the worker".  This
module only calls it at the right moments:

- a gradient hook per parameter (param.register_hook: called with the
  parameter's whole gradient the moment backward has made it, last layer
  first) copies the gradient into the exchange's gradient buffer and calls
  ps_exchange_grad_ready, which posts the push and the pull of the next
  version while backward goes on with the earlier layers;
- a forward pre-hook per module that owns parameters calls
  ps_exchange_before_use for them: sync waits for that layer's next version
  only (so early layers compute while later layers' pulls are in flight),
  async takes whatever has landed;
- after either call the parameter's .data is pointed at the exchange's
  current front buffer: a torch tensor over that memory, made once per
  buffer (no copy).  The swapped-out buffer is what the next pull fills.

On a GPU the exchange still works in host memory (its host backend) and the
parameters keep their GPU storage: gradients go to pinned host memory on a
side stream and are handed to the exchange once that copy is done (checked
in later hooks, and all at the end of backward); new weights are copied to
the GPU on the current stream, ordered after the kernels that read the old
ones and before those that read the new ones.  The exchange's memory is
page-locked with cudaHostRegister (see _Pinner): the shared-memory arena
once, whole, and other buffers by the pages not yet locked.
"""

import bisect
import ctypes
import mmap
import zlib

import torch

from .. import _lib
from ..client import Client, PSError
from .._lib import lib

_ECLOSED = _lib.ERRORS.index("ECLOSED")
_EMISMATCH = _lib.ERRORS.index("EMISMATCH")


def param_key(index, name, shape):
    """The key of parameter `index`: its position in the high half (so the
    servers' model fingerprint covers the order) and a CRC of its name and
    shape in the low half (so two workers whose models differ only in names
    or in the order of equal-shaped parameters are refused too)."""
    tag = "%s:%s" % (name, "x".join(str(d) for d in shape))
    return (index << 32) | zlib.crc32(tag.encode())


def _host_view(ptr, shape):
    """A float32 tensor over n floats of memory at ptr that the exchange owns."""
    n = 1
    for d in shape:
        n *= d
    arr = (ctypes.c_float * n).from_address(ptr)
    return torch.frombuffer(arr, dtype=torch.float32).view(shape)


# cudaErrorHostMemoryAlreadyRegistered: some of the pages were locked already
_CUDA_ALREADY_REGISTERED = 712


def _cudart_clear_error():
    """A function that clears the CUDA runtime's last error.

    A failed runtime call leaves its error behind as the thread's "last
    error" even when the caller handles it, and torch checks every kernel
    launch with cudaGetLastError: the next launch would raise an error that
    was not its own.  torch's cudart binding has no cudaGetLastError, so it
    is called in the libcudart this process already loaded (the one torch
    uses: the same file is the same library).  Where torch has the runtime
    linked in, a kernel launch consumes the error instead: its check raises
    it, and clears it first."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libcudart.so" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).cudaGetLastError
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = []
        return fn

    def by_launch():
        try:
            torch.zeros(1, device="cuda")
        except RuntimeError:
            pass
    return by_launch


class _Pinner:
    """Page-locks host memory for DMA copies to and from the GPU, page by page.

    cudaHostRegister locks whole pages, and a range that overlaps one already
    registered fails ("part or all of the requested memory range is already
    mapped").  The exchange's buffers are 64-byte aligned, so small ones share
    pages: registering each buffer failed from the second on.  So this
    registers page-aligned runs of pages not yet locked, each page once, and
    clears the runtime's error after any failure (see _cudart_clear_error).
    Best effort: a buffer left unpinned works, only its copies are slower.
    register(addr, bytes, flags) -> int and unregister(addr) are
    cudaHostRegister and cudaHostUnregister; clear() clears the last error."""

    def __init__(self, register, unregister, clear, page=mmap.PAGESIZE):
        self._register, self._unregister, self._clear = register, unregister, clear
        self.page = page
        self._runs = []        # sorted (first page, last page) locked, by us or found locked
        self.ranges = []       # (address, bytes) we registered, for unpin_all
        self.error = 0         # the first failure but "already registered": pinning stops

    def pin(self, ptr, nbytes):
        if self.error or nbytes <= 0:
            return
        cur, last = ptr // self.page, (ptr + nbytes - 1) // self.page
        gaps = []
        for a, b in self._runs:
            if a > last:
                break
            if b >= cur:
                if a > cur:
                    gaps.append((cur, a - 1))
                cur = b + 1
        if cur <= last:
            gaps.append((cur, last))
        for a, b in gaps:
            if not self.error:
                self._pin_run(a, b)

    def _pin_run(self, a, b):
        addr, size = a * self.page, (b - a + 1) * self.page
        rc = int(self._register(addr, size, 0))
        if rc == 0:
            self.ranges.append((addr, size))
        else:
            self._clear()
            if rc != _CUDA_ALREADY_REGISTERED:
                self.error = rc
                return
        bisect.insort(self._runs, (a, b))

    def unpin_all(self):
        for addr, _ in self.ranges:
            if int(self._unregister(addr)) != 0:
                self._clear()
        self.ranges = []
        self._runs = []


class Exchange:
    """A module's parameters trained through the servers (see ps.torch.wrap)."""

    def __init__(self, module, client=None, expect=None, init_from_rank0=True):
        if client is None:
            client = Client(expect=expect)
        elif expect:
            client.expect(**expect)
        if client.started or client._counts:
            raise ValueError("wrap a fresh client: the wrapper registers the model's parameters "
                             "and starts it (this one is %s)"
                             % ("started" if client.started else "already holding tensors"))
        self.client = client
        self.names, self.params = [], []
        for name, p in module.named_parameters():
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
        if not self.params:
            raise ValueError("the model has no parameters that require grad")
        self.cuda = any(p.device.type == "cuda" for p in self.params)
        n = len(self.params)
        self.steps = [0] * n          # pushes made, per parameter
        self._front = [0] * n         # the front buffer's address each param now uses
        self._views = {}              # buffer address -> tensor over it
        self._own = []                # the buffers we gave the exchange: alive till close
        self._x = self._b = None
        self._hooks = []
        if self.cuda:
            self._cuda_init()
        try:
            self._open(init_from_rank0)
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
        for i, (name, p) in enumerate(zip(self.names, self.params)):
            if not p.data.is_contiguous():
                p.data = p.data.contiguous()
            if p.device.type == "cuda":
                w = torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
                w.copy_(p.data)
                g = torch.zeros(p.shape, dtype=torch.float32, pin_memory=True)
            else:
                w, g = p.data, torch.zeros_like(p.data)
            self._own += [w, g]
            self._views[w.data_ptr()] = w
            self._views[g.data_ptr()] = g
            self._front[i] = w.data_ptr()
            key = param_key(i, name, tuple(p.shape))
            rc = lib.ps_exchange_add(x, key, p.numel(), w.data_ptr(), g.data_ptr(), i)
            if rc:
                raise PSError(rc, _lib.last_error(self.client._ptr), "parameter %r" % name)
        if init_from_rank0:
            lib.ps_exchange_set_init(x, 1 if self.client.rank == 0 else 0)
        rc = lib.ps_exchange_start(x)
        if rc:
            raise self._start_error(rc)
        self.client.started = True
        if self.cuda:
            # the exchange's buffers lie in the shared-memory arena when a
            # server is on this host: lock it once, whole
            base, size = ctypes.c_void_p(), ctypes.c_size_t()
            lib.ps_client_shm_region(self.client._ptr, ctypes.byref(base), ctypes.byref(size))
            if base.value and size.value:
                self._pinner.pin(base.value, size.value)
        for i in range(len(self.params)):
            self._take_front(i, force=True)

    def _start_error(self, rc):
        msg = _lib.last_error(self.client._ptr) or _lib.strerror(rc)
        if rc == _EMISMATCH and "model" in msg:
            shown = ", ".join("%s %s" % (nm, tuple(p.shape))
                              for nm, p in list(zip(self.names, self.params))[:4])
            msg += ("; the servers hold another model than this worker's: every worker must "
                    "wrap the same model, with the same parameter names, shapes and order "
                    "(model.named_parameters()); this one has %d: %s%s"
                    % (len(self.params), shown, ", ..." if len(self.params) > 4 else ""))
        return PSError(rc, msg, "start")

    def _attach(self, module):
        index = {id(p): i for i, p in enumerate(self.params)}
        for i, p in enumerate(self.params):
            self._hooks.append(p.register_hook(lambda g, i=i: self._on_grad(i, g)))
        # parameters no module's pre-hook reached in the first forward (used
        # by a parent, functionally) are handled by the root's pre-hook
        self._uncovered = list(range(len(self.params)))
        self._seen = set()
        self._first = True
        for mod in module.modules():
            own = [index[id(p)] for p in mod._parameters.values()
                   if p is not None and id(p) in index]
            if own:
                self._hooks.append(mod.register_forward_pre_hook(
                    lambda m, inp, own=own: self._before_use(own)))
        self._hooks.append(module.register_forward_pre_hook(lambda m, inp: self._root_pre()))
        self._hooks.append(module.register_forward_hook(lambda m, inp, out: self._root_post()))

    def _root_pre(self):
        if not self._first:
            self._before_use(self._uncovered)

    def _root_post(self):
        if self._first:
            self._first = False
            self._uncovered = [i for i in range(len(self.params)) if i not in self._seen]

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
            raise TypeError("parameter %r got a sparse gradient; ps.torch pushes dense ones"
                            % self.names[i])
        if self.cuda and grad.is_cuda:
            self._stage_grad(i, grad)
            return None
        self._view(lib.ps_exchange_grad(self._x, i), grad.shape).copy_(grad)
        self._grad_ready(i)
        return None

    def _grad_ready(self, i):
        self._check(lib.ps_exchange_grad_ready(self._x, i, self.steps[i]),
                    "push of %r at step %d" % (self.names[i], self.steps[i]))
        self.steps[i] += 1
        self._take_front(i)

    def _view(self, ptr, shape):
        t = self._views.get(ptr)
        if t is None:
            t = _host_view(ptr, tuple(shape))
            self._views[ptr] = t
            if self.cuda:
                self._pinner.pin(ptr, t.numel() * 4)
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
            self._upload(i, host)
        else:
            p.data = host

    # ---- CUDA staging ----

    def _cuda_init(self):
        self._stream = torch.cuda.Stream()
        self._staged = []                      # (param index, event): copies in flight
        self._uploaded = [None] * len(self.params)
        self._callback = False
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
        if not self._callback:
            self._callback = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
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

    def _end_of_backward(self):
        self._callback = False
        self._drain(block=True)

    def _upload(self, i, host):
        p = self.params[i]
        # the current stream: after the kernels that read the old weights,
        # before those that read these
        p.data.copy_(host, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._uploaded[i] = ev

    # ---- end ----

    def finish(self):
        """Wait for every request in flight and take what landed."""
        if self.cuda:
            self._drain(block=True)
        self._check(lib.ps_exchange_finish(self._x), "finish")
        for i in range(len(self.params)):
            self._take_front(i)

    def pull_final(self):
        """After the last step, on every worker: wait at a barrier for all of
        them, then pull the servers' final weights into the parameters."""
        self.finish()
        self._check(lib.ps_exchange_pull_final(self._x), "final pull")
        for i in range(len(self.params)):
            self._take_front(i, force=True)

    def take_wait_ns(self):
        """Time the training thread was blocked on the servers since the
        last call (the comm-wait figure), in ns."""
        return lib.ps_exchange_take_wait_ns(self._x)

    def _close_c(self, client_ptr):
        """The client's closer: give the parameters memory of their own, then
        close the exchange (which closes the C client)."""
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
            if p.device.type == "cpu":
                p.data = p.data.clone()
        if self.cuda:  # before the exchange frees that memory
            self._pinner.unpin_all()
        lib.ps_exchange_close(x)
        lib.ps_backend_host_destroy(self._b)
        self._views.clear()
        self._own = []

    def close(self):
        self.client.close()

    @property
    def closed(self):
        return self._x is None
