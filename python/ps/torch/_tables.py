"""Embedding tables on the servers: parameters whose rows the worker never
holds, read through F.embedding / F.embedding_bag (and, for 1-D weight
vectors, gather / index_select / indexing).

Which parameters (choose()): every nn.Embedding / nn.EmbeddingBag with
sparse=True, of at least table_min_bytes, or on the meta device; the
parameters a module's forward passes to F.embedding / F.embedding_bag itself
(found in its source: DLRM's QREmbeddingBag's weight_q and weight_r, custom
modules) when the module says sparse=True or is that large; or tables= by
module or parameter name.  Each becomes a TableWeight in its module: a
torch.nn.Parameter on the meta device of the same shape (no memory) whose
__torch_function__ sends those calls to the table, so the module's own
forward runs unchanged.  It is a parameter group of the wrapped optimizer of
its own (key "ps_table"), with the hyper-parameters of the group it was in:
schedulers and param_groups edits reach the servers (a HYPER of its key
before the next step's pushes).

The table's optimizer follows the user's (follow()): SGD, Adagrad,
SparseAdam (lazy Adam) and RowWiseAdagrad-like optimizers run on the servers
as torch runs them on an embedding; anything else is refused at wrap time
with the way out (table_optimizer= names the servers' optimizer instead).

Its first rows: a materialised module's own (sent by rank 0 at start in
chunks, SASSIGN, exactly; a weight of zeros is declared init="zeros"
instead), or the declared initializer for one on the meta device
(options init/scale/seed; normal(0, 1) as nn.Embedding's by default).  The
worker's copy of the weight is dropped from the model and the optimizer.

Per step and table (_Table): one batch of ids, deduplicated by the exchange,
its rows fetched (while the previous batch computes when they were handed
ahead: prefetch(), or at the start of the model's forward once the table's
ids were seen to be one of the forward's arguments), a small leaf tensor that
requires grad; torch's own F.embedding_bag / F.embedding runs on it with the
ids remapped, so every mode and option is torch's.  The step pushes one
gradient row per distinct id (every table every step).  A training forward
(grad on, model.train()) takes the table's batch: the handed one when its ids
are the forward's, else its own.  Any other forward is a plain lookup at this
worker's clock: evaluation (grad on or off, model.eval()), a forward whose
ids are not the handed batch's; in training one whose leaf gets a gradient
(a second micro-batch: backward_passes_per_step, no_sync, two backward()
calls before step()) adds its rows' gradients to the step's push, summed in
the order of the forwards, as torch accumulates .grad.

Ids are checked against num_embeddings (IndexError, as torch) unless the
table says hashed_ids: any int64 then (the same 64 bits as the servers'
uint64), a row made at its first pull.
"""

import ctypes
import inspect
import ast
import sys
import textwrap
import threading
import zlib
from ctypes import POINTER, Structure, c_float, c_int, c_int32, c_int64, c_size_t, c_uint64, \
    c_void_p

import numpy as np
import torch
import torch.nn.functional as F

from .. import _lib
from ..client import PSError, table_options
from .._lib import lib


class _Rows(Structure):
    """ps_exchange_rows."""
    _fields_ = [("nentries", c_size_t), ("nunique", c_size_t), ("dim", c_size_t),
                ("ids", POINTER(c_uint64)), ("index", POINTER(c_int32)),
                ("rows", POINTER(c_float)), ("grads", POINTER(c_float)), ("version", c_int64)]


_lib._proto("ps_exchange_add_table", c_int, c_void_p, c_uint64, POINTER(_lib.TableOptions),
            c_size_t, c_int)
_lib._proto("ps_exchange_table_sorted", c_int, c_void_p, c_int, c_int)
_lib._proto("ps_exchange_name_table", c_int, c_void_p, c_int, ctypes.c_char_p)
_lib._proto("ps_exchange_table_next", c_int, c_void_p, c_int, c_void_p, c_size_t, c_size_t)
_lib._proto("ps_exchange_table_rows", c_int, c_void_p, c_int, POINTER(_Rows))
_lib._proto("ps_exchange_table_extend", c_int, c_void_p, c_int, c_void_p, c_size_t)
_lib._proto("ps_exchange_table_push", c_int, c_void_p, c_int, c_int64)
_lib._proto("ps_exchange_table_lookup", c_int, c_void_p, c_int, c_void_p, c_size_t, c_void_p)

# an embedding of at least this many bytes goes to the servers by default
# (sparse=True ones and meta ones whatever their size)
MIN_BYTES = 64 << 20
# the ids one batch of a table may hold (the exchange's buffers: 4 x this x
# dim floats per table, whatever the row count)
MAX_IDS = 1 << 16
# a materialised module's rows sent to the servers at start, at most (per
# table): past it the wrapper refuses (build it on device="meta" with a
# declared initializer, or raise table_init_max_bytes)
INIT_MAX_BYTES = 4 << 30
# bytes of rows per assign request, and requests in flight at once: what
# libps copies of them (about 3 x) is freed to a malloc arena that keeps it
_ASSIGN_BYTES = 1 << 20
_ASSIGN_INFLIGHT = 4
# a table's name on the wire at most (PS_TABLE_NAME_MAX): a longer one's end is sent
_NAME_MAX = 63
# the wrapper's barrier after the tables' first rows are written (2^61 and up:
# ps.Client.barrier)
_ROWS_BARRIER = (1 << 61) + 2
# the servers' table optimizer of DistributedOptimizer(model) (no torch
# optimizer): sparse Adagrad, torch's Adagrad defaults
DEFAULT_OPTIMIZER = {"optimizer": "adagrad", "lr": 0.01, "eps": 1e-10}
ROWS_NOTE = ("rows live on the servers: ps.torch.export writes them, ps_server "
             "--checkpoint-dir keeps them (with their optimizer state); this state_dict holds "
             "the table's declaration only")
# the names a table optimizer goes by
_KINDS = {"rowwise-adagrad": "rowwise_adagrad", "rwsadagrad": "rowwise_adagrad",
          "exact_rowwise_adagrad": "rowwise_adagrad", "sparse_adam": "adam",
          "sparseadam": "adam", "lazy_adam": "adam"}
# torch optimizers whose update on a row is row-wise Adagrad's
ROWWISE_CLASSES = ("RowWiseAdagrad", "RWSAdagrad", "RowWiseSparseAdagrad")
# the servers' hyper-parameters each table kind takes (as HYPER names them)
_HYPER = {"sgd": ("lr", "weight_decay"), "momentum": ("lr", "momentum", "weight_decay"),
          "nesterov": ("lr", "momentum", "weight_decay"),
          "adagrad": ("lr", "eps", "weight_decay"),
          "rowwise_adagrad": ("lr", "eps", "weight_decay"),
          "adam": ("lr", "beta1", "beta2", "eps", "weight_decay"), "ftrl": ("lr", "weight_decay")}
WAY_OUT = ("make it a server table: DistributedOptimizer(..., tables=[its module or parameter "
           "name]) or table_min_bytes= below its size, or give it sparse=False")


def table_key(index, name, dim):
    """Table `index`'s key: the top bit set (apart from param_key's tensor
    keys), its position, a CRC of its name and row width."""
    return (1 << 63) | (index << 32) | zlib.crc32(("%s:%d" % (name, dim)).encode())


# ---- the tables' optimizer ----

def _f32(v):
    return float(np.float32(v))


def optimizer_settings(opt):
    """The servers' table optimizer for table_optimizer= (the explicit
    choice): 'adagrad' | 'adam' | 'sgd' | 'rowwise_adagrad' | ... (their
    defaults but torch's lr), a dict {'optimizer': 'adam', 'lr': ..}, or a
    torch optimizer (its settings as follow() maps them)."""
    if opt is None:
        return dict(DEFAULT_OPTIMIZER)
    if isinstance(opt, str):
        kind = _KINDS.get(opt.lower(), opt.lower())
        if kind in ("adagrad", "rowwise_adagrad"):
            return {"optimizer": kind, "lr": 0.01, "eps": 1e-10}
        return {"optimizer": kind, "lr": 0.01}
    if isinstance(opt, dict):
        out = dict(opt)
        if isinstance(out.get("optimizer"), str):
            out["optimizer"] = _KINDS.get(out["optimizer"].lower(), out["optimizer"].lower())
        return out
    if isinstance(opt, torch.optim.Optimizer):
        g = opt.param_groups[0] if opt.param_groups else opt.defaults
        return follow(type(opt).__name__, g, lazy_ok=True)
    raise TypeError("table optimizer: a name ('adagrad', 'adam', 'sgd', 'rowwise_adagrad'), a "
                    "dict or a torch optimizer, got %s" % type(opt).__name__)


def follow(cls, g, lazy_ok=False):
    """The servers' table optimizer that updates an embedding's rows as
    torch optimizer class `cls` with parameter group g does (lazy_ok: also
    Adam, momentum and weight decay, which the servers apply to the rows
    touched only); ValueError saying why and what to do when none does."""
    def refuse(what, lazy):
        raise ValueError(
            "%s with %s cannot train a server table as it trains an embedding here: %s; give "
            "the tables their own optimizer on the servers with DistributedOptimizer(..., "
            "table_optimizer=%s) (docs/TORCH.md \"Embedding tables\")" % (cls, what, lazy,
                                                                          _suggest(cls)))
    lazy = "the servers update only the rows a step touched"
    if g.get("maximize"):
        refuse("maximize=True", "the servers minimize")
    wd = float(g.get("weight_decay") or 0.0)
    if wd and not lazy_ok and cls not in ROWWISE_CLASSES + ("SparseAdam",):
        refuse("weight_decay=%r" % wd, "torch decays every row every step, " + lazy)
    out = {"lr": float(g["lr"]), "weight_decay": wd}
    if cls == "SGD":
        if g.get("dampening"):
            refuse("dampening=%r" % g["dampening"], "the servers' momentum has no dampening")
        mom = float(g.get("momentum") or 0.0)
        if mom and not lazy_ok:
            refuse("momentum=%r" % mom, "torch's momentum moves every row every step, " + lazy)
        out["optimizer"] = "sgd" if not mom else "nesterov" if g.get("nesterov") else "momentum"
        if mom:
            out["momentum"] = mom
    elif cls == "Adagrad" or cls in ROWWISE_CLASSES:
        if g.get("lr_decay"):
            refuse("lr_decay=%r" % g["lr_decay"], "the servers decay the rate otherwise")
        if g.get("initial_accumulator_value"):
            refuse("initial_accumulator_value=%r" % g["initial_accumulator_value"],
                   "the servers' sums start at 0")
        out.update(optimizer="adagrad" if cls == "Adagrad" else "rowwise_adagrad",
                   eps=float(g["eps"]))
    elif cls == "SparseAdam" or (cls in ("Adam", "AdamW") and lazy_ok):
        if g.get("amsgrad"):
            refuse("amsgrad=True", "the servers' Adam has none")
        if cls == "AdamW" and wd:
            refuse("weight_decay=%r" % wd, "AdamW's decay is decoupled")
        b1, b2 = g["betas"]
        out.update(optimizer="adam", beta1=float(b1), beta2=float(b2), eps=float(g["eps"]))
    elif cls in ("Adam", "AdamW"):
        refuse("its moments", "torch's Adam moves every row every step (its moments decay), "
               "the servers' tables run lazy Adam, SparseAdam's rule: use torch.optim.SparseAdam "
               "for the embeddings")
    elif cls == "ServersOptimizer":  # DistributedOptimizer(model): no torch optimizer
        return dict(DEFAULT_OPTIMIZER)
    else:
        raise ValueError("%s has no equivalent for the server tables (they run SGD, Adagrad, "
                         "SparseAdam's lazy Adam and row-wise Adagrad, ps.torch.RowWiseAdagrad): "
                         "give them one with DistributedOptimizer(..., table_optimizer="
                         "'adagrad' or a dict {'optimizer': ..., 'lr': ...})" % cls)
    return out


def _suggest(cls):
    return {"Adam": "'adam'", "AdamW": "'adam'", "SGD": "{'optimizer': 'momentum', ...}"}.get(
        cls, "'adagrad'")


def _group_keys(settings):
    """A table's parameter group's hyper-parameters, named as torch's."""
    g = {"lr": settings.get("lr", 0.01)}
    for k in ("eps", "weight_decay", "momentum"):
        if k in settings:
            g[k] = settings[k]
    if "beta1" in settings or "beta2" in settings:
        g["betas"] = (settings.get("beta1", 0.9), settings.get("beta2", 0.999))
    return g


def _hyper_of_group(kind, group):
    """The servers' names and float32 values of what a table kind takes, from
    its parameter group."""
    out = {}
    for k in _HYPER.get(kind, ("lr",)):
        if k in ("beta1", "beta2"):
            b = group.get("betas")
            if b is not None:
                out[k] = _f32(b[0] if k == "beta1" else b[1])
        elif group.get(k) is not None:
            out[k] = _f32(group[k])
    return out


# ---- the table's weight in the model ----

class TableWeight(torch.nn.Parameter):
    """A server table's weight in its module: a parameter on the meta device
    with the weight's shape (no memory).  F.embedding, F.embedding_bag,
    gather, index_select and indexing by an id tensor read the table's rows;
    anything that needs the values is refused naming the table."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _ROUTES.get(func)
        if route is not None:
            t = _table_arg(func, args, kwargs)
            if t is not None:
                return route(t, args, kwargs)
        name = getattr(func, "__name__", "")
        if name in _PASS:
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        if name in _SELF:  # no device, no dtype to change: the rows are on the servers
            return args[0]
        if name == "copy_" and isinstance(args[0], TableWeight):
            if args[1].device.type == "meta":  # a state_dict of a wrapped model: nothing
                return args[0]
            raise RuntimeError(
                "table %r: its rows live on the servers and cannot be written here; load "
                "the weights into the model before wrapping it (its rows are then what the "
                "servers start from)" % args[0].table.name)
        t = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, TableWeight)),
                 None)
        raise RuntimeError("table %r: %s needs the rows, which live on the servers; only "
                           "F.embedding, F.embedding_bag, gather, index_select and indexing "
                           "by ids reach them" % (t.table.name if t is not None else "?", name))

    @property
    def table(self):
        return self.__dict__["_ps_table"]

    def __deepcopy__(self, memo):  # a copy of the model uses the same table
        return self

    def __reduce_ex__(self, proto):  # pickled: a plain meta parameter of the shape
        return (torch.nn.Parameter, (torch.empty(tuple(self.shape), device="meta"),
                                     self.requires_grad))

    def __repr__(self):
        return "TableWeight(%s, on the servers: table %r)" % (
            "x".join(str(d) for d in self.shape), self.table.name)


_PASS = {"__get__", "__set__", "size", "dim", "numel", "nelement", "__len__", "stride",
         "element_size", "is_contiguous", "detach", "requires_grad_", "__format__",
         "__hash__", "__reduce_ex__", "__setstate__", "__getstate__"}
_SELF = {"to", "cuda", "cpu", "float", "share_memory_", "pin_memory", "contiguous"}


def _table_arg(func, args, kwargs):
    """The TableWeight a routed call reads (the weight of F.embedding*, the
    tensor indexed otherwise), or None."""
    if func in (F.embedding, F.embedding_bag):
        w = args[1] if len(args) > 1 else kwargs.get("weight")
    else:
        w = args[0] if args else kwargs.get("input")
    return w.table if isinstance(w, TableWeight) else None


def _bound(func, args, kwargs):
    """The call's arguments by name, defaults filled (a signature's bind,
    without its cost: this is on every forward)."""
    names, defaults = _PARAMS[func]
    if len(args) > len(names) or any(k not in defaults and k not in names for k in kwargs):
        _SIGS[func].bind(*args, **kwargs)  # raises torch's TypeError
    a = dict(defaults)
    a.update(zip(names, args))
    a.update(kwargs)
    return a


def _no_max_norm(t, max_norm):
    if max_norm is not None:
        raise ValueError("table %r: max_norm renormalizes rows in place on the worker; a server "
                         "table's rows cannot be: leave it None" % t.name)


def _embedding(t, args, kwargs):
    a = _bound(F.embedding, args, kwargs)
    _no_max_norm(t, a["max_norm"])
    inp = a["input"]
    index, rows, pad = t.rows_for(inp, _pad(t, a["padding_idx"]))
    return F.embedding(index.view(inp.shape), rows, pad, None, a["norm_type"],
                       a["scale_grad_by_freq"])


def _embedding_bag(t, args, kwargs):
    a = _bound(F.embedding_bag, args, kwargs)
    _no_max_norm(t, a["max_norm"])
    inp = a["input"]
    index, rows, pad = t.rows_for(inp, _pad(t, a["padding_idx"]))
    return F.embedding_bag(index.view(inp.shape), rows, a["offsets"], None, a["norm_type"],
                           a["scale_grad_by_freq"], a["mode"], False, a["per_sample_weights"],
                           a["include_last_offset"], pad)


def _values(t, ids):
    """A 1-wide table's values at ids (any shape), or a table's rows."""
    index, rows, _ = t.rows_for(ids, None)
    out = F.embedding(index.view(ids.shape), rows)
    return out.squeeze(-1) if len(t.shape) == 1 else out


def _gather(t, args, kwargs):
    if len(t.shape) != 1:
        raise RuntimeError("table %r: gather reads a 1-D table (a weight vector); this one is "
                           "%s" % (t.name, "x".join(map(str, t.shape))))
    a = _bound(torch.gather, args, kwargs)
    if a["dim"] not in (0, -1):
        raise RuntimeError("table %r: gather along dim 0 only" % t.name)
    return _values(t, a["index"])


def _index_select(t, args, kwargs):
    a = _bound(torch.index_select, args, kwargs)
    if a["dim"] != 0:
        raise RuntimeError("table %r: index_select along dim 0 only" % t.name)
    return _values(t, a["index"])


def _getitem(t, args, kwargs):
    ids = args[1]
    if not torch.is_tensor(ids) or ids.dtype not in (torch.int64, torch.int32):
        raise RuntimeError("table %r: indexed by an id tensor only (its rows are on the "
                           "servers), got %r" % (t.name, type(ids).__name__))
    return _values(t, ids)


def _pad(t, padding_idx):
    if padding_idx is not None and padding_idx < 0:
        padding_idx += t.shape[0]
    return padding_idx


_ROUTES = {F.embedding: _embedding, F.embedding_bag: _embedding_bag,
           torch.gather: _gather, torch.Tensor.gather: _gather,
           torch.index_select: _index_select, torch.Tensor.index_select: _index_select,
           torch.Tensor.__getitem__: _getitem}
_SIGS = {F.embedding: inspect.signature(F.embedding),
         F.embedding_bag: inspect.signature(F.embedding_bag),
         torch.gather: inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                          for n in ("input", "dim", "index")] +
                                         [inspect.Parameter("sparse_grad",
                                                            inspect.Parameter.KEYWORD_ONLY,
                                                            default=False)]),
         torch.index_select: inspect.Signature([inspect.Parameter(
             n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("input", "dim", "index")])}
_SIGS[torch.Tensor.gather] = _SIGS[torch.gather]
_SIGS[torch.Tensor.index_select] = _SIGS[torch.index_select]
# per routed function: its parameters' names, and the defaults
_PARAMS = {f: ([n for n, q in sig.parameters.items() if q.kind != q.KEYWORD_ONLY],
               {n: q.default for n, q in sig.parameters.items() if q.default is not q.empty})
           for f, sig in _SIGS.items()}


# ---- one table's batches ----

class _Table:
    """One table: its declaration, its batches in the exchange (see the
    module's text), its first rows."""

    def __init__(self, name, kind, shape, key, options, max_ids, hashed, root, mode="mean",
                 padding_idx=None):
        self.name, self.kind, self.shape, self.key = name, kind, tuple(shape), key
        self.dim = shape[1] if len(shape) == 2 else 1
        self.num = None if hashed else shape[0]
        self.options = options          # table_options' keyword arguments
        self.max_ids = max_ids
        self.root = root                # the wrapped model: its training flag
        self.mode, self.padding_idx = mode, padding_idx
        self.init_rows = None           # a materialised weight to send at start
        self.ex = None                  # the Exchange, once added
        self.index = -1
        self.handed = []                # ids (int64 CPU tensors) handed, not pushed
        self.auto = False               # the first handed one came from the forward's args
        self.path = None                # where in the model's arguments its ids are (_path_of)
        self.taken = None               # (ids, index, rows leaf, padding row, rows) of this step
        self.extras = []                # (unique ids, leaf) of other training forwards
        self.step = 0                   # the step of the next push
        self.told = False
        self.known = {}                 # its hyper-parameters as the servers run them
        self._views = {}                # the exchange's buffers as numpy (_view)

    def __deepcopy__(self, memo):
        return self

    def declaration(self):
        return {"key": self.key, "kind": self.kind, "num_embeddings": self.shape[0],
                "embedding_dim": self.dim, "shape": list(self.shape), "mode": self.mode,
                "padding_idx": self.padding_idx, "hashed_ids": self.num is None,
                "options": dict(self.options), "rows": ROWS_NOTE}

    def add(self, ex, index):
        """Declare the table in the exchange (before its start), named."""
        o = table_options(self.dim, **self.options)
        rc = lib.ps_exchange_add_table(ex._x, self.key, ctypes.byref(o), self.max_ids, -1)
        if rc == 0:  # its ids in torch's order (_take)
            rc = lib.ps_exchange_table_sorted(ex._x, index, 1)
        if rc == 0:
            rc = lib.ps_exchange_name_table(ex._x, index, self.name[-_NAME_MAX:].encode())
        if rc:
            raise PSError(rc, _lib.last_error(ex.client._ptr), "table %r" % self.name)
        ex.client._tables[self.key] = self.dim  # for the client's own requests (assign)
        self.ex, self.index = ex, index

    def _x(self, what):
        x = self.ex._x if self.ex is not None else None
        if x is None:
            raise PSError(_lib.ERRORS.index("ECLOSED"), "the exchange is closed",
                          "table %r: %s" % (self.name, what))
        return x

    def _check(self, rc, what):
        if rc:
            raise PSError(rc, _lib.last_error(self.ex.client._ptr),
                          "table %r: %s" % (self.name, what))

    # ---- batches ----

    def hand(self, ids, auto=False):
        """The ids of the next batch (after those handed already)."""
        x = self._x("prefetch")
        ids = _flat_ids(ids)
        if len(self.handed) >= 2:
            raise RuntimeError("table %r: two batches are handed already (this step's and the "
                               "next); prefetch once per step, the batch after the one in use"
                               % self.name)
        if ids.numel() > self.max_ids:
            raise ValueError("table %r: a batch of %d ids, more than its max_ids %d: pass "
                             "table_max_ids= to the wrapper" % (self.name, ids.numel(),
                                                               self.max_ids))
        self.check_range(ids)
        self._check(lib.ps_exchange_table_next(x, self.index, ids.data_ptr(), ids.numel(), 1),
                    "ids of the next batch")
        if not self.handed:
            self.auto = auto
        self.handed.append(ids)

    def check_range(self, ids):
        """IndexError, as torch's, for an id outside [0, num_embeddings)."""
        if self.num is None or not ids.numel():
            return
        lo, hi = torch.aminmax(ids)
        if int(lo) < 0 or int(hi) >= self.num:
            bad = ids[(ids < 0) | (ids >= self.num)][0]
            raise IndexError("index out of range in self: table %r has %d rows, got id %d "
                             "(hashed ids: tables={%r: {'hashed_ids': True}} or "
                             "table_hashed_ids=True)" % (self.name, self.num, int(bad),
                                                         self.name))

    def _rows(self):
        r = _Rows()
        self._check(lib.ps_exchange_table_rows(self._x("rows"), self.index, ctypes.byref(r)),
                    "rows of step %d" % self.step)
        return r

    def rows_for(self, inp, padding_idx):
        """(index into the rows, rows, the padding id's row or None) for a
        forward whose ids are inp (see the module's text for which rows)."""
        ids = _flat_ids(inp)
        device = inp.device if torch.is_tensor(inp) else torch.device("cpu")
        train = torch.is_grad_enabled() and (self.root is None or self.root.training)
        if train:  # the handed ids were checked (hand)
            if self.taken is None:
                if not self.handed:
                    self.path = _path_of(self.ex, inp) if self.path is None else self.path
                    self.hand(ids)
                    return self._take(ids, padding_idx, device)
                if torch.equal(self.handed[0], ids):
                    return self._take(ids, padding_idx, device)
                self._not_handed()
            elif torch.equal(self.taken[0], ids):
                return self.taken[1:4]
        self.check_range(ids)
        return self._lookup(ids, padding_idx, device, train)

    def _not_handed(self):
        if self.auto:  # its ids were not where the last forward had them
            self.path = None
        elif not self.told:
            self.told = True
            sys.stderr.write("ps.torch[%d]: table %r: a training forward's ids are not those "
                             "handed by prefetch(); its rows were looked up (a round trip), "
                             "and the handed batch goes unused this step\n"
                             % (self.ex.client.rank, self.name))

    def _take(self, ids, padding_idx, device):
        """The batch's rows as a leaf.  The exchange gives the distinct ids
        in ascending order (ps_exchange_table_sorted): torch's backward sums
        a row's entries in the order its sort of the indices gives, the same
        for any indices in the same order as the ids, so the leaf's gradient
        rows are bitwise the plain weight's."""
        r = self._rows()
        n, u = r.nentries, r.nunique
        index = torch.from_numpy(self._view(r.index, np.int32)[:n].astype(np.int64))
        rows = torch.from_numpy(self._view(r.rows, np.float32, self.dim)[:u].copy())
        pad = None
        if padding_idx is not None:
            pad = self._pad(self._view(r.ids, np.int64)[:u], padding_idx, rows)
        leaf = rows.to(device).requires_grad_(True)
        index = index.to(device)
        self.taken = (ids, index, leaf, pad, r)
        return index, leaf, pad

    def _view(self, ptr, dtype, dim=None):
        """The exchange's buffer at ptr (ids, index, rows or gradients of
        max_ids entries: they are fixed for the table's life) as numpy."""
        addr = ctypes.cast(ptr, c_void_p).value
        v = self._views.get((addr, dim))
        if v is None:
            n = self.max_ids * (dim or 1)
            v = np.ctypeslib.as_array((ctypes.c_char * (n * np.dtype(dtype).itemsize))
                                      .from_address(addr)).view(dtype)
            v = v.reshape(self.max_ids, dim) if dim else v
            self._views[(addr, dim)] = v
        return v

    @staticmethod
    def _pad(uniq, padding_idx, rows):
        """torch's padding row: zeros here (the servers' row gets zero
        gradients); its position, or None."""
        at = np.nonzero(uniq == padding_idx)[0]
        if not len(at):
            return None
        rows[int(at[0])] = 0
        return int(at[0])

    def _lookup(self, ids, padding_idx, device, grad):
        """(index, rows, padding row) outside the batches; grad: a leaf whose
        gradient joins the step's push."""
        uniq, inv = torch.unique(ids, return_inverse=True)
        rows = self.lookup(uniq)
        index, rows, pad = _stage(inv, rows, uniq.numpy(), padding_idx, device)
        if grad:
            rows.requires_grad_(True)
            self.extras.append((uniq, rows))
        return index, rows, pad

    def lookup(self, ids):
        """The rows of ids (int64, any shape) at this worker's clock, blocking:
        a (n, dim) float32 tensor."""
        ids = _flat_ids(ids)
        rows = torch.empty(ids.numel(), self.dim)
        if ids.numel():
            self._check(lib.ps_exchange_table_lookup(self._x("lookup"), self.index,
                                                     ids.data_ptr(), ids.numel(),
                                                     rows.data_ptr()), "lookup")
        return rows

    def push(self):
        """The step's gradient rows (every table, every step): the batch's,
        and those of the other training forwards, summed in their order."""
        if self.taken is None:  # no forward took it: the handed batch, or none, unchanged
            if not self.handed:
                self.hand(torch.zeros(0, dtype=torch.int64))
            r = self._rows()
            if r.nunique:
                ctypes.memset(r.grads, 0, r.nunique * self.dim * 4)
        else:
            _, _, leaf, _, r = self.taken
            if r.nunique:
                dst = torch.from_numpy(self._view(r.grads, np.float32, self.dim)[:r.nunique])
                g = leaf.grad
                if g is None:
                    dst.zero_()
                else:
                    dst.copy_(g.detach())
        if self.extras:
            self._add_extras(r)
        self._check(lib.ps_exchange_table_push(self._x("push"), self.index, self.step),
                    "push of step %d" % self.step)
        self.step += 1
        self.handed.pop(0)
        self.auto = bool(self.handed) and self.auto
        self.taken = None
        self.extras = []

    def _add_extras(self, r):
        """Other training forwards' gradient rows into the batch's: added to
        its rows of the same ids, the others appended to the batch."""
        x = self._x("push")
        base = np.ctypeslib.as_array(r.ids, (r.nunique,)).view(np.int64).copy() \
            if r.nunique else np.zeros(0, np.int64)
        for uniq, leaf in self.extras:
            if leaf.grad is None:
                continue
            e = uniq.numpy()
            g = leaf.grad.detach().to("cpu").numpy()
            order = np.argsort(base, kind="stable")
            at = np.searchsorted(base[order], e)
            found = at < len(base)
            found[found] = base[order][at[found]] == e[found]
            new = e[~found]
            if new.size:
                if len(base) + new.size > self.max_ids:
                    raise ValueError("table %r: the step's forwards use %d distinct ids, more "
                                     "than its max_ids %d: pass table_max_ids= to the wrapper"
                                     % (self.name, len(base) + new.size, self.max_ids))
                new = np.ascontiguousarray(new)
                self._check(lib.ps_exchange_table_extend(x, self.index, new.ctypes.data,
                                                         new.size), "accumulated ids")
            n0 = len(base)
            base = np.concatenate([base, new])
            dst = np.ctypeslib.as_array(r.grads, (len(base), self.dim))
            if found.any():
                pos = order[at[found]]
                dst[pos] += g[found]
            dst[n0:] = g[~found]

    # ---- first rows ----

    def send_rows(self):
        """The materialised weight's rows to the servers (rank 0, before any
        step), in chunks; then the worker's copy goes."""
        w, self.init_rows = self.init_rows, None
        if w is None:
            return
        w = w.detach().to("cpu", torch.float32).reshape(w.shape[0], -1)
        client = self.ex.client
        reqs = []
        step = max(1, _ASSIGN_BYTES // (4 * self.dim))
        for lo in range(0, w.shape[0], step):
            hi = min(lo + step, w.shape[0])
            ids = np.arange(lo, hi, dtype=np.uint64)
            reqs.append(client.sparse_assign(self.key, ids, w[lo:hi].contiguous().numpy()))
            if len(reqs) >= _ASSIGN_INFLIGHT:
                reqs.pop(0).wait()
        for r in reqs:
            r.wait()


def _stage(index, rows, uniq, padding_idx, device):
    """The rows on the model's device, torch's padding row zeroed and its
    position (_pad)."""
    pad = None if padding_idx is None else _Table._pad(uniq, padding_idx, rows)
    return index.to(device), rows.to(device), pad


def _flat_ids(ids):
    """A contiguous int64 CPU tensor of the ids (any integer tensor, array
    or sequence)."""
    if not torch.is_tensor(ids):
        ids = torch.as_tensor(np.asarray(ids).astype(np.int64, copy=False))
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise TypeError("embedding ids must be integers, got %s" % ids.dtype)
    return ids.detach().to("cpu", torch.int64).reshape(-1).contiguous()


# ---- where a table's ids come from: the model's arguments ----

def _tensors_of(obj, path=(), out=None, depth=0):
    """(path, tensor) of every tensor in the arguments (lists, tuples and
    dicts looked into)."""
    out = [] if out is None else out
    if torch.is_tensor(obj):
        out.append((path, obj))
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for i, o in enumerate(obj):
            _tensors_of(o, path + (i,), out, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for k, o in obj.items():
            _tensors_of(o, path + (k,), out, depth + 1)
    return out


def _path_of(ex, inp):
    """Where the forward's argument the ids inp are, or are a view of (a
    slice ids[:, f:f+1], a column): (path in the arguments, None or the view
    as (offset, size, stride, the argument's size and stride)); None."""
    if not torch.is_tensor(inp):
        return None
    for path, t in getattr(ex, "_table_args", ()):
        if t is inp:
            return (path, None)
    if inp._base is None:
        return None
    for path, t in getattr(ex, "_table_args", ()):
        if t.dtype == inp.dtype and t.device == inp.device and \
                t.storage().data_ptr() == inp.storage().data_ptr():
            return (path, (inp.storage_offset() - t.storage_offset(), tuple(inp.shape),
                           tuple(inp.stride()), tuple(t.shape), tuple(t.stride())))
    return None


def _at(args, where):
    """The ids at `where` (_path_of) in this forward's arguments, or None
    when they are not there (another structure, another shape)."""
    path, view = where
    for k in path:
        try:
            args = args[k]
        except (IndexError, KeyError, TypeError):
            return None
    if not torch.is_tensor(args):
        return None
    if view is None:
        return args
    off, size, stride, shape, astride = view
    if tuple(args.shape) != shape or tuple(args.stride()) != astride:
        return None
    return args.as_strided(size, stride, args.storage_offset() + off)


def attach(ex, model):
    """The model's forward pre-hook that hands every table whose ids are one
    of the forward's arguments at once (their rows in one round trip), in a
    training forward that has not taken its batches yet."""
    from ._exchange import _Hook

    def pre(m, args):
        ex._table_args = _tensors_of(args)
        if not (torch.is_grad_enabled() and m.training):
            return
        for t in ex.tables:
            if t.path is None or t.handed or t.taken is not None:
                continue
            ids = _at(args, t.path)
            if ids is None:
                t.path = None
                continue
            try:
                t.hand(ids, auto=True)
            except (IndexError, ValueError):
                t.path = None  # the forward itself says what is wrong

    def post(m, args, out):
        ex._table_args = ()

    ex._hooks.append(model.register_forward_pre_hook(_Hook(pre)))
    ex._hooks.append(model.register_forward_hook(_Hook(post)))


# ---- which parameters ----

_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


# Python 3.11's ast keeps its recursion depth per interpreter, not per
# thread: two threads parsing at once fail with "AST constructor recursion
# depth mismatch" (CPython gh-106905; workers as threads of one process wrap
# at the same time).  One parse at a time, once per forward.
_AST_LOCK = threading.Lock()
_AST_TREES = {}


def _forward_tree(fn):
    """The parsed source of a forward function, or None (no source)."""
    with _AST_LOCK:
        if fn not in _AST_TREES:
            try:
                _AST_TREES[fn] = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            except (OSError, TypeError, SyntaxError):
                _AST_TREES[fn] = None
        return _AST_TREES[fn]


def _forward_params(m):
    """The parameters of module m (not an nn.Embedding) that its forward
    passes to F.embedding / F.embedding_bag itself (self.NAME as the weight
    argument, found in the forward's source)."""
    tree = _forward_tree(type(m).forward)
    if tree is None:
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
            else None
        if fname not in ("embedding", "embedding_bag"):
            continue
        w = node.args[1] if len(node.args) > 1 else next(
            (k.value for k in node.keywords if k.arg == "weight"), None)
        if isinstance(w, ast.Attribute) and isinstance(w.value, ast.Name) and \
                w.value.id == "self" and isinstance(m._parameters.get(w.attr), torch.Tensor):
            if w.attr not in out:
                out.append(w.attr)
    return out


def _candidates(model):
    """[(table name, module, parameter name in it, parameter, what)]: every
    embedding module's weight and every parameter a forward passes to
    F.embedding*; the table name is the module's for an embedding's weight,
    the parameter's otherwise."""
    out = []
    for mname, m in model.named_modules():
        if isinstance(m, _EMBEDDINGS):
            if isinstance(m.weight, torch.Tensor):
                out.append((mname or "weight", m, "weight", m.weight,
                            "EmbeddingBag" if isinstance(m, torch.nn.EmbeddingBag)
                            else "Embedding"))
            continue
        for p in _forward_params(m):
            pname = "%s.%s" % (mname, p) if mname else p
            out.append((pname, m, p, m._parameters[p], "parameter"))
    return out


def _chosen(name, m, p, tables, min_bytes):
    if isinstance(p, TableWeight) or not p.requires_grad:  # frozen: named only
        return False
    if p.device.type == "meta":  # never materialised: only the servers can hold it
        return True
    if tables is None:
        return bool(getattr(m, "sparse", False)) or p.numel() * 4 >= min_bytes
    if tables == "all":
        return True
    return False


def choose(model, optimizer, tables=None, table_optimizer=None, max_ids=MAX_IDS,
           min_bytes=MIN_BYTES, init_max_bytes=INIT_MAX_BYTES, hashed_ids=False):
    """Make model's table parameters TableWeights and the optimizer's table
    groups, in place (see the module's text); returns the _Tables in model
    order.

      tables     None: every embedding with sparse=True, of at least
                 min_bytes, or on the meta device, and the parameters a
                 module passes to F.embedding* when it has sparse=True or
                 is that large; "all"; a list of module or parameter names;
                 a dict name -> that table's options ({'optimizer': ...,
                 'init': ..., 'scale': ..., 'seed': ..., 'max_rows': ...,
                 'full': 'evict' | 'refuse', 'max_ids': ..., 'hashed_ids': ...});
                 [] none
      table_optimizer  the tables' optimizer (optimizer_settings); None:
                 each follows its parameter group (follow())"""
    if tables is not None and tables != "all" and not isinstance(tables, (list, tuple, set,
                                                                          dict)):
        raise TypeError("tables: None, 'all', a list of module or parameter names or a dict "
                        "name -> options, got %s" % type(tables).__name__)
    cands = _candidates(model)
    pnames = {id(p): n for n, p in model.named_parameters()}
    byname = {}
    for c in cands:
        byname[c[0]] = c
        byname.setdefault(pnames.get(id(c[3]), c[0]), c)  # "emb.weight" names "emb" too
    named = isinstance(tables, (list, tuple, set, dict))
    if named:
        mods = dict(model.named_modules())
        for n in tables:
            mname, _, pname = n.rpartition(".")
            m = mods.get(mname)
            if n not in byname and m is not None and \
                    isinstance(m._parameters.get(pname), torch.Tensor):
                # any parameter by name: a weight vector read by gather or indexing
                byname[n] = (n, m, pname, m._parameters[pname], "parameter")
                cands.append(byname[n])
            if n not in byname:
                raise ValueError("tables: %r is no embedding of the model nor a parameter its "
                                 "forward passes to F.embedding / F.embedding_bag (its "
                                 "candidates: %s)" % (n, ", ".join(c[0] for c in cands) or
                                                      "none"))
    want = {id(byname[n][3]): n for n in tables} if named else {}
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    out = []
    for name, m, pname, p, kind in cands:
        if not (id(p) in want or (not named and _chosen(name, m, p, tables, min_bytes))):
            continue
        opts = dict(tables[want[id(p)]]) if isinstance(tables, dict) else {}
        if getattr(m, "max_norm", None) is not None:
            raise ValueError("table %r: max_norm renormalizes rows in place on the worker; a "
                             "server table's rows cannot be: leave it None" % name)
        if p.dim() not in (1, 2):
            raise ValueError("table %r: a table is a 2-D weight (rows x dim) or a 1-D weight "
                             "vector, got shape %s" % (name, tuple(p.shape)))
        mid = int(opts.pop("max_ids", max_ids))
        hashed = bool(opts.pop("hashed_ids", hashed_ids))
        g = groups.get(id(p))
        if "optimizer" in opts:
            settings = optimizer_settings(opts["optimizer"])
        elif table_optimizer is not None:
            settings = optimizer_settings(table_optimizer)
        else:
            settings = follow(type(optimizer).__name__, g if g is not None
                              else optimizer.defaults)
        opts["optimizer"] = settings
        init_rows = None
        if "init" not in opts and "scale" not in opts and p.device.type != "meta":
            if not bool((p.detach() == 0).all()):
                if p.numel() * 4 > init_max_bytes:
                    raise ValueError(
                        "table %r: its module holds %.1f GiB of rows, more than the %.1f GiB a "
                        "wrapper sends to the servers at start (table_init_max_bytes): build "
                        "it on device='meta' and declare its initializer in tables={%r: "
                        "{'init': 'uniform', 'scale': ...}}, or raise table_init_max_bytes"
                        % (name, p.numel() * 4 / 2**30, init_max_bytes / 2**30, name))
                init_rows = p
            opts["init"], opts["scale"] = "zeros", 0.0
        opts.setdefault("init", "normal")  # nn.Embedding's normal(0, 1)
        opts.setdefault("scale", 1.0)
        dim = p.shape[1] if p.dim() == 2 else 1
        table_options(dim, **opts)  # refused now, with the reason, if wrong
        t = _Table(name, kind, p.shape, table_key(len(out), name, dim), opts, mid, hashed, model,
                   getattr(m, "mode", "mean"), getattr(m, "padding_idx", None))
        t.init_rows = init_rows
        tw = TableWeight(torch.empty(tuple(p.shape), device="meta"), p.requires_grad)
        tw.__dict__["_ps_table"] = t
        t.param = tw
        m._parameters[pname] = tw
        _regroup(optimizer, p, tw, g, settings, name)
        out.append(t)
    return out


def _regroup(optimizer, old, tw, g, settings, name):
    """The table's weight out of its group (and its state gone), into a group
    of its own with that group's settings (or the explicit ones)."""
    if g is not None:
        g["params"] = [q for q in g["params"] if q is not old]
    optimizer.state.pop(old, None)
    group = {k: v for k, v in (g or optimizer.defaults).items() if k != "params"}
    group.update(_group_keys(settings))
    group["params"] = [tw]
    group["ps_table"] = name
    optimizer.param_groups.append(group)


def is_table_group(g):
    return "ps_table" in g


# ---- at start and each step ----

def start(ex, model):
    """After the exchange started: rank 0 sends the materialised modules'
    rows (not to tables the servers trained already: a restarted worker),
    every worker waits for it; the tables' hyper-parameters as the servers
    run them; the forward pre-hook that hands the batches."""
    client = ex.client
    rows = any(t.init_rows is not None for t in ex.tables)
    if client.rank == 0 and all(t.step == 0 for t in ex.tables):
        for t in ex.tables:
            t.send_rows()
    for t in ex.tables:
        t.init_rows = None  # the worker's copy goes
    if rows and client.num_workers > 1:  # no worker pulls a row before it is written
        ex._wait_barrier(_ROWS_BARRIER, "DistributedOptimizer")
    for t in ex.tables:
        now = client.hyper(table=t.key)
        t.known = {k: _f32(now[k]) for k in _HYPER.get(t.options["optimizer"]["optimizer"],
                                                       ("lr",)) if k in now}
    if model is not None:
        attach(ex, model)


def send_hyper(ex, optimizer):
    """Before a step's first forward or push: each table's hyper-parameters
    that its parameter group changed (a scheduler, an edit) go to the
    servers, for the table's rounds from its next step on."""
    for g in optimizer.param_groups:
        t = _group_table(ex, g)
        if t is None:
            continue
        kind = t.options["optimizer"]["optimizer"]
        want = _hyper_of_group(kind, g)
        change = {k: v for k, v in want.items() if t.known.get(k) != v}
        if change:
            now = ex.client.hyper(change, t.step, table=t.key)
            t.known = {k: _f32(now[k]) for k in t.known}


def _group_table(ex, g):
    if "ps_table" not in g:
        return None
    p = g["params"][0] if g["params"] else None
    return p.table if isinstance(p, TableWeight) else None


def tables_of(ex):
    """{name: the table's module weight} in table order (prefetch's)."""
    return {t.name: t.param for t in ex.tables}


def ids_per_table(tables, ids):
    """prefetch()'s argument as one ids tensor per table, in table order: a
    list or tuple in that order, a dict name -> ids, or (one table) its ids."""
    names = [t.name for t in tables]
    if isinstance(ids, dict):
        unknown = [k for k in ids if k not in names]
        if unknown or len(ids) != len(names):
            raise ValueError("prefetch: ids for every table, by name (%s); got %s"
                             % (", ".join(names), ", ".join(map(str, ids))))
        return [ids[n] for n in names]
    if isinstance(ids, (list, tuple)) and len(names) != 1:
        if len(ids) != len(names):
            raise ValueError("prefetch: %d id tensors for %d tables (%s)"
                             % (len(ids), len(names), ", ".join(names)))
        return list(ids)
    if len(names) != 1:
        raise ValueError("prefetch: the model has %d tables (%s): give a list in that order "
                         "or a dict by name" % (len(names), ", ".join(names)))
    return [ids]


# ---- tables declared without a weight ----

def Embedding(num_embeddings, embedding_dim, **kw):
    """nn.Embedding's arguments, on the meta device: a server table from the
    start (the worker never holds its rows)."""
    if kw.get("max_norm") is not None:
        raise ValueError("max_norm renormalizes rows in place on the worker; a server table's "
                         "rows cannot be: leave it None")
    kw.pop("device", None)
    return torch.nn.Embedding(num_embeddings, embedding_dim, device="meta", **kw)


def EmbeddingBag(num_embeddings, embedding_dim, mode="mean", **kw):
    """nn.EmbeddingBag's arguments, on the meta device: a server table from
    the start."""
    if kw.get("max_norm") is not None:
        raise ValueError("max_norm renormalizes rows in place on the worker; a server table's "
                         "rows cannot be: leave it None")
    kw.pop("device", None)
    return torch.nn.EmbeddingBag(num_embeddings, embedding_dim, mode=mode, device="meta", **kw)


def ServerEmbedding(num_embeddings, embedding_dim, bag=True, mode="mean", **kw):
    """Embedding (bag=False) or EmbeddingBag (bag=True) on the meta device."""
    if bag:
        return EmbeddingBag(num_embeddings, embedding_dim, mode=mode, **kw)
    return Embedding(num_embeddings, embedding_dim, **kw)
