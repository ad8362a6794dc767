"""ps.Client: the worker side of the parameter server, over libps.so.

The same concepts as include/ps_client.h: open a client (servers, rank,
worker count, mode), register every tensor (a key and a float32 count) and
every embedding table (register_table) in the same order on every worker,
start (hello with every server), then post non-blocking
init/push/pull/pushpull requests, and sparse_pull/sparse_push/
sparse_pushpull of a table's rows, and wait on them.

Buffers are never copied: a push sends the caller's memory in place and a
pull writes the servers' weights straight into the caller's array, so the
array must stay alive and unchanged (push) or unread (pull) until the
request completes.  The Request keeps a reference to it until then, and the
Client keeps every pending Request, so dropping one early is safe.
"""

import ctypes
import os
import time
import weakref

from . import _lib, _signals
from ._buffers import float_buffer
from ._lib import lib

SYNC, ASYNC = _lib.MODE_SYNC, _lib.MODE_ASYNC

# where a setting not given comes from: the same variables, in the same
# order, as ps_worker (libps's settings table, _lib.setting)
RANK_ENV = _lib.setting("rank")[0]
SIZE_ENV = _lib.setting("num-workers")[0]
SERVERS_ENV = _lib.setting("servers")[0][0]


class PSError(Exception):
    """A libps call failed.  code: the PS_E* value (ps.EMISMATCH, ...);
    name: its name ("PS_EMISMATCH"); message: libps's text (which server and
    why), what the C API puts in ps_client_last_error or ps_request.err."""

    def __init__(self, code, message, what=None):
        self.code = code
        self.name = "PS_" + (_lib.ERRORS[code] if 0 <= code < len(_lib.ERRORS) else "E?")
        self.message = message or _lib.strerror(code)
        text = "%s: %s" % (what, self.message) if what else self.message
        super().__init__("%s [%s]" % (text, self.name))


def _env_first(names, env):
    for n in names:
        v = env.get(n)
        if v:
            return n, v
    return None, None


def _int_setting(value, names, env, what, default):
    """An int from the argument, else the first set environment variable."""
    if value is not None:
        src = what
    else:
        src, value = _env_first(names, env)
        if value is None:
            return default
        src = "%s (from %s)" % (what, src)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("%s must be an integer, got %r" % (src, value)) from None


def _range_setting(value, names, env, what, default):
    """(MIN, MAX) from N or "MIN:MAX" (an elastic job, ps_server --num-workers
    MIN:MAX), the argument or else the first set variable; N is (N, N)."""
    if isinstance(value, str) and ":" in value or (
            value is None and ":" in str(_env_first(names, env)[1] or "")):
        src, text = (what, value) if value is not None else _env_first(names, env)
        lo, _, hi = text.partition(":")
        lo = _int_setting(lo, names, env, "%s (MIN of %s)" % (what, src), default)
        hi = _int_setting(hi, names, env, "%s (MAX of %s)" % (what, src), default)
        if not 1 <= lo <= hi:
            raise ValueError("%s MIN:MAX needs 1 <= MIN <= MAX, got %r" % (src, text))
        return lo, hi
    n = _int_setting(value, names, env, what, default)
    return n, n


def _from_env(value, name, env):
    """(value, where it came from): the argument when given, else the first
    set variable of setting `name` (as ps_worker reads them), else its
    default; where is None for the argument and the default."""
    if value is not None:
        return value, None
    var, v = _env_first(_lib.setting(name)[0], env)
    return (v, var) if v is not None else (_lib.setting(name)[1], None)


# the port of the one server MASTER_ADDR names, unless PS_PORT says
MASTER_PORT_DEFAULT = 5555


def _master_server(env):
    """torchrun's convention: no PS_SERVERS, but MASTER_ADDR (the host of
    rank 0): one server there, tcp://MASTER_ADDR:PS_PORT (5555; not
    MASTER_PORT, which torchrun's own store listens on)."""
    host = env.get("MASTER_ADDR")
    if not host:
        return None
    port = env.get("PS_PORT") or MASTER_PORT_DEFAULT
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host  # an IPv6 address
    return "tcp://%s:%s" % (host, port)


def _shm_setting(value, env):
    """shm from the argument (True/False, 'auto'/'off'), else PS_SHM, else on."""
    value, var = _from_env(value, "shm", env)
    src = "shm (from %s)" % var if var else "shm"
    if isinstance(value, bool):
        return value
    if value in ("auto", "on", "1"):
        return True
    if value in ("off", "0"):
        return False
    raise ValueError("%s must be 'auto' or 'off', got %r" % (src, value))


def _size(value, what):
    """Bytes from an int or a string with suffix K, M or G (binary), as the
    programs' --chunk-size."""
    if isinstance(value, int):
        return value
    s = str(value).strip()
    mul = 1
    for suffix, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        for tail in (suffix + "iB", suffix + "B", suffix):
            if s.upper().endswith(tail.upper()):
                s, mul = s[:-len(tail)], m
                break
        if mul != 1:
            break
    try:
        return int(s) * mul
    except ValueError:
        raise ValueError("%s must be a size in bytes (suffix K, M, G allowed), got %r"
                         % (what, value)) from None


# --wire-dtype's names (proto/ps_dtype.c) and their enum ps_dtype values
WIRE_DTYPES = {"f32": 1, "float32": 1, "bf16": 2, "bfloat16": 2, "f16": 3, "float16": 3,
               "fp16": 3}


def parse_wire_dtype(value):
    """'f32' | 'bf16' | 'f16' (and the long names) -> enum ps_dtype."""
    if value in WIRE_DTYPES.values() and not isinstance(value, bool):
        return value
    try:
        return WIRE_DTYPES[str(value)]
    except KeyError:
        raise ValueError("wire_dtype must be f32, bf16 or f16, got %r" % (value,)) from None


# --on-nonfinite's names (enum ps_on_nonfinite, include/ps_types.h)
ON_NONFINITE = {"refuse": 0, "skip": 1, "apply": 2}


def _on_nonfinite_setting(value, env):
    """on_nonfinite from the argument, else PS_ON_NONFINITE, else 'refuse'."""
    value, var = _from_env(value, "on-nonfinite", env)
    if value in ON_NONFINITE.values() and not isinstance(value, bool):
        return value
    try:
        return ON_NONFINITE[str(value)]
    except KeyError:
        raise ValueError("on_nonfinite%s must be refuse, skip or apply, got %r"
                         % (" (from %s)" % var if var else "", value)) from None


def parse_mode(mode):
    """'sync' / 'async' / ps.SYNC / ps.ASYNC -> ps.SYNC or ps.ASYNC."""
    if mode in (SYNC, ASYNC):
        return mode
    m = {"sync": SYNC, "async": ASYNC}.get(str(mode).lower())
    if m is None:
        raise ValueError("mode must be 'sync' or 'async', got %r" % (mode,))
    return m


def optimizer_expectation(expect, env):
    """ps_opt_config for `expect` (a dict: {'optimizer': 'adam', 'lr': 1e-3,
    ...}, keys the table's fields), on top of PS_OPTIMIZER, PS_LR,
    PS_MOMENTUM, ... (the programs' flags, upper case, '-' as '_'), which
    ps_launch --exec sets for its workers.  Only what is given is checked."""
    c = _lib.OptConfig()
    given = {}
    for field, flag, _, _ in _lib.OPT_PARAMS:
        v = env.get("PS_" + flag[2:].upper().replace("-", "_"))
        if v:
            given[field] = v
    kind = env.get("PS_OPTIMIZER") or None
    if expect:
        expect = dict(expect)
        kind = expect.pop("optimizer", kind)
        fields = {f for f, _, _, _ in _lib.OPT_PARAMS}
        for k, v in expect.items():
            if k not in fields:
                raise ValueError("expect: unknown optimizer setting %r (known: optimizer, %s)"
                                 % (k, ", ".join(sorted(fields))))
            if v is not None:
                given[k] = v
    if kind:
        if kind not in _lib.OPT_KINDS[1:]:
            raise ValueError("optimizer must be one of %s, got %r"
                             % (", ".join(k for k in _lib.OPT_KINDS[1:] if k), kind))
        c.kind = _lib.OPT_KINDS.index(kind)
    for p, (field, flag, _, is_int) in enumerate(_lib.OPT_PARAMS):
        if field in given:
            try:
                setattr(c, field, int(given[field]) if is_int else float(given[field]))
            except ValueError:
                raise ValueError("%s must be a number, got %r" % (flag, given[field])) from None
            c.given |= 1 << p
    return c


def _ids_buffer(ids, what):
    """(address, count, what to keep alive) of a table's ids as uint64: a
    contiguous uint64 array in place, anything else (a list, an int64
    array) copied once into a ctypes array."""
    ai = getattr(ids, "__array_interface__", None)
    if ai is not None and ai.get("typestr") in ("<u8", "=u8") and ai.get("strides") is None:
        n = 1
        for d in ai.get("shape", ()):
            n *= d
        return ai["data"][0], n, ids
    try:
        vals = [int(v) for v in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    except (TypeError, ValueError):
        raise TypeError("%s: ids must be a sequence of integers (a uint64 numpy array is used "
                        "in place)" % what) from None
    if any(v < 0 or v >= 1 << 64 for v in vals):
        raise ValueError("%s: ids must be in [0, 2^64)" % what)
    arr = (ctypes.c_uint64 * max(len(vals), 1))(*vals)
    return ctypes.addressof(arr), len(vals), arr


def table_options(dim, init="uniform", scale=0.01, seed=0, optimizer=None, max_rows=0,
                  min_count=0, filter_cells=0, ftrl_beta=1.0, ftrl_l1=0.0, ftrl_l2=0.0,
                  full="evict"):
    """ps_table_options for register_table.  optimizer: None (adagrad with the
    optimizer table's defaults) or a dict {'optimizer': 'sgd' | ... | 'adam' |
    'ftrl' | 'rowwise_adagrad', 'lr': ..., ...} with the hyper-parameters of
    include/ps_types.h's table.  max_rows: a row cap for the whole table (0:
    none); full: what a table at its cap does with a new id, "evict" its least
    recently touched row or "refuse" the request (PS_ETOOBIG)."""
    o = _lib.TableOptions()
    lib.ps_table_options_default(ctypes.byref(o))
    o.dim = dim
    if init not in _lib.TABLE_INITS:
        raise ValueError("init must be one of %s, got %r" % (", ".join(_lib.TABLE_INITS), init))
    o.init = _lib.TABLE_INITS.index(init)
    o.init_scale, o.seed = scale, seed
    opt = dict(optimizer or {})
    kind = opt.pop("optimizer", None)
    if kind == "ftrl":
        o.opt.kind = _lib.OPT_FTRL
    elif kind == "rowwise_adagrad":
        o.opt.kind = _lib.OPT_ROWWISE_ADAGRAD
    elif kind is not None:
        rules = _lib.OPT_KINDS[1:_lib.OPT_FTRL]  # sgd .. adam: not the worker-side kinds
        if kind not in rules:
            raise ValueError("a table's optimizer must be one of %s, ftrl or rowwise_adagrad, "
                             "got %r" % (", ".join(rules), kind))
        o.opt.kind = _lib.OPT_KINDS.index(kind)
    fields = {f: is_int for f, _, _, is_int in _lib.OPT_PARAMS}
    for k, v in opt.items():
        if k not in fields:
            raise ValueError("table optimizer: unknown setting %r (known: optimizer, %s)"
                             % (k, ", ".join(sorted(fields))))
        setattr(o.opt, k, int(v) if fields[k] else float(v))
    o.ftrl_beta, o.ftrl_l1, o.ftrl_l2 = ftrl_beta, ftrl_l1, ftrl_l2
    o.max_rows, o.min_count, o.filter_cells = max_rows, min_count, filter_cells
    if full not in _lib.TABLE_FULL:
        raise ValueError("full must be one of %s, got %r" % (", ".join(_lib.TABLE_FULL), full))
    o.full = _lib.TABLE_FULL.index(full)
    return o


class Request:
    """One posted operation.  done(): has it completed; wait(): block until
    it has (the GIL is released meanwhile) and return the version the
    servers' replies carried, or raise PSError with libps's reason."""

    __slots__ = ("_c", "_keep", "_client", "what", "__weakref__")

    def __init__(self, client, what, keep):
        self._c = _lib.RequestStruct()
        self._keep = keep      # the caller's arrays, alive until completion
        self._client = client
        self.what = what

    def _finished(self):
        self._keep = None
        if self._client is not None:
            self._client._pending.discard(self)
            self._client = None

    def done(self):
        if self._client is None:
            return True
        if lib.ps_request_test(ctypes.byref(self._c)):
            self._finished()
            return True
        return False

    def wait(self):
        if self._client is not None:
            lib.ps_request_wait(ctypes.byref(self._c))
            self._finished()
        if self._c.status:
            raise PSError(self._c.status, self.err, self.what)
        return self._c.version

    def wait_for(self, seconds):
        """Wait at most that long: True once it completed (then wait()
        returns at once, or raises), False while it is pending."""
        if self._client is not None:
            if lib.ps_request_wait_for(ctypes.byref(self._c), int(seconds * 1000)) < 0:
                return False
            self._finished()
        return True

    @property
    def status(self):
        """0, or the PS_E* code of the first failure (valid once done)."""
        return self._c.status

    @property
    def version(self):
        """The smallest version the replies carried; -1 when none did."""
        return self._c.version

    @property
    def done_ns(self):
        """When the comm thread completed it (CLOCK_MONOTONIC ns)."""
        return self._c.done_ns

    @property
    def err(self):
        return self._c.err.decode(errors="replace")

    def __repr__(self):
        state = "done, status %d" % self._c.status if self._client is None else "pending"
        return "<ps.Request %s: %s>" % (self.what, state)


class _Handle:
    """The C client and what must outlive its pending requests; closed once,
    by close(), the owner that adopted it, or the finalizer."""

    def __init__(self, ptr):
        self.ptr = ptr
        self.closer = lib.ps_client_close  # an exchange that adopts it replaces these
        self.interrupter = lib.ps_client_interrupt
        self.before_close = None  # called once, the client still open (ps.torch's leaving)
        _signals.watch(self, lib)  # Ctrl-C interrupts what waits in libps

    def interrupt(self):
        """From another thread (the Ctrl-C watcher), while open."""
        self.interrupter(self.ptr)

    def close(self):
        hook, self.before_close = self.before_close, None
        if hook is not None and self.ptr:
            hook()
        _signals.forget(self)
        ptr, self.ptr = self.ptr, None
        if ptr:
            self.closer(ptr)


class Client:
    """A worker's connection to the parameter servers.

    Every argument left None comes from the environment, as for ps_worker
    (the same variables, from libps's settings table), else ps_worker's
    default:
      servers       "tcp://H:P,..." or a list; PS_SERVERS, else one server at
                    MASTER_ADDR (torchrun's) on port PS_PORT (5555)
      rank          PS_RANK, RANK (torchrun), SLURM_PROCID, OMPI_COMM_WORLD_RANK,
                    PMI_RANK (0)
      num_workers   PS_NUM_WORKERS, WORLD_SIZE (torchrun), SLURM_NTASKS,
                    OMPI_COMM_WORLD_SIZE, PMI_SIZE (1)
      mode          'sync' | 'async'; PS_MODE ('sync')
      max_staleness async: -1 unbounded, k >= 0 bounded; PS_MAX_STALENESS (-1)
      chunk_size    bytes or "4M"; PS_CHUNK_SIZE (4 MiB)
      curve_dir     CURVE keys (ps_keygen); PS_CURVE_KEYS (plaintext)
      hello_timeout_ms, request_timeout_ms, heartbeat_ms, server_timeout_ms
                    PS_HELLO_TIMEOUT (10000), PS_REQUEST_TIMEOUT (5000: resend
                    an unanswered request), PS_HEARTBEAT (1000),
                    PS_SERVER_TIMEOUT (seconds, as ps_worker --server-timeout:
                    60, give up on a silent server)
      shm           'auto' | 'off' (or True/False); PS_SHM ('auto'): payloads
                    to servers on this host go through shared memory
      wire_dtype    'f32' | 'bf16' | 'f16'; PS_WIRE_DTYPE ('f32'): the type of
                    pushed gradients and pulled weights on the network (the
                    arrays stay float32); the servers must run with the same
      on_nonfinite  'refuse' | 'skip' | 'apply'; PS_ON_NONFINITE ('refuse'): a
                    gradient with NaN or Inf (or beyond float16 with that wire
                    type) is not sent, its push fails with ENONFINITE naming
                    the step; else it is sent with a warning (the servers'
                    --on-nonfinite decides)
      admin_token   the servers' --admin-token-file token, for shutdown_servers();
                    PS_ADMIN_TOKEN (none)
      metrics_port  > 0: serve this client's Prometheus metrics there
                    (metrics_url); PS_METRICS_PORT (0: none)
      metrics_bind  the address they listen on; PS_METRICS_BIND (127.0.0.1)
      expect        the optimizer the servers must run, e.g. {'optimizer':
                    'adam', 'lr': 1e-3}; PS_OPTIMIZER, PS_LR, ... (nothing
                    checked when nothing is given)
      role          'worker' (default) or 'reader': a client of rank -1 that
                    reads while the workers train (lookup(), pull(),
                    export()), takes the servers' mode and worker count
                    (rank and num_workers are not read), is counted in no
                    round or barrier and is refused any push; under CURVE
                    it uses curve_dir/reader.key (docs/OPERATIONS.md
                    "Export and serve")
    Opening checks the settings and every endpoint and starts the comm
    thread; nothing is sent until start().  Use it as a context manager, or
    call close(); a finalizer closes a forgotten one.
    """

    def __init__(self, servers=None, rank=None, num_workers=None, mode=None, max_staleness=None,
                 chunk_size=None, curve_dir=None, hello_timeout_ms=None, request_timeout_ms=None,
                 heartbeat_ms=None, expect=None, env=None, shm=None, server_timeout_ms=None,
                 admin_token=None, wire_dtype=None, on_nonfinite=None, metrics_port=None,
                 metrics_bind=None, role="worker"):
        env = os.environ if env is None else env
        if role not in ("worker", "reader"):
            raise ValueError("role must be 'worker' or 'reader', got %r" % (role,))
        self.role = role
        servers = _from_env(servers, "servers", env)[0] or _master_server(env)
        if not servers:
            raise ValueError("no servers: pass servers='tcp://HOST:PORT,...' or set PS_SERVERS "
                             "(ps_launch --exec sets it for its workers), or MASTER_ADDR for "
                             "one server there on port PS_PORT (5555)")
        if not isinstance(servers, str):
            servers = ",".join(servers)
        self.servers = servers
        if role == "reader":  # the servers' count is taken at start
            self.num_workers, self.rank = 1, _lib.RANK_READER
            self.num_workers_min = 1
        else:
            self.num_workers_min, self.num_workers = _range_setting(num_workers, SIZE_ENV, env,
                                                                    "num_workers", 1)
            self.rank = _int_setting(rank, RANK_ENV, env, "rank", 0)
        if self.num_workers < 1:
            raise ValueError("num_workers must be at least 1, got %d" % self.num_workers)
        if role == "worker" and not 0 <= self.rank < self.num_workers:
            raise ValueError("rank must be in [0, %d] for %d worker(s), got %d"
                             % (self.num_workers - 1, self.num_workers, self.rank))
        self.mode = parse_mode(_from_env(mode, "mode", env)[0])
        self.max_staleness = _int_setting(max_staleness, _lib.setting("max-staleness")[0], env,
                                          "max_staleness", int(_lib.setting("max-staleness")[1]))
        if self.mode == SYNC:
            if self.max_staleness > 0:
                raise ValueError("max_staleness applies to mode 'async' only (sync is "
                                 "staleness 0)")
            self.max_staleness = 0
        self.chunk_bytes = _size(_from_env(chunk_size, "chunk-size", env)[0], "chunk_size")
        self.curve_dir = _from_env(curve_dir, "curve-keys", env)[0]
        self.wire_dtype = parse_wire_dtype(_from_env(wire_dtype, "wire-dtype", env)[0])

        o = _lib.ClientOptions()
        lib.ps_client_options_default(ctypes.byref(o))
        o.servers = self.servers.encode()
        o.rank, o.num_workers, o.mode = self.rank, self.num_workers, self.mode
        o.num_workers_min = self.num_workers_min
        o.max_staleness = self.max_staleness
        o.chunk_bytes = self.chunk_bytes
        o.expect = optimizer_expectation(expect, env)
        o.hello_timeout_ms = _int_setting(hello_timeout_ms, _lib.setting("hello-timeout")[0],
                                          env, "hello_timeout_ms", o.hello_timeout_ms)
        o.request_timeout_ms = _int_setting(request_timeout_ms,
                                            _lib.setting("request-timeout")[0], env,
                                            "request_timeout_ms",
                                            int(_lib.setting("request-timeout")[1]))
        o.heartbeat_ms = _int_setting(heartbeat_ms, _lib.setting("heartbeat")[0], env,
                                      "heartbeat_ms", o.heartbeat_ms)
        if server_timeout_ms is None:  # the variable holds seconds, as --server-timeout
            var, secs = _env_first(_lib.setting("server-timeout")[0], env)
            try:  # a positive time stays on, as in ps_worker
                server_timeout_ms = (None if secs is None else
                                     max(round(float(secs) * 1000), 1 if float(secs) > 0 else 0))
            except ValueError:
                raise ValueError("server_timeout (from %s) must be a number of seconds, got %r"
                                 % (var, secs)) from None
        o.server_timeout_ms = _int_setting(server_timeout_ms, (), env, "server_timeout_ms",
                                           o.server_timeout_ms)
        self.shm = _shm_setting(shm, env)
        o.shm = 1 if self.shm else 0
        self.on_nonfinite = _on_nonfinite_setting(on_nonfinite, env)
        o.on_nonfinite = self.on_nonfinite
        self.admin_token = _from_env(admin_token, "admin-token", env)[0]
        if self.admin_token:
            o.admin_token = str(self.admin_token).encode()
        if self.curve_dir:
            o.curve_dir = str(self.curve_dir).encode()
        o.metrics_port = _int_setting(metrics_port, _lib.setting("metrics-port")[0], env,
                                      "metrics_port", o.metrics_port)
        self.metrics_bind = _from_env(metrics_bind, "metrics-bind", env)[0]
        if self.metrics_bind:
            o.metrics_bind = str(self.metrics_bind).encode()
        self.options = o
        self._env, self._expect = env, dict(expect or {})
        self._counts = {}       # key -> registered float count
        self._tables = {}       # key -> a registered table's row width
        self._pending = set()   # posted, not yet seen complete
        self.started = False
        lib.ps_log_init(b"python", self.rank)
        self._open()

    def _open(self):
        ptr = ctypes.c_void_p()
        rc = lib.ps_client_open(ctypes.byref(self.options), ctypes.byref(ptr))
        if rc:
            raise PSError(rc, _lib.last_error(None), "open")
        rc = lib.ps_client_set_wire_dtype(ptr, self.wire_dtype)
        if rc:
            lib.ps_client_close(ptr)
            raise PSError(rc, "wire dtype %d refused" % self.wire_dtype, "open")
        self._handle = _Handle(ptr)
        self._finalizer = weakref.finalize(self, _Handle.close, self._handle)

    def expect(self, **settings):
        """Add to the optimizer expectation before start (e.g. what a torch
        optimizer runs: ps.torch does this).  A setting given to the
        constructor that differs is a ValueError.  Nothing was sent yet, so
        the C client is simply opened again with the new expectation."""
        if self.started or self._counts:
            raise ValueError("the optimizer expectation is fixed once tensors are registered")
        for k, v in settings.items():
            if k in self._expect and self._expect[k] != v:
                raise ValueError("optimizer setting %s: the client was given %r, now %r"
                                 % (k, self._expect[k], v))
        self._expect.update(settings)
        self.options.expect = optimizer_expectation(self._expect, self._env)
        old, fin = self._handle, self._finalizer
        self._open()
        fin.detach()
        old.close()

    # ---- set-up ----

    @property
    def _ptr(self):
        ptr = self._handle.ptr
        if not ptr:
            raise PSError(_lib.ERRORS.index("ECLOSED"), "the client is closed")
        return ptr

    def _check(self, rc, what):
        if rc:
            raise PSError(rc, _lib.last_error(self._ptr), what)

    def register(self, key, count):
        """Declare tensor `key` of `count` float32 elements (or the length of
        an array given instead), on every worker in the same order."""
        if not isinstance(count, int):
            count = float_buffer(count, "register key %d" % key, False)[1]
        self._check(lib.ps_client_register(self._ptr, key, count), "register key %d" % key)
        self._counts[key] = count

    def register_table(self, key, dim, name=None, **options):
        """Declare embedding table `key` of rows of `dim` float32 values,
        before start and in the same order on every worker; options as
        table_options (init, scale, seed, optimizer, max_rows, min_count,
        filter_cells, ftrl_beta, ftrl_l1, ftrl_l2); name: what the servers'
        logs call it.  The servers make a row at its first pull with the
        initializer's values (ps.table_init)."""
        o = table_options(dim, **options)
        self._check(lib.ps_client_register_table(self._ptr, key, ctypes.byref(o)),
                    "register table %d" % key)
        self._tables[key] = dim
        if name is not None:
            self.name_table(key, name)

    def name_table(self, key, name):
        """The name the servers' logs give table `key` (before start; at
        most 63 printable characters)."""
        self._check(lib.ps_client_name_table(self._ptr, key, name.encode()),
                    "name table %d" % key)

    @property
    def metrics_url(self):
        """Where this client serves its Prometheus metrics
        ('http://127.0.0.1:9403/metrics'; metrics_port), or None."""
        url = lib.ps_client_metrics_url(self._ptr) if self._ptr else None
        return url.decode() if url else None

    def start(self):
        """Placement and hello with every server; PSError EMISMATCH when a
        server disagrees (mode, worker count, model, tables, optimizer) and
        ETIMEDOUT when one does not answer."""
        self._check(lib.ps_client_start(self._ptr), "start")
        self.started = True

    # ---- requests ----

    def _buffer(self, key, arr, what, writable):
        if key not in self._counts:
            raise KeyError("%s: key %d was not registered" % (what, key))
        addr, n, keep = float_buffer(arr, what, writable)
        if n != self._counts[key]:
            raise ValueError("%s: %d floats, but key %d was registered with %d"
                             % (what, n, key, self._counts[key]))
        return addr, keep

    def _post(self, what, keep, call):
        if len(self._pending) > 256:
            for r in list(self._pending):
                r.done()  # drops the completed ones
        r = Request(self, what, keep)
        rc = call(ctypes.byref(r._c))
        if rc:
            r._finished()
            raise PSError(rc, r.err or _lib.strerror(rc), what)
        self._pending.add(r)
        return r

    def init(self, key, values):
        """First values of a tensor (the first init of each chunk wins)."""
        what = "init of key %d" % key
        a, keep = self._buffer(key, values, what + ": values", False)
        return self._post(what, keep, lambda r: lib.ps_client_init(self._ptr, key, a, r))

    def push(self, key, grad, step):
        """The gradient of `step` (the pushes made before this one)."""
        what = "push of key %d step %d" % (key, step)
        a, keep = self._buffer(key, grad, what + ": grad", False)
        return self._post(what, keep, lambda r: lib.ps_client_push(self._ptr, key, a, step, r))

    def pull(self, key, dst, step):
        """Weights of at least version `step` into dst (sync: waits for
        round step-1; bounded staleness: for the slowest worker)."""
        what = "pull of key %d step %d" % (key, step)
        a, keep = self._buffer(key, dst, what + ": dst", True)
        return self._post(what, keep, lambda r: lib.ps_client_pull(self._ptr, key, a, step, r))

    def pushpull(self, key, grad, dst, step):
        """Push the gradient of `step`, then pull version step+1 into dst."""
        what = "pushpull of key %d step %d" % (key, step)
        g, kg = self._buffer(key, grad, what + ": grad", False)
        d, kd = self._buffer(key, dst, what + ": dst", True)
        return self._post(what, (kg, kd),
                          lambda r: lib.ps_client_pushpull(self._ptr, key, g, d, step, r))

    # ---- tables ----

    def _rows(self, key, ids, arr, what, writable):
        """The ids' and rows' memory, the row count checked against the ids."""
        if key not in self._tables:
            raise KeyError("%s: table %d was not registered" % (what, key))
        ia, n, ik = _ids_buffer(ids, what + ": ids")
        if arr is None and n == 0:
            return ia, n, 0, (ik,)
        ra, m, rk = float_buffer(arr, what + (": rows" if writable else ": grads"), writable)
        if m != n * self._tables[key]:
            raise ValueError("%s: %d floats for %d ids of table %d (dim %d): %d expected"
                             % (what, m, n, key, self._tables[key], n * self._tables[key]))
        return ia, n, ra, (ik, rk)

    def sparse_pull(self, key, ids, rows, step):
        """The rows of ids (any order, repeats allowed) at version `step` into
        rows (len(ids) x dim float32, written in the ids' order)."""
        what = "sparse pull of table %d step %d" % (key, step)
        ia, n, ra, keep = self._rows(key, ids, rows, what, True)
        return self._post(what, keep, lambda r: lib.ps_client_sparse_pull(
            self._ptr, key, ia, n, ra, step, r))

    def sparse_push(self, key, ids, grads, step):
        """The gradient rows of ids at `step` (a repeated id's rows summed);
        every worker pushes every table every step, also with no ids."""
        what = "sparse push of table %d step %d" % (key, step)
        ia, n, ga, keep = self._rows(key, ids, grads, what, False)
        return self._post(what, keep, lambda r: lib.ps_client_sparse_push(
            self._ptr, key, ia, n, ga, step, r))

    def sparse_pushpull(self, key, push_ids, grads, pull_ids, rows, step):
        """A sparse push of `step`, then the rows of pull_ids at step+1."""
        what = "sparse pushpull of table %d step %d" % (key, step)
        ia, n, ga, k1 = self._rows(key, push_ids, grads, what, False)
        ib, m, ra, k2 = self._rows(key, pull_ids, rows, what, True)
        return self._post(what, (k1, k2), lambda r: lib.ps_client_sparse_pushpull(
            self._ptr, key, ia, n, ga, ib, m, ra, step, r))

    def lookup(self, tables):
        """Rows of several tables in one request (a reader's, or a
        worker's): tables is a list of (key, ids, rows), rows len(ids) x dim
        float32, written in the ids' order.  Read-only on the servers: a row
        that does not exist reads as its initializer and is not made.
        wait() returns the lowest version of the partitions read (sync: at
        most one step behind the workers)."""
        what = "lookup of %d tables" % len(tables)
        n = len(tables)
        keys = (ctypes.c_uint64 * max(n, 1))()
        ids = (ctypes.c_void_p * max(n, 1))()
        counts = (ctypes.c_size_t * max(n, 1))()
        rows = (ctypes.c_void_p * max(n, 1))()
        keep = [keys, ids, counts, rows]
        for k, (key, tid, trows) in enumerate(tables):
            ia, m, ra, kk = self._rows(key, tid, trows, what, True)
            keys[k], ids[k], counts[k], rows[k] = key, ia, m, ra
            keep.append(kk)
        return self._post(what, keep, lambda r: lib.ps_client_lookup(
            self._ptr, n, keys, ids, counts, rows, r))

    def export(self, path, state=True, version=-1, key_versions=None, wait_ms=-1):
        """A snapshot of every server written to folder path (a new one):
        manifest.json, dense/KEY.weights.npy, tables/KEY.ids.npy (sorted) and
        KEY.weights.npy, with state=True the optimizer's state too.  Sync:
        every item at version `version` (-1: the newest any server has),
        key_versions {key: version} overriding it (a worker's own steps);
        async: each as it is.  Blocks; raises PSError.  docs/OPERATIONS.md
        "Export and serve" has the format and the consistency."""
        kv = dict(key_versions or {})
        n = len(kv)
        keys = (ctypes.c_uint64 * max(n, 1))(*kv.keys())
        vers = (ctypes.c_int64 * max(n, 1))(*kv.values())
        self._check(lib.ps_client_export(self._ptr, os.fsencode(path),
                                         _lib.EXPORT_STATE if state else 0, version, keys, vers,
                                         n, int(wait_ms)), "export to %s" % (path,))

    def sparse_assign(self, key, ids, rows):
        """Set the rows of ids (distinct) to rows (len(ids) x dim float32,
        sent exactly): a model's own first rows.  Not a step."""
        what = "assign of table %d" % key
        ia, n, ra, keep = self._rows(key, ids, rows, what, False)
        return self._post(what, keep, lambda r: lib.ps_client_sparse_assign(
            self._ptr, key, ia, n, ra, r))

    def server_parts(self, server):
        """The partitions server `server` splits each table into (after start)."""
        return lib.ps_client_server_parts(self._ptr, server)

    # ---- for a framework's optimizer (ps.torch; include/ps_client.h) ----

    def hyper(self, change=None, from_step=0, table=None):
        """Change the servers' hyper-parameters ({'lr': 0.05, ...}: the table's
        fields) from step from_step on (sync: that round on; async: the next
        push on); none: only ask.  Returns the servers' optimizer as it runs
        now: {'optimizer': 'momentum', 'lr': ..., every hyper-parameter}.
        table: an embedding table's key: that table's optimizer (from its
        own step from_step on; 'optimizer' then names the dense kind whose
        hyper-parameters it takes: adagrad for rowwise_adagrad)."""
        c = optimizer_expectation(change or {}, {})
        now = _lib.OptConfig()
        if table is None:
            rc = lib.ps_client_hyper(self._ptr, ctypes.byref(c), from_step, ctypes.byref(now))
        else:
            rc = lib.ps_client_table_hyper(self._ptr, table, ctypes.byref(c), from_step,
                                           ctypes.byref(now))
        self._check(rc, "hyper-parameters" if table is None else
                    "hyper-parameters of table %d" % table)
        out = {"optimizer": _lib.OPT_KINDS[now.kind] if 0 <= now.kind < len(_lib.OPT_KINDS)
               else None}
        for field, _, _, _ in _lib.OPT_PARAMS:
            out[field] = getattr(now, field)
        return out

    def assign(self, key, values):
        """Overwrite the tensor's weights on the servers (its version and
        optimizer state stay)."""
        what = "assign of key %d" % key
        a, keep = self._buffer(key, values, what + ": values", False)
        return self._post(what, keep, lambda r: lib.ps_client_assign(self._ptr, key, a, r))

    def _planes(self, key, arr, nstate, what, writable):
        if key not in self._counts:
            raise KeyError("%s: key %d was not registered" % (what, key))
        addr, n, keep = float_buffer(arr, what, writable)
        if n != self._counts[key] * nstate:
            raise ValueError("%s: %d floats, but key %d holds %d x %d state arrays"
                             % (what, n, key, self._counts[key], nstate))
        return addr, keep

    def state(self, key, dst, nstate):
        """The servers' optimizer state of the tensor into dst (count x nstate
        floats, chunk after chunk: include/ps_client.h); wait() returns the
        optimizer's step count."""
        what = "state of key %d" % key
        a, keep = self._planes(key, dst, nstate, what + ": dst", True)
        return self._post(what, keep, lambda r: lib.ps_client_state(self._ptr, key, a, nstate, r))

    def set_state(self, key, src, nstate, step):
        """Load the tensor's optimizer state (laid out as state() gives it)
        of step count `step`."""
        what = "set_state of key %d" % key
        a, keep = self._planes(key, src, nstate, what + ": src", False)
        return self._post(what, keep,
                          lambda r: lib.ps_client_set_state(self._ptr, key, a, nstate, step, r))

    def clock(self, key):
        """The step this worker's next push of the tensor or table carries
        (wait() returns it; a table's: the smallest over its partitions):
        sync the open round, async its pushes so far.  A key that is neither
        (libps knows the tables ps.torch declares through its exchange)
        raises PSError PS_ENOTFOUND."""
        what = "clock of key %d" % key
        return self._post(what, None, lambda r: lib.ps_client_clock(self._ptr, key, r))

    def _collective(self, fn, name, coll_id, src, dst):
        what = "%s %d" % (name, coll_id)
        s, n, ks = float_buffer(src, what + ": src", False)
        d, m, kd = float_buffer(dst, what + ": dst", True)
        if n != m or n == 0:
            raise ValueError("%s: src has %d floats, dst %d (equal, at least 1)" % (what, n, m))
        return self._post(what, (ks, kd), lambda r: fn(self._ptr, coll_id, s, d, n, r))

    def allreduce(self, coll_id, src, dst):
        """dst = the mean of every worker's src (float32, equal lengths),
        summed in rank order on server 0; each id once."""
        return self._collective(lib.ps_client_allreduce, "allreduce", coll_id, src, dst)

    def broadcast(self, coll_id, src, dst):
        """dst = rank 0's src (byte for byte); every worker gives arrays of
        the same length; each id once."""
        return self._collective(lib.ps_client_broadcast, "broadcast", coll_id, src, dst)

    def leave(self, timeout=None):
        """This worker is done: rounds and barriers go on without it (its
        pulls are still answered; push nothing more).  timeout (seconds):
        wait at most that long for the servers' acknowledgements (False if
        one did not come; the request ends with the client)."""
        if timeout is None:
            self._check(lib.ps_client_leave(self._ptr), "leave")
            return True
        reqs = [self._post("leave of server %d" % s, None,
                           lambda r, s=s: lib.ps_client_leave_post(self._ptr, s, r))
                for s in range(self.num_servers)]
        deadline = time.monotonic() + timeout
        return all(r.wait_for(max(0.0, deadline - time.monotonic())) for r in reqs)

    def join(self):
        """An elastic job (num_workers="MIN:MAX"): this worker, started while
        the others train, counts from the returned step on, on every chunk
        (ps_client_join); pull that version and push that step first."""
        step = ctypes.c_int64()
        self._check(lib.ps_client_join(self._ptr, ctypes.byref(step)), "join")
        return step.value

    def members(self):
        """(index, count, version): the members now, from server 0; this
        worker the index-th of count in rank order (-1: not a member), and
        how many times the membership changed (a fixed job: (rank,
        num_workers, 0)).  The dense rank and size of an elastic job."""
        i, n, v = ctypes.c_int(), ctypes.c_int(), ctypes.c_int64()
        self._check(lib.ps_client_members(self._ptr, ctypes.byref(i), ctypes.byref(n),
                                          ctypes.byref(v)), "members")
        return i.value, n.value, v.value

    @property
    def elastic(self):
        """num_workers was given as MIN:MAX with MIN < MAX."""
        return self.num_workers_min < self.num_workers

    def barrier_info(self):
        """(barrier id, [ranks it still waits for]) of the open barrier with
        the lowest id on server 0; (-1, []) when none is open."""
        bi = _lib.BarrierInfo()
        self._check(lib.ps_client_barrier_info(self._ptr, ctypes.byref(bi)), "barrier info")
        return bi.id, [bi.ranks[k] for k in range(bi.nranks)]

    # ---- blocking helpers ----

    def barrier(self, barrier_id=0):
        """Wait until every worker has reached barrier `barrier_id`; use
        each id once (ids from 2^61 up are the wrapper's)."""
        self._check(lib.ps_client_barrier(self._ptr, barrier_id), "barrier %d" % barrier_id)

    def barrier_post(self, barrier_id):
        """The barrier as a Request (wait_for it and say meanwhile whom it
        waits for: barrier_info)."""
        what = "barrier %d" % barrier_id
        return self._post(what, None,
                          lambda r: lib.ps_client_barrier_post(self._ptr, barrier_id, r))

    def stats(self, server=0):
        """Server `server`'s counters as a dict."""
        st = _lib.Stats()
        self._check(lib.ps_client_stats(self._ptr, server, ctypes.byref(st)),
                    "stats of server %d" % server)
        return {f: getattr(st, f) for f, _ in st._fields_}

    def shutdown_servers(self):
        self._check(lib.ps_client_shutdown_servers(self._ptr), "shutdown")

    @property
    def num_servers(self):
        return lib.ps_client_num_servers(self._ptr)

    @property
    def chunk_elems(self):
        return lib.ps_client_chunk_elems(self._ptr)

    # ---- end ----

    @property
    def closed(self):
        return not self._handle.ptr

    def close(self):
        """Stop the comm thread and close the sockets; pending requests
        complete with ECLOSED.  Idempotent."""
        self._finalizer()  # runs _Handle.close once
        for r in list(self._pending):
            r._finished()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<ps.Client rank %d of %d, %s, %s%s>" % (
            self.rank, self.num_workers, "sync" if self.mode == SYNC else "async", self.servers,
            ", closed" if self.closed else "")
