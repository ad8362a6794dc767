"""libps.so through ctypes: finding the library, the public structs of
include/ps_client.h and include/ps_types.h mirrored field for field, and the
prototypes of the functions the package calls.

The structs must match the C layout exactly: tests/python/test_client.py
(test_struct_layout_matches_the_c_headers) compares them with what
build/tests/abi_layout prints (sizes, offsets, the optimizer table, the error
codes), so a field added on the C side cannot shift this one silently.

Every call below goes through ctypes.CDLL, which releases the GIL for the
duration of the foreign call: a thread blocked in ps_request_wait or
ps_client_start lets the others run.
"""

import ctypes
import ctypes.util
import os

from ctypes import (POINTER, Structure, c_char, c_char_p, c_float, c_int, c_int64, c_size_t,
                    c_uint32, c_uint64, c_void_p)

SONAME = "libps.so.0"

# ---- include/ps_types.h ----

# X(name, value): PS_ERRORS
ERRORS = ("OK", "EINVAL", "ENOMEM", "EPROTO", "EIO", "ETIMEDOUT", "ENOTFOUND", "ESTATE",
          "EMISMATCH", "ECLOSED", "EVERSION", "ETOOBIG", "EDEVICE", "EAUTH", "EDATA",
          "EHELLO", "ENONFINITE", "EPERM", "ENOTPRIMARY", "ESTALE", "EMOVED")
ERR_TEXT_MAX = 200

MODE_SYNC, MODE_ASYNC = 1, 2

# enum ps_opt_kind by value from PS_OPT_NONE = 0 (6 is the tables' FTRL, no dense kind)
OPT_KINDS = ("none", "sgd", "momentum", "nesterov", "adagrad", "adam", None, "average", "add",
             "adamw")

# PS_OPT_PARAMS, in table order: (field, flag, default, is an integer)
OPT_PARAMS = (
    ("lr", "--lr", 0.01, False),
    ("momentum", "--momentum", 0.9, False),
    ("beta1", "--beta1", 0.9, False),
    ("beta2", "--beta2", 0.999, False),
    ("eps", "--eps", 1e-8, False),
    ("weight_decay", "--weight-decay", 0.0, False),
    ("lr_decay", "--lr-decay", 1.0, False),
    ("lr_decay_every", "--lr-decay-every", 0, True),
)

# PS_STATS_COUNTERS, in order
STATS_COUNTERS = ("pushes", "pulls", "inits", "updates", "bytes_in", "bytes_out", "dup_dropped",
                  "errors", "chunks", "workers_seen", "partitions", "rows", "table_bytes",
                  "evicted", "filtered", "nonfinite", "forged", "repl_epoch", "repl_lag")

# enum ps_table_init, and the tables-only optimizer kinds PS_TABLE_OPT_FTRL and
# PS_TABLE_OPT_ROWWISE_ADAGRAD
TABLE_INITS = ("zeros", "uniform", "normal")
OPT_FTRL = 6
OPT_ROWWISE_ADAGRAD = 10


class OptConfig(Structure):
    """ps_opt_config: the optimizer, its hyper-parameters, and which are given."""
    _fields_ = ([("kind", c_int)] +
                [(f, c_uint32 if is_int else c_float) for f, _, _, is_int in OPT_PARAMS] +
                [("given", c_uint32)])


class TableOptions(Structure):
    """ps_table_options: an embedding table's declaration."""
    _fields_ = [
        ("dim", c_uint32),
        ("init", c_int),
        ("init_scale", c_float),
        ("seed", c_uint64),
        ("opt", OptConfig),
        ("ftrl_beta", c_float),
        ("ftrl_l1", c_float),
        ("ftrl_l2", c_float),
        ("max_rows", c_uint64),
        ("min_count", c_uint32),
        ("filter_cells", c_uint32),
        ("full", c_uint32),
    ]


# ps_table_options.full: what a table at its max_rows does with a new id
TABLE_FULL = ("evict", "refuse")


class ClientOptions(Structure):
    """ps_client_options."""
    _fields_ = [
        ("servers", c_char_p),
        ("rank", c_int),
        ("num_workers", c_int),
        ("mode", c_int),
        ("max_staleness", c_int),
        ("chunk_bytes", c_size_t),
        ("expect", OptConfig),
        ("hello_timeout_ms", c_int),
        ("request_timeout_ms", c_int),
        ("curve_dir", c_char_p),
        ("heartbeat_ms", c_int),
        ("shm", c_int),
        ("shm_bytes", c_size_t),
        ("server_timeout_ms", c_int),
        ("admin_token", c_char_p),
        ("on_nonfinite", c_int),
        ("metrics_port", c_int),
        ("metrics_bind", c_char_p),
        ("failure_timeout_ms", c_int),
        ("num_workers_min", c_int),
    ]


class _RequestPrivate(Structure):
    """struct ps_request_private: libps's bookkeeping, never touched here."""
    _fields_ = [("pending", c_int), ("done", c_int), ("client", c_void_p)]


class RequestStruct(Structure):
    """ps_request: caller-allocated; its memory must not move or be freed
    while the request is pending (ps.Request keeps it alive)."""
    _fields_ = [
        ("status", c_int),
        ("version", c_int64),
        ("done_ns", c_int64),
        ("err", c_char * (ERR_TEXT_MAX + 1)),
        ("_priv", _RequestPrivate),
    ]


BARRIER_RANKS_MAX = 32


class BarrierInfo(Structure):
    """ps_barrier_info: whom the open barrier with the lowest id waits for."""
    _fields_ = [("id", c_int64), ("missing", c_uint32), ("nranks", c_uint32),
                ("ranks", ctypes.c_int32 * BARRIER_RANKS_MAX)]


class Stats(Structure):
    """ps_stats: one server's counters."""
    _fields_ = ([(f, c_uint64) for f in STATS_COUNTERS] +
                [("min_version", c_int64), ("max_version", c_int64)])


# ---- finding and loading the library ----

def _candidates():
    """Where libps.so may be, in the order tried."""
    env = os.environ.get("PS_LIBRARY")
    if env:
        return [env]  # asked for: that one or nothing
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.normpath(os.path.join(here, "..", "..", "lib", "libps.so"))]  # source tree
    try:
        from . import _installed  # written by make install
        out.append(os.path.join(_installed.LIBDIR, SONAME))
    except ImportError:
        pass
    found = ctypes.util.find_library("ps")
    if found:
        out.append(found)
    out.append(SONAME)
    return out


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (no such file)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        if not hasattr(lib, "ps_client_open"):
            tried.append(path + " (not libps: no ps_client_open)")
            continue
        return lib, path
    raise ImportError("ps: cannot load libps.so; tried: %s.  Build it with `make` in the source "
                      "tree, install it with `make install`, or point PS_LIBRARY at it"
                      % "; ".join(tried))


lib, path = _load()

_P = c_void_p  # opaque ps_client *, ps_exchange *, ps_backend *
_F = POINTER(c_float)
_R = POINTER(RequestStruct)


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


_proto("ps_strerror", c_char_p, c_int)
_proto("ps_log_init", None, c_char_p, c_int)
_proto("ps_log_set_level", None, c_int)
_proto("ps_client_options_default", None, POINTER(ClientOptions))
_proto("ps_client_open", c_int, POINTER(ClientOptions), POINTER(_P))
_proto("ps_client_register", c_int, _P, c_uint64, c_size_t)
_proto("ps_client_start", c_int, _P)
_proto("ps_client_last_error", c_char_p, _P)
_proto("ps_client_init", c_int, _P, c_uint64, c_void_p, _R)
_proto("ps_client_push", c_int, _P, c_uint64, c_void_p, c_int64, _R)
_proto("ps_client_pull", c_int, _P, c_uint64, c_void_p, c_int64, _R)
_proto("ps_client_pushpull", c_int, _P, c_uint64, c_void_p, c_void_p, c_int64, _R)
_U64P = POINTER(c_uint64)
_proto("ps_table_options_default", None, POINTER(TableOptions))
_proto("ps_client_register_table", c_int, _P, c_uint64, POINTER(TableOptions))
_proto("ps_client_sparse_pull", c_int, _P, c_uint64, c_void_p, c_size_t, c_void_p, c_int64, _R)
_proto("ps_client_sparse_push", c_int, _P, c_uint64, c_void_p, c_size_t, c_void_p, c_int64, _R)
_proto("ps_client_sparse_pushpull", c_int, _P, c_uint64, c_void_p, c_size_t, c_void_p, c_void_p,
       c_size_t, c_void_p, c_int64, _R)
_proto("ps_client_server_parts", c_int, _P, c_int)
_proto("ps_request_test", c_int, _R)
_proto("ps_request_wait", c_int, _R)
_proto("ps_client_barrier", c_int, _P, c_int64)
_proto("ps_client_stats", c_int, _P, c_int, POINTER(Stats))
_proto("ps_client_shutdown_servers", c_int, _P)
_proto("ps_client_num_servers", c_int, _P)
_proto("ps_client_chunk_elems", c_size_t, _P)
_proto("ps_client_close", None, _P)
_proto("ps_client_set_wire_dtype", c_int, _P, c_int)
_proto("ps_client_shm_region", None, _P, POINTER(c_void_p), POINTER(c_size_t))
_proto("ps_opt_parse", c_int, c_char_p, POINTER(c_int))
_proto("ps_client_setting", c_int, c_char_p, POINTER(c_char_p), POINTER(c_char_p))
_proto("ps_client_interrupt", None, _P)
_proto("ps_request_wait_for", c_int, _R, c_int)
_proto("ps_client_barrier_post", c_int, _P, c_int64, _R)
_proto("ps_client_barrier_info", c_int, _P, POINTER(BarrierInfo))
_proto("ps_client_hyper", c_int, _P, POINTER(OptConfig), c_int64, POINTER(OptConfig))
_proto("ps_client_table_hyper", c_int, _P, c_uint64, POINTER(OptConfig), c_int64,
       POINTER(OptConfig))
_proto("ps_client_name_table", c_int, _P, c_uint64, ctypes.c_char_p)
_proto("ps_client_sparse_assign", c_int, _P, c_uint64, c_void_p, c_size_t, c_void_p, _R)
_proto("ps_client_assign", c_int, _P, c_uint64, c_void_p, _R)
_proto("ps_client_state", c_int, _P, c_uint64, c_void_p, c_int, _R)
_proto("ps_client_set_state", c_int, _P, c_uint64, c_void_p, c_int, c_int64, _R)
_proto("ps_client_clock", c_int, _P, c_uint64, _R)
_proto("ps_client_allreduce", c_int, _P, c_int64, c_void_p, c_void_p, c_size_t, _R)
_proto("ps_client_broadcast", c_int, _P, c_int64, c_void_p, c_void_p, c_size_t, _R)
_proto("ps_client_leave", c_int, _P)
_proto("ps_client_lookup", c_int, _P, c_size_t, c_void_p, c_void_p, c_void_p, c_void_p, _R)
_proto("ps_client_export", c_int, _P, c_char_p, c_int, c_int64, c_void_p, c_void_p, c_size_t,
       c_int)
_proto("ps_client_leave_post", c_int, _P, c_int, _R)
_proto("ps_client_join", c_int, _P, POINTER(c_int64))
_proto("ps_exchange_set_elastic", None, _P)
_proto("ps_client_members", c_int, _P, POINTER(c_int), POINTER(c_int), POINTER(c_int64))

# include/ps_client.h: a reader's rank, and ps_client_export's flag
RANK_READER = -1
EXPORT_STATE = 1

_proto("ps_backend_host_create", c_int, POINTER(_P))
_proto("ps_backend_host_destroy", None, _P)
_proto("ps_exchange_adopt", c_int, _P, POINTER(ClientOptions), _P, POINTER(_P))
_proto("ps_exchange_set_init", None, _P, c_int)
_proto("ps_exchange_add", c_int, _P, c_uint64, c_size_t, c_void_p, c_void_p, c_int)
_proto("ps_exchange_start", c_int, _P)
_proto("ps_exchange_num_tensors", c_int, _P)
_proto("ps_exchange_weights", c_void_p, _P, c_int)
_proto("ps_exchange_grad", c_void_p, _P, c_int)
_proto("ps_exchange_before_use", c_int, _P, c_int)
_proto("ps_exchange_grad_ready", c_int, _P, c_int, c_int64)
_proto("ps_exchange_finish", c_int, _P)
_proto("ps_exchange_pull_final", c_int, _P)
_proto("ps_exchange_take_wait_ns", c_int64, _P)
_proto("ps_exchange_step_done", None, _P, c_uint64)
_proto("ps_client_metrics_url", c_char_p, _P)
_proto("ps_exchange_close", None, _P)
_proto("ps_exchange_set_wait_timeout", None, _P, c_int)
_proto("ps_exchange_set_back", c_int, _P, c_int, c_void_p)
_proto("ps_exchange_interrupt", None, _P)

def setting(name):
    """A worker's run setting from libps's table (ps_client_setting), by its
    ps_worker flag without "--" ("mode", "num-workers"): (the environment
    variables that carry it, first set wins; its default as the flag's text,
    or None)."""
    env, default = c_char_p(), c_char_p()
    if lib.ps_client_setting(name.encode(), ctypes.byref(env), ctypes.byref(default)):
        raise KeyError("libps has no worker setting %r" % (name,))
    return (tuple(env.value.decode().split()) if env.value else (),
            default.value.decode() if default.value is not None else None)


def strerror(code):
    return lib.ps_strerror(code).decode()


def last_error(handle):
    s = lib.ps_client_last_error(handle)
    return s.decode(errors="replace") if s else ""
