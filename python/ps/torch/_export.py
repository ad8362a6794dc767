"""The trained model leaving the servers (docs/TORCH.md "Export and serve").

export(opt, path): libps's export (ps.Client.export: every server's
chunks and table partitions, one sync round, as .npy files with a
manifest) into a folder, then, here, what PyTorch reads: model.pt, the
plain model's state_dict (no ps in it: the dense parameters at the
export's step, the buffers as this worker has them, and each table that
fits as the weight its TableWeight stands for in the model (an
nn.Embedding's or nn.EmbeddingBag's, or a parameter the forward reads
rows of), rows never touched at their initializer's values, as the
servers would give them, a padding row zeros as the lookups give it),
and the manifest's "torch" part (parameter and table names, shapes).
Written as PATH.torch-partial and renamed, so a folder at PATH is whole.

Reader(spec): a client of role 'reader' for inference while training goes
on: lookup() the rows of several tables by name in one request, and
load_dense() the servers' dense weights into a plain model.  spec is an
export's folder (its manifest says names, keys and dims) or
serving_spec(opt) of the training job.
"""

import json
import os
import shutil

import numpy as np
import torch

from ..client import SYNC, Client
from ..table_init import initial_rows

# a table goes into model.pt as a dense weight when it is at most this big
# (dense_tables="auto")
MAX_DENSE_BYTES = 1 << 30


def _exchange(opt):
    ex = getattr(opt, "_ps_ex", None)
    if ex is None:
        raise TypeError("export: give the optimizer DistributedOptimizer made")
    return ex


def serving_spec(opt):
    """What a Reader needs of this job: {'servers', 'dense': [{name, key,
    shape}], 'tables': [{name, param, key, dim, num_embeddings, ...}]}
    (JSON)."""
    ex = _exchange(opt)
    params = _param_names(opt)
    return {"servers": ex.client.servers,
            "dense": [{"name": n, "key": k, "shape": list(p.shape)}
                      for n, k, p in zip(ex.names, ex.keys, ex.params)],
            "tables": [_table_spec(t, params) for t in ex.tables]}


def _param_names(opt):
    """{id(parameter): its name in the model's state_dict}: a table's
    TableWeight among them."""
    model = getattr(opt, "_ps_model", None)
    return {id(p): n for n, p in model.named_parameters()} if model is not None else {}


def _table_spec(t, params):
    """A table as a plain model has it: its name (the module's, or the
    parameter's), `param` (its weight's entry in the state_dict), the
    weight's shape and what reads it; its initializer."""
    o = t.options
    bag = t.kind == "EmbeddingBag"
    param = params.get(id(getattr(t, "param", None)))
    if param is None:  # no model to look in: the weight of the module named so
        param = t.name + ".weight" if t.kind in ("Embedding", "EmbeddingBag") else t.name
    return {"name": t.name, "param": param, "key": t.key, "dim": t.dim, "shape": list(t.shape),
            "num_embeddings": t.shape[0], "kind": t.kind, "mode": t.mode if bag else None,
            "padding_idx": t.padding_idx, "hashed_ids": t.num is None,
            "init": o.get("init", "normal"), "scale": float(o.get("scale", 1.0)),
            "seed": int(o.get("seed", 0))}


def _wants_dense(t, dense_tables, max_bytes):
    if dense_tables is True or dense_tables == "all":
        return True
    if dense_tables is False or dense_tables is None:
        return False
    if dense_tables == "auto":
        return t["num_embeddings"] * t["dim"] * 4 <= max_bytes
    return t["name"] in dense_tables


def _dense_weight(tdir, entry, spec):
    """The table as the weight of its TableWeight's shape (num_embeddings x
    dim, or a vector): the initializer's rows, then the exported ones, the
    padding row zeros (what the lookups give); None (with the reason) when
    an id is not a row index."""
    n, dim = spec["num_embeddings"], spec["dim"]
    if "ids" in entry:
        ids = np.load(os.path.join(tdir, entry["ids"]), mmap_mode="r")
        rows = np.load(os.path.join(tdir, entry["weights"]), mmap_mode="r")
    else:  # no row of it was ever made
        ids, rows = np.zeros(0, dtype=np.uint64), np.zeros((0, dim), dtype=np.float32)
    if len(ids) and int(ids[-1]) >= n:  # sorted: the last is the largest
        return None, "ids up to %d, beyond its %d rows" % (int(ids[-1]), n)
    w = np.empty((n, dim), dtype=np.float32)
    block = 1 << 16
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        w[lo:hi] = initial_rows(spec["seed"], spec["key"], np.arange(lo, hi, dtype=np.uint64),
                                dim, spec["init"], spec["scale"])
    w[ids.astype(np.int64)] = rows
    if spec.get("padding_idx") is not None:
        w[spec["padding_idx"]] = 0
    return torch.from_numpy(w).reshape(tuple(spec["shape"])), None


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _add_torch(folder, dense_specs, specs, model, dense_tables, max_dense_bytes):
    """What PyTorch reads, added to the export in folder: model.pt (the
    servers' dense tensors under their names, each table that fits as its
    weight, and, with the plain model, its other entries in its order) and
    the manifest's names and "torch" part.  Returns the manifest."""
    man_path = os.path.join(folder, "manifest.json")
    with open(man_path) as f:
        man = json.load(f)
    dense = {d["key"]: d for d in man["dense"]}
    tabs = {t["key"]: t for t in man["tables"]}
    weights = {}
    for ds in dense_specs:
        name, key, shape = ds["name"], ds["key"], tuple(ds["shape"])
        d = dense.get(key)
        if d is None:
            raise RuntimeError("export: tensor %r (key %d) is not in the servers' snapshot"
                               % (name, key))
        a = np.load(os.path.join(folder, d["weights"]))
        weights[name] = torch.from_numpy(a.reshape(shape).copy())
        d["name"], d["shape"] = name, list(shape)
    notes = {}
    for spec in specs:
        e = tabs.get(spec["key"])
        if e is None:  # a table no row of which was made: all its rows are the initializer's
            e = {"key": spec["key"], "rows": 0}
        # its name as the model has it (the servers keep at most its last 63 characters)
        e.update({k: spec[k] for k in ("name", "param", "num_embeddings", "kind", "mode",
                                       "padding_idx")})
        e["in_state_dict"] = False
        if _wants_dense(spec, dense_tables, max_dense_bytes):
            w, why = _dense_weight(folder, e, spec)
            if w is None:
                notes[spec["name"]] = why
                e["not_in_state_dict"] = why
            else:
                weights[spec["param"]] = w
                e["in_state_dict"] = True
    sd = {}
    table_params = {spec["param"] for spec in specs}
    if model is not None:
        # the plain model's entries in its order: a table's weight is the
        # servers' or left out (not dense: load with strict=False), never
        # the model's own (a TableWeight on the meta device, or a plain
        # model's untrained rows), a parameter is the servers'
        for name, v in model.state_dict().items():
            if name in weights:
                sd[name] = weights.pop(name)
            elif name not in table_params and not v.is_meta:
                sd[name] = v.detach().cpu().clone()
    sd.update(weights)
    torch.save(sd, os.path.join(folder, "model.pt"))
    man["torch"] = {"state_dict": "model.pt", "tables_not_in_state_dict": notes,
                    "dense": list(dense_specs), "tables": list(specs)}
    _write_json(man_path, man)
    return man


def add_state_dict(path, spec, model=None, dense_tables="auto",
                   max_dense_bytes=MAX_DENSE_BYTES):
    """model.pt for an export that has none (ps_export's, of a live job or of
    its checkpoints): spec names its tensors and tables (serving_spec(opt)
    of the job, or the folder of one of its ps.torch exports); model, the
    plain model, gives its other entries (buffers).  Written into path
    (model.pt and the manifest's "torch" part) as export() writes them;
    returns the manifest."""
    if not isinstance(spec, dict):
        spec = load_manifest(spec)["torch"]
    return _add_torch(os.fspath(path), spec["dense"], spec["tables"], model, dense_tables,
                      max_dense_bytes)


def export(opt, path, state=True, dense_tables="auto", max_dense_bytes=MAX_DENSE_BYTES,
           wait=10.0):
    """Write the job's model to the folder path (a new one), from one worker
    (rank 0, between steps; the others go on): every tensor and table at the
    step this worker is at (sync: one round of the job).  state: the
    optimizer's state too (ps_server --import keeps it).  dense_tables:
    'auto' (each table of at most max_dense_bytes as a dense weight in
    model.pt), True, False or a list of table names.  Returns the manifest
    (a dict).  Raises PSError (e.g. the servers' --max-memory: a snapshot
    is a copy of their shard)."""
    ex = _exchange(opt)
    client = ex.client
    path = os.fspath(path)
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise ValueError("export: %s exists: an export goes to a new folder" % path)
    tmp = path.rstrip("/") + ".torch-partial"
    shutil.rmtree(tmp, ignore_errors=True)
    # the steps this worker is at: the servers take each key at its own
    kv = {k: s for k, s in zip(ex.keys, ex.steps)}
    kv.update({t.key: t.step for t in ex.tables})
    client.export(tmp, state=state, key_versions=kv, wait_ms=int(wait * 1000))
    params = _param_names(opt)
    man = _add_torch(tmp, [{"name": n, "key": k, "shape": list(p.shape)}
                           for n, k, p in zip(ex.names, ex.keys, ex.params)],
                     [_table_spec(t, params) for t in ex.tables],
                     getattr(opt, "_ps_model", None), dense_tables, max_dense_bytes)
    try:
        os.rmdir(path)  # an empty folder there is replaced
    except OSError:
        pass
    os.rename(tmp, path)
    return man


def load_manifest(path):
    with open(os.path.join(os.fspath(path), "manifest.json")) as f:
        return json.load(f)


class Reader:
    """A reader of a training job's servers (a ps.Client of role 'reader'):
    lookups of rows by table name while it trains, its dense weights, its
    export.

      spec      an export's folder (its manifest's "torch" part) or
                serving_spec(opt) of the job (a dict)
      servers   the job's servers (default: spec's, else as ps.Client)
      **client  ps.Client's other arguments (curve_dir: DIR/reader.key)
    """

    def __init__(self, spec, servers=None, **client):
        if not isinstance(spec, dict):
            spec = load_manifest(spec)["torch"]
        self.spec = spec
        self.tables = {t["name"]: t for t in spec["tables"]}
        self.dense = {d["name"]: d for d in spec["dense"]}
        self.client = Client(servers=servers or spec.get("servers"), role="reader", **client)
        for d in spec["dense"]:
            self.client.register(d["key"], int(np.prod(d["shape"])) if d["shape"] else 1)
        for t in spec["tables"]:
            self.client.register_table(t["key"], t["dim"])
        self.client.start()
        self.version = -1

    def lookup(self, ids):
        """{table name: ids} -> {table name: float32 tensor len(ids) x dim},
        in one request; self.version: the lowest version read (sync: at
        most one step behind the workers)."""
        items, out, pads = [], {}, []
        for name, i in ids.items():
            t = self.tables.get(name)
            if t is None:
                raise KeyError("lookup: no table %r (tables: %s)" % (name, ", ".join(self.tables)))
            a = np.ascontiguousarray(np.asarray(i, dtype=np.int64).reshape(-1)).view(np.uint64)
            rows = np.empty((len(a), t["dim"]), dtype=np.float32)
            items.append((t["key"], a, rows))
            out[name] = rows
            pad = t.get("padding_idx")
            if pad is not None:  # the model's lookups give its padding row as zeros
                pads.append((a, rows, pad + t["num_embeddings"] if pad < 0 else pad))
        self.version = self.client.lookup(items).wait()
        for a, rows, pad in pads:
            rows[a == np.uint64(pad)] = 0
        return {k: torch.from_numpy(v) for k, v in out.items()}

    def load_dense(self, model):
        """Pull every dense parameter of the job into model's parameters
        of the same names (a plain model); the lowest version pulled."""
        params = dict(model.named_parameters())
        reqs = []
        for name, d in self.dense.items():
            p = params.get(name)
            if p is None:
                raise KeyError("load_dense: the model has no parameter %r" % name)
            buf = np.empty(int(np.prod(d["shape"])) if d["shape"] else 1, dtype=np.float32)
            reqs.append((p, buf, self.client.pull(d["key"], buf, 0)))
        v = None
        for p, buf, r in reqs:
            got = r.wait()
            v = got if v is None else min(v, got)
            with torch.no_grad():
                p.copy_(torch.from_numpy(buf).view_as(p))
        return v

    def export(self, path, state=True, wait=10.0):
        """The servers' model to folder path (their snapshot, the newest
        version any has: ps.Client.export)."""
        self.client.export(path, state=state, wait_ms=int(wait * 1000))

    def close(self):
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def lookup(reader, ids):
    """ps.torch.lookup(reader, {table name: ids}): reader.lookup(ids)."""
    return reader.lookup(ids)


# ---- a new job from an export (DistributedOptimizer(..., tables_from=DIR)) ----

def load_dense(path, model=None, named_parameters=None):
    """Before the job starts: the export's dense parameters and buffers
    (model.pt) into the model's (or named_parameters') tensors of the same
    names, so that rank 0's first weights (what the servers take) are the
    export's.  Its tables' weights are left alone: the servers hold their
    rows (ps_server --import)."""
    path = os.fspath(path)
    sd = torch.load(os.path.join(path, "model.pt"), map_location="cpu")
    tables = {t.get("param") for t in load_manifest(path).get("torch", {}).get("tables", [])}
    named = dict(model.named_parameters()) if model is not None else dict(named_parameters or [])
    if model is not None:
        named.update(dict(model.named_buffers()))
    n = 0
    with torch.no_grad():
        for name, t in named.items():
            v = sd.get(name)
            if v is None or name in tables or t.is_meta or tuple(v.shape) != tuple(t.shape):
                continue
            t.copy_(v)
            n += 1
    return n


def imported_tables(chosen, path):
    """At wrap time, the tables the export holds (the servers imported
    them): their module's own rows are not sent (nor their optimizer state
    zeroed by it) whatever the module holds."""
    keys = {t["key"] for t in load_manifest(path).get("tables", [])}
    for t in chosen:
        if t.key in keys:
            t.init_rows = None


def _interleave(planes, nstate, count, chunk):
    """State arrays (nstate x count) as STATE lays them: chunk after chunk,
    each chunk's arrays one after the other."""
    out = np.empty(nstate * count, dtype=np.float32)
    at = 0
    for lo in range(0, count, chunk):
        hi = min(count, lo + chunk)
        for k in range(nstate):
            out[at:at + hi - lo] = planes[k][lo:hi]
            at += hi - lo
    return out


def warm_start(opt, path):
    """After start: check that the servers hold the export's tables (they
    were started with ps_server --import path: sync, before the first
    round, each table's first rows are the export's) and, on rank 0, load
    the dense tensors' optimizer state the export holds (when the servers
    run the same optimizer)."""
    path = os.fspath(path)
    man = load_manifest(path)
    ex = _exchange(opt)
    client = ex.client
    tabs = {t["key"]: t for t in man["tables"]}
    if client.mode == SYNC:  # nothing moved before this worker's first push
        for t in ex.tables:
            e = tabs.get(t.key)
            if e is None or not e.get("rows"):
                continue
            ids = np.ascontiguousarray(np.load(os.path.join(path, e["ids"]), mmap_mode="r")[:16])
            want = np.load(os.path.join(path, e["weights"]), mmap_mode="r")[:16]
            rows = np.empty((len(ids), t.dim), dtype=np.float32)
            client._tables[t.key] = t.dim  # declared through the exchange
            client.lookup([(t.key, ids, rows)]).wait()
            if not np.array_equal(rows, want):
                raise RuntimeError(
                    "tables_from=%s: the servers' table %r does not hold the export's rows: "
                    "start the servers with ps_server --import %s" % (path, t.name, path))
    if client.rank != 0 or not man.get("with_state"):
        return
    kind = man.get("optimizer", {}).get("kind")
    now = client.hyper()
    if kind != now["optimizer"]:
        return  # another optimizer: its state starts afresh
    dense = {d["key"]: d for d in man["dense"]}
    chunk = client.chunk_elems
    for key, p in zip(ex.keys, ex.params):
        d = dense.get(key)
        files = d.get("state") if d else None
        if not files:
            continue
        planes = [np.load(os.path.join(path, f)) for f in files]
        src = _interleave(planes, len(planes), p.numel(), chunk)
        client.set_state(key, src, len(planes), int(d["version"])).wait()
