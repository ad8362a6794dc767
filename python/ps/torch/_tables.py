"""Embedding tables on the servers: nn.Embedding and nn.EmbeddingBag whose
weight the worker never holds.

A wrapped model's embedding modules (chosen by size or by name: choose())
are replaced by ServerEmbedding modules with the same arguments and no
weight.  Each is a table of libps's exchange (include/ps_exchange.h
"embedding tables": the C machinery ps_worker's CTR model uses), which per
step takes one batch of ids, deduplicates them, fetches their rows (while
the previous batch computes, when the ids were handed ahead: prefetch) and
pushes one gradient row per distinct id.  The forward runs torch's own
F.embedding_bag / F.embedding on the small tensor of the batch's distinct
rows (a leaf that requires grad) with the ids remapped to its rows, so
modes sum, mean and max, padding_idx, per_sample_weights, offsets,
include_last_offset and scale_grad_by_freq are torch's; the leaf's
gradient goes to the servers at the step (the exchange's step: the dense
pushes' clock).  Sync mode: the rows of step s+1 are pulled after every
worker's step-s gradients (the push carries the pull: SPUSHPULL).

Ids are any int64 (the same 64 bits on the wire as uint64): num_embeddings
only says which modules are large; the servers make a row at its first
pull with the table's initializer (ps.table_init gives its values).

The batch protocol per table, kept by _Table: batches are handed in order
(prefetch, or the forward itself when nothing was handed), at most two
ahead of the push (this step's and the next); the first forward with grad
in a step takes the oldest handed batch, whose ids must be the forward's;
the step pushes it (zeros when no forward used the table: every table is
pushed every step).  Forwards without grad (evaluation) look the rows up,
blocking, outside the batches.
"""

import ctypes
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
_lib._proto("ps_exchange_table_next", c_int, c_void_p, c_int, c_void_p, c_size_t, c_size_t)
_lib._proto("ps_exchange_table_rows", c_int, c_void_p, c_int, POINTER(_Rows))
_lib._proto("ps_exchange_table_push", c_int, c_void_p, c_int, c_int64)
_lib._proto("ps_exchange_table_lookup", c_int, c_void_p, c_int, c_void_p, c_size_t, c_void_p)

# a module's weight of at least this many bytes goes to the servers by default
MIN_BYTES = 64 << 20
# the ids one batch of a table may hold (the exchange's buffers: 4 x this x
# dim floats per table, whatever the row count)
MAX_IDS = 1 << 16
# the servers' table optimizer when none is given: sparse Adagrad, torch's
# Adagrad defaults
DEFAULT_OPTIMIZER = {"optimizer": "adagrad", "lr": 0.01, "eps": 1e-10}
ROWS_NOTE = ("rows live on the servers: ps.torch.export writes them, ps_server "
             "--checkpoint-dir keeps them (with their optimizer state); this state_dict holds "
             "the table's declaration only")


def table_key(index, name, dim):
    """Table `index`'s key: the top bit set (apart from param_key's tensor
    keys), its position, a CRC of its name and row width."""
    return (1 << 63) | (index << 32) | zlib.crc32(("%s:%d" % (name, dim)).encode())


def optimizer_settings(opt):
    """The servers' table optimizer for `opt`: 'adagrad' | 'adam' | 'sgd' |
    ... (their defaults but torch's lr), a dict {'optimizer': 'adam', 'lr':
    ..}, or a torch optimizer (Adagrad, SparseAdam or Adam: lazy Adam, SGD)
    whose settings map to the servers' (ValueError when none does)."""
    if opt is None:
        return dict(DEFAULT_OPTIMIZER)
    if isinstance(opt, str):
        return {"optimizer": opt, "lr": 0.01} if opt != "adagrad" else dict(DEFAULT_OPTIMIZER)
    if isinstance(opt, dict):
        return dict(opt)
    if isinstance(opt, torch.optim.Optimizer):
        from ._optim import _group_settings, server_settings
        if type(opt).__name__ == "SparseAdam":
            s = _group_settings(opt)
            b1, b2 = s["betas"]
            return {"optimizer": "adam", "lr": float(s["lr"]), "beta1": float(b1),
                    "beta2": float(b2), "eps": float(s["eps"])}
        return server_settings(opt)
    raise TypeError("table optimizer: a name ('adagrad', 'adam', 'sgd'), a dict or a torch "
                    "optimizer, got %s" % type(opt).__name__)


class _Table:
    """One table's batches in the exchange (see the module's text)."""

    def __init__(self, name, module, key, options, max_ids):
        self.name, self.module, self.key = name, module, key
        self.options = options          # table_options' keyword arguments
        self.max_ids = max_ids
        self.dim = module.embedding_dim
        self.ex = None                  # the Exchange, once added
        self.index = -1
        self.handed = []                # ids (int64 CPU tensors) handed, not pushed
        self.taken = None               # (ids, index, rows leaf, padding row, rows) of this step
        self.step = 0                   # the step of the next push

    def __deepcopy__(self, memo):  # a copy of the model uses the same table
        return self

    def declaration(self):
        m = self.module
        return {"key": self.key, "kind": "EmbeddingBag" if m.bag else "Embedding", "num_embeddings": m.num_embeddings,
                "embedding_dim": m.embedding_dim, "mode": getattr(m, "mode", None),
                "padding_idx": m.padding_idx, "options": dict(self.options), "rows": ROWS_NOTE}

    def add(self, ex, index):
        """Declare the table in the exchange (before its start)."""
        o = table_options(self.dim, **self.options)
        rc = lib.ps_exchange_add_table(ex._x, self.key, ctypes.byref(o), self.max_ids, -1)
        if rc:
            raise PSError(rc, _lib.last_error(ex.client._ptr), "table %r" % self.name)
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

    def hand(self, ids):
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
        self._check(lib.ps_exchange_table_next(x, self.index, ids.data_ptr(), ids.numel(), 1),
                    "ids of the next batch")
        self.handed.append(ids)

    def _rows(self):
        r = _Rows()
        self._check(lib.ps_exchange_table_rows(self._x("rows"), self.index, ctypes.byref(r)),
                    "rows of step %d" % self.step)
        return r

    def batch(self, ids, padding_idx, device):
        """(index into the rows, rows leaf on device, the padding id's row
        or None) of this step's batch, whose ids are `ids`."""
        if self.taken is not None:
            if torch.equal(self.taken[0], ids):
                return self.taken[1:4]
            raise RuntimeError("table %r: a second batch in one step; a table takes one batch "
                               "per optimizer step (no accumulation over backward passes)"
                               % self.name)
        if not self.handed:
            self.hand(ids)
        elif not torch.equal(self.handed[0], ids):
            raise RuntimeError("table %r: this forward's ids are not the batch handed by "
                               "prefetch(): hand every batch's ids, in the order the forwards "
                               "use them" % self.name)
        r = self._rows()
        n, u = r.nentries, r.nunique
        index = torch.from_numpy(np.ctypeslib.as_array(r.index, (n,)).astype(np.int64)) \
            if n else torch.zeros(0, dtype=torch.int64)
        rows = torch.from_numpy(np.ctypeslib.as_array(r.rows, (u, self.dim)).copy()) \
            if u else torch.zeros(0, self.dim)
        uniq = np.ctypeslib.as_array(r.ids, (u,)).view(np.int64) if u else np.zeros(0, np.int64)
        index, leaf, pad = _stage(index, rows, uniq, padding_idx, device)
        leaf.requires_grad_(True)
        self.taken = (ids, index, leaf, pad, r)
        return index, leaf, pad

    def lookup(self, ids, padding_idx, device):
        """(index, rows, padding row) outside the batches (no grad)."""
        uniq, inv = torch.unique(ids, return_inverse=True)
        rows = torch.empty(uniq.numel(), self.dim)
        if uniq.numel():
            self._check(lib.ps_exchange_table_lookup(self._x("lookup"), self.index,
                                                     uniq.data_ptr(), uniq.numel(),
                                                     rows.data_ptr()), "lookup")
        return _stage(inv, rows, uniq.numpy(), padding_idx, device)

    def push(self):
        """The step's gradient rows (every table, every step)."""
        if self.taken is None:  # no forward used it: the handed batch, or none, unchanged
            if not self.handed:
                self.hand(torch.zeros(0, dtype=torch.int64))
            r = self._rows()
            if r.nunique:
                ctypes.memset(r.grads, 0, r.nunique * self.dim * 4)
        else:
            _, _, leaf, _, r = self.taken
            if r.nunique:
                dst = np.ctypeslib.as_array(r.grads, (r.nunique, self.dim))
                g = leaf.grad
                if g is None:
                    dst[...] = 0
                else:
                    dst[...] = g.detach().to("cpu").numpy()
        self._check(lib.ps_exchange_table_push(self._x("push"), self.index, self.step),
                    "push of step %d" % self.step)
        self.step += 1
        self.handed.pop(0)
        self.taken = None


def _stage(index, rows, uniq, padding_idx, device):
    """The batch's rows on the model's device, torch's padding row (zeros;
    the servers' row gets zero gradients) and its position."""
    pad = None
    if padding_idx is not None:
        at = np.nonzero(uniq == padding_idx)[0]
        if len(at):
            pad = int(at[0])
            rows[pad] = 0
    return index.to(device), rows.to(device), pad


def _flat_ids(ids):
    """A contiguous int64 CPU tensor of the ids (any integer tensor, array
    or sequence)."""
    if not torch.is_tensor(ids):
        ids = torch.as_tensor(np.asarray(ids).astype(np.int64, copy=False))
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise TypeError("embedding ids must be integers, got %s" % ids.dtype)
    return ids.detach().to("cpu", torch.int64).reshape(-1).contiguous()


class ServerEmbedding(torch.nn.Module):
    """nn.Embedding (bag=False) or nn.EmbeddingBag (bag=True) with the rows
    on the servers: the same arguments and forward, no weight."""

    def __init__(self, num_embeddings, embedding_dim, bag=True, mode="mean", padding_idx=None,
                 max_norm=None, scale_grad_by_freq=False, sparse=False,
                 include_last_offset=False, name=None):
        super().__init__()
        if max_norm is not None:
            raise ValueError("max_norm renormalizes rows in place on the worker; a server "
                             "table's rows cannot be: leave it None")
        if bag and mode not in ("sum", "mean", "max"):
            raise ValueError("mode must be sum, mean or max, got %r" % (mode,))
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.bag, self.mode, self.padding_idx = bag, mode, padding_idx
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        self.include_last_offset = include_last_offset
        self.table_name = name
        object.__setattr__(self, "_table", None)  # not a submodule: set by the wrapper

    @classmethod
    def of(cls, m, name):
        """The server twin of nn.Embedding / nn.EmbeddingBag m."""
        bag = isinstance(m, torch.nn.EmbeddingBag)
        return cls(m.num_embeddings, m.embedding_dim, bag, m.mode if bag else "mean",
                   m.padding_idx, m.max_norm, m.scale_grad_by_freq, m.sparse,
                   getattr(m, "include_last_offset", False), name)

    @property
    def table(self):
        if self._table is None:
            raise RuntimeError("the server embedding %r is in no exchange: wrap its model "
                               "(ps.torch.DistributedOptimizer(..., model=model) or "
                               "ps.torch.wrap) before the forward" % self.table_name)
        return self._table

    def get_extra_state(self):
        return self.table.declaration() if self._table is not None else {"rows": ROWS_NOTE}

    def set_extra_state(self, state):
        t = self._table
        if t is not None and isinstance(state, dict) and "key" in state and \
                (state["key"], state["embedding_dim"]) != (t.key, t.dim):
            raise ValueError("table %r: the state is of table key %#x dim %d, this one is key "
                             "%#x dim %d" % (t.name, state["key"], state["embedding_dim"],
                                             t.key, t.dim))

    def forward(self, input, offsets=None, per_sample_weights=None):
        t = self.table
        ids = _flat_ids(input)
        get = t.batch if torch.is_grad_enabled() else t.lookup
        index, rows, pad = get(ids, self.padding_idx, input.device)
        index = index.view(input.shape)
        if not self.bag:
            return F.embedding(index, rows, pad, None, 2.0, self.scale_grad_by_freq)
        return F.embedding_bag(index, rows, offsets, None, 2.0, self.scale_grad_by_freq,
                               self.mode, False, per_sample_weights, self.include_last_offset,
                               pad)

    def extra_repr(self):
        s = "%d, %d, on the servers" % (self.num_embeddings, self.embedding_dim)
        if self.bag:
            s += ", mode=%r" % self.mode
        if self.padding_idx is not None:
            s += ", padding_idx=%d" % self.padding_idx
        return s


def Embedding(num_embeddings, embedding_dim, **kw):
    """nn.Embedding's arguments; the rows on the servers (no weight here)."""
    return ServerEmbedding(num_embeddings, embedding_dim, bag=False, **kw)


def EmbeddingBag(num_embeddings, embedding_dim, mode="mean", **kw):
    """nn.EmbeddingBag's arguments; the rows on the servers (no weight here)."""
    return ServerEmbedding(num_embeddings, embedding_dim, bag=True, mode=mode, **kw)


def _chosen(name, m, tables, min_bytes):
    if isinstance(m, ServerEmbedding):
        return True
    if not isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return False
    if m.weight.device.type == "meta":  # never materialised: only the servers can hold it
        return True
    if tables is None:
        return m.num_embeddings * m.embedding_dim * 4 >= min_bytes
    if tables == "all":
        return True
    return name in tables


def choose(model, tables=None, optimizer=None, max_ids=MAX_IDS, min_bytes=MIN_BYTES):
    """Replace model's embedding modules that go to the servers by
    ServerEmbedding modules, in place; returns [(name, weight dropped or
    None, _Table)] in module order.

      tables     None: every nn.Embedding / nn.EmbeddingBag of at least
                 min_bytes of weight (and every one on the meta device);
                 "all"; a list of module names; a dict name -> that
                 table's options ({'optimizer': ..., 'init': ..., 'scale':
                 ..., 'seed': ..., 'max_rows': ..., 'full': 'evict' | 'refuse',
                 'max_ids': ...}); [] none
      optimizer  the tables' default optimizer (optimizer_settings)
    Every table's rows start from its initializer, normal(0, 1) as torch's
    nn.Embedding unless init/scale say otherwise."""
    if tables is not None and tables != "all" and not isinstance(tables, (list, tuple, set,
                                                                          dict)):
        raise TypeError("tables: None, 'all', a list of module names or a dict name -> "
                        "options, got %s" % type(tables).__name__)
    mods = dict(model.named_modules())
    if isinstance(tables, (list, tuple, set, dict)):
        for n in tables:
            m = mods.get(n)
            if not isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag, ServerEmbedding)):
                raise ValueError("tables: %r is no nn.Embedding or nn.EmbeddingBag of the model "
                                 "(its embeddings: %s)" % (n, ", ".join(
                                     k for k, v in mods.items() if isinstance(
                                         v, (torch.nn.Embedding, torch.nn.EmbeddingBag,
                                             ServerEmbedding))) or "none"))
    default_opt = optimizer_settings(optimizer)
    out = []
    for name, m in list(mods.items()):
        if not name or not _chosen(name, m, tables, min_bytes):
            continue
        opts = dict(tables[name]) if isinstance(tables, dict) else {}
        mid = int(opts.pop("max_ids", max_ids))
        opts["optimizer"] = optimizer_settings(opts.get("optimizer", default_opt))
        opts.setdefault("init", "normal")
        opts.setdefault("scale", 1.0)
        table_options(m.embedding_dim, **opts)  # refused now, with the reason, if wrong
        weight = None
        if not isinstance(m, ServerEmbedding):
            weight = m.weight
            sm = ServerEmbedding.of(m, name)
            parent, _, child = name.rpartition(".")
            setattr(mods[parent] if parent else model, child, sm)
            m = sm
        else:
            m.table_name = name
        t = _Table(name, m, table_key(len(out), name, m.embedding_dim), opts, mid)
        object.__setattr__(m, "_table", t)
        out.append((name, weight, t))
    return out


def drop_weights(optimizer, weights):
    """Take the replaced modules' weights out of the user's optimizer."""
    gone = {id(w) for w in weights if w is not None}
    if not gone:
        return
    for g in optimizer.param_groups:
        g["params"] = [p for p in g["params"] if id(p) not in gone]
    for p in [p for p in optimizer.state if id(p) in gone]:
        del optimizer.state[p]


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
