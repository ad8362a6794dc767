"""The process's side of ps.torch: its client, rank and size, and the
collectives that go through server 0 (allreduce of a tensor, broadcast of
any picklable object from rank 0), as Horovod's hvd.init(), hvd.rank(),
hvd.allreduce() and hvd.broadcast_object() do.

Every worker must call the collectives in the same order (each gets the
next id of its kind); they complete when every live worker has called the
same one.  They need the started client: the first DistributedOptimizer
(or wrap) starts it with the model; a broadcast_parameters or
broadcast_optimizer_state called before is done then, at start.
"""

import os
import pickle

import torch

from ..client import RANK_ENV, SIZE_ENV, Client, _int_setting


class _Context:
    client = None       # init()'s, or the last one DistributedOptimizer or wrap started
    optimizer = None    # the last DistributedOptimizer
    exchange = None
    pending = []        # (kind, what) broadcasts asked for before the client started


_ctx = _Context()

# init()'s clients give up on a server silent this long (heartbeats on)
SERVER_TIMEOUT_MS = 5000

# the local rank and size, as the launchers say them
LOCAL_RANK_ENV = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID")
LOCAL_SIZE_ENV = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def init(client=None, **kwargs):
    """Horovod's hvd.init(): open the process's client (ps.Client(**kwargs):
    servers, rank and size from the environment, PS_* or torchrun's RANK,
    WORLD_SIZE, MASTER_ADDR) without starting it; DistributedOptimizer
    starts it with the model.  Returns it."""
    if client is None:
        if _ctx.client is not None and not _ctx.client.closed and not kwargs:
            return _ctx.client
        if not any(k in kwargs for k in ("server_timeout_ms", "env")) and \
                "PS_SERVER_TIMEOUT" not in os.environ and \
                os.environ.get("PS_HEARTBEAT", "1") not in ("0", "") and \
                kwargs.get("heartbeat_ms") != 0:
            # every server answers the heartbeats (1 s): one silent for 5 s
            # is gone, said to the call that waits on it (libps: 60 s)
            kwargs["server_timeout_ms"] = SERVER_TIMEOUT_MS
        client = Client(**kwargs)
    _ctx.client = client
    return client


def _client_or_env(attr, names, default):
    if _ctx.client is not None:
        return getattr(_ctx.client, attr)
    return _int_setting(None, names, os.environ, attr, default)


def rank():
    """This worker's rank (init()'s client, else PS_RANK, RANK, SLURM_PROCID, ...)."""
    return _client_or_env("rank", RANK_ENV, 0)


def size():
    """The number of workers (PS_NUM_WORKERS, WORLD_SIZE, SLURM_NTASKS, ...)."""
    return _client_or_env("num_workers", SIZE_ENV, 1)


def local_rank():
    """This worker's rank on its host (LOCAL_RANK of torchrun, Open MPI's,
    Slurm's), 0 when none says: for torch.cuda.set_device."""
    return _int_setting(None, LOCAL_RANK_ENV, os.environ, "local_rank", 0)


def local_size():
    """Workers on this host (LOCAL_WORLD_SIZE, Open MPI's), 1 when none says."""
    return _int_setting(None, LOCAL_SIZE_ENV, os.environ, "local_size", 1)


def sampler(dataset, shuffle=True, seed=0, drop_last=False):
    """torch's DistributedSampler with this worker's rank and the number of
    workers (rank(), size()): each worker reads its own 1/size() of the
    dataset, every one the same number of batches (the last samples repeat
    to fill the shares; drop_last=True drops them instead).  Call
    set_epoch(e) before each epoch when shuffling, as with DDP."""
    return torch.utils.data.DistributedSampler(dataset, num_replicas=size(), rank=rank(),
                                               shuffle=shuffle, seed=seed, drop_last=drop_last)


def started_client(what):
    c = _ctx.client
    if c is None or c.closed or not c.started:
        raise RuntimeError("%s goes through the servers: call it after DistributedOptimizer(...) "
                           "or ps.torch.wrap(...) started the client with the model" % what)
    return c


def _next_id(c, kind):
    ids = c.__dict__.setdefault("_collective_ids", {})
    ids[kind] = ids.get(kind, 0) + 1
    return ids[kind]


# ---- collectives ----

Average, Sum = "average", "sum"


def allreduce(tensor, average=None, name=None, op=None, client=None):
    """The mean over the workers of tensor (a new tensor of its dtype and
    device), summed in rank order on server 0: every worker gets the same
    bits.  op=Sum (or average=False): the mean times the number of
    workers, which is the sum up to float rounding.  name is for
    Horovod's signature; ids come in call order.  client: the process's
    (the last one started) unless given."""
    del name
    c = client or started_client("allreduce")
    t = tensor.detach()
    src = t.to(device="cpu", dtype=torch.float32).contiguous().reshape(-1)
    if src.numel() == 0:
        return t.clone()
    dst = torch.empty_like(src)
    c.allreduce(_next_id(c, "allreduce"), src, dst).wait()
    if op == Sum or average is False:
        dst.mul_(c.num_workers)
    return dst.reshape(t.shape).to(device=t.device, dtype=t.dtype)


def allreduce_(tensor, average=None, name=None, op=None):
    """allreduce in place."""
    with torch.no_grad():
        tensor.copy_(allreduce(tensor, average, name, op))
    return tensor


def _root(root_rank):
    if root_rank != 0:
        raise ValueError("ps.torch broadcasts from rank 0 (the servers' collective), not from "
                         "rank %d" % root_rank)


def broadcast_object(obj=None, root_rank=0, name=None, client=None):
    """Rank 0's obj (pickled there, unpickled everywhere), through server 0;
    every worker calls it and gets it (rank 0 a copy too)."""
    del name
    _root(root_rank)
    c = client or started_client("broadcast_object")
    head = torch.zeros(2, dtype=torch.float32)  # 8 bytes: the length
    data = b""
    if c.rank == 0:
        data = pickle.dumps(obj, protocol=4)
        head.view(torch.int64)[0] = len(data)
    got = torch.empty_like(head)
    c.broadcast(_next_id(c, "broadcast"), head, got).wait()
    n = int(got.view(torch.int64)[0])
    src = torch.zeros((n + 3) // 4, dtype=torch.float32)
    if c.rank == 0:
        src.view(torch.uint8)[:n] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dst = torch.empty_like(src)
    c.broadcast(_next_id(c, "broadcast"), src, dst).wait()
    return pickle.loads(dst.view(torch.uint8)[:n].numpy().tobytes())


def broadcast_tensors(named, client=None):
    """Rank 0's values of every (name, tensor) of named into the others',
    in place (.data: no autograd version counted)."""
    named = [(n, t) for n, t in named if torch.is_tensor(t)]
    if not named:
        return
    theirs = broadcast_object({n: t.detach().cpu() for n, t in named}, client=client)
    with torch.no_grad():
        for n, t in named:
            if n in theirs:
                t.data.copy_(theirs[n])


def broadcast_parameters(params, root_rank=0):
    """Horovod's hvd.broadcast_parameters(model.state_dict(), root_rank=0):
    rank 0's values everywhere.  Before DistributedOptimizer started the
    client this is done at start (where rank 0's parameters win anyway)."""
    _root(root_rank)
    named = list(params.items()) if isinstance(params, dict) else list(params)
    if _ctx.client is None or not _ctx.client.started:
        _ctx.pending.append(("tensors", named))
        return
    broadcast_tensors(named)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Horovod's hvd.broadcast_optimizer_state: rank 0's state and
    hyper-parameters everywhere.  A DistributedOptimizer with the update on
    the servers keeps its state there (nothing to do); one with the update
    on the workers does it at start."""
    _root(root_rank)
    if _ctx.client is None or not _ctx.client.started:
        return  # DistributedOptimizer broadcasts rank 0's at start
    if getattr(optimizer, "_ps_update", None) == "server":
        return
    sd = broadcast_object(_to_cpu(optimizer.state_dict()), client=getattr(optimizer, "client",
                                                                           None))
    optimizer.load_state_dict(sd)


def _to_cpu(x):
    if torch.is_tensor(x):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    return x


def average_buffers(module, client=None):
    """Every floating buffer of module (BatchNorm's running statistics)
    becomes the workers' mean, in one allreduce."""
    bufs = [b for _, b in module.named_buffers() if b.is_floating_point()]
    if not bufs:
        return
    flat = torch.cat([b.detach().reshape(-1).float().cpu() for b in bufs])
    mean = allreduce(flat, client=client)
    off = 0
    with torch.no_grad():
        for b in bufs:
            b.copy_(mean[off:off + b.numel()].reshape(b.shape))
            off += b.numel()


def on_start(client, optimizer=None, exchange=None, module=None):
    """A DistributedOptimizer or wrap started client: it is the process's
    from now on; rank 0's buffers and frozen parameters go everywhere, and
    the broadcasts asked for before the start are done."""
    _ctx.client = client
    if optimizer is not None:
        _ctx.optimizer = optimizer
    if exchange is not None:
        _ctx.exchange = exchange
    named = []
    if module is not None:
        named = [("buffer:" + n, b) for n, b in module.named_buffers()]
        named += [("frozen:" + n, p) for n, p in module.named_parameters() if not p.requires_grad]
    for kind, what in _ctx.pending:
        if kind == "tensors":
            named += what
    _ctx.pending = []
    if named:
        broadcast_tensors(named, client)
