"""ps.torch: train any torch.nn.Module through the parameter servers.

The lines a PyTorch training script changes (docs/TORCH.md has the table
of Horovod's and DDP's calls and the porting diffs of two real scripts):

    import ps.torch
    optimizer = ps.torch.DistributedOptimizer(optimizer, model=model)
    for x, y in loader:                    # the loop stays as it was
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()                   # any torch.optim.lr_scheduler
    optimizer.pull_final()                 # every worker ends with the same weights

The optimizer is a torch.optim.Optimizer of the user's class (isinstance
holds; schedulers, state_dict, load_state_dict and zero_grad are torch's).
Where the update runs is its `update` argument (_dist.py): "server" (the
servers' optimizer; the default for SGD, Adam and Adagrad, which they run)
or "worker" (any torch optimizer: the servers average, every worker steps
its own).  The servers, rank and size come from the environment (PS_*, or
torchrun's RANK, WORLD_SIZE and MASTER_ADDR; ps_launch --exec sets PS_*),
or a ps.Client.  Horovod's names are here too: init, rank, size,
local_rank, local_size, allreduce, broadcast_object, broadcast_parameters,
broadcast_optimizer_state, join, Compression, Average; so
`import ps.torch as hvd` ports a Horovod script.

What happens (DESIGN.md "Overlap on the worker", the machinery ps_worker
uses, client/exchange.c inside libps): every parameter that requires grad
is registered, in order, with a key made of its position and a CRC of its
name and shape, so workers that wrap different models are refused at
start.  Worker 0's initial weights win (and its buffers and frozen
parameters: BatchNorm statistics); a worker that restarts goes on from the
servers' clock.  step() pushes each gradient as .grad holds it (so
accumulation, clipping and unscaling are what they are in plain torch) and
posts the pull of the next version, first layer first; before a module's
forward its parameters take that version (sync: waiting for that layer
only).  grad_edits=False pushes during backward instead, the moment autograd
has made each gradient (last layer first).
Ctrl-C interrupts any wait in libps (KeyboardInterrupt); the start and end
barriers say whom they wait for and give up after wait_timeout; a worker
refused at hello fails its peers' start with the reason; pull_final() (which
is join()), close() or the script's end lets workers with uneven step counts
finish; an exception leaves the rounds and ends the process.

wrap(model) is the older form: no optimizer, every backward a step, the
servers' update.
"""

import copy
import sys

try:
    import torch
except ImportError as e:  # a python3 first on PATH that is not Debian's
    raise ImportError("ps.torch needs PyTorch, which %s cannot import (%s): run the script "
                      "with an interpreter that has it, e.g. Debian's /usr/bin/python3 with "
                      "python3-torch (ps_launch --exec /usr/bin/python3 ...)"
                      % (sys.executable, e)) from e

from ..client import Client, PSError
from . import _context
from ._context import (Average, Sum, allreduce, allreduce_, broadcast_object,
                       broadcast_optimizer_state, broadcast_parameters, init, local_rank,
                       local_size, membership, rank, sampler, size)
from ._elastic import ElasticSampler
from ._dist import Adasum, Compression, ServersOptimizer
from ._dist import make as _make
from ._exchange import Exchange, param_key
from ._optim import server_flags, server_settings
from ._rowwise import RowWiseAdagrad
from ._tables import (INIT_MAX_BYTES, MAX_IDS, MIN_BYTES, Embedding, EmbeddingBag,
                      ServerEmbedding, TableWeight)
from . import _export
from ._export import Reader, add_state_dict, load_manifest, lookup, serving_spec


def export(opt, path, state=True, dense_tables="auto", **kw):
    """The model of the job opt (DistributedOptimizer's) trains to the folder
    path, from one worker between steps: manifest.json and .npy files of
    every tensor and table (ids sorted) at the step this worker is at (sync:
    one round), the optimizer's state with state=True, and model.pt, the
    plain model's state_dict (tables that fit as dense weights: 'auto', True,
    False or names).  docs/TORCH.md "Export and serve"."""
    return _export.export(opt, path, state=state, dense_tables=dense_tables, **kw)

__all__ = ["DistributedOptimizer", "DistributedModel", "wrap", "init", "rank", "size",
           "local_rank", "local_size", "allreduce", "allreduce_", "broadcast_object",
           "broadcast_parameters", "broadcast_optimizer_state", "join", "Compression",
           "Average", "Sum", "Adasum", "server_flags", "server_settings", "param_key",
           "Client", "PSError", "Embedding", "EmbeddingBag", "ServerEmbedding", "TableWeight",
           "RowWiseAdagrad", "sampler", "export", "add_state_dict", "lookup", "Reader",
           "serving_spec",
           "load_manifest", "membership", "ElasticSampler"]


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=None, gradient_predivide_factor=1.0,
                         *, model=None, client=None, update=None, grad_edits=None,
                         init_from_rank0=True, wait_timeout=600.0, sync_buffers_every=0,
                         tables=None, table_optimizer=None, table_max_ids=MAX_IDS,
                         table_min_bytes=MIN_BYTES, table_init_max_bytes=INIT_MAX_BYTES,
                         table_hashed_ids=False, samples_per_step=0, tables_from=None):
    """optimizer trained through the servers: an instance of a class derived
    from optimizer's (so isinstance, lr schedulers and state_dict work), with
    optimizer's parameter groups and state.  Blocks until every server said
    hello and the weights are pulled; raises PSError (EMISMATCH naming what
    differs, ETIMEDOUT) or ValueError.

      named_parameters  model.named_parameters(): the names in the keys (as
                        Horovod); or model=
      model             the model: its forward takes each layer's weights
                        as they land (sync: overlapping the pulls), its
                        buffers and frozen parameters are rank 0's at
                        start; without it step() takes the weights
      update            'server': the servers run the optimizer (they must
                        run what server_flags(optimizer) says; SGD, Adam,
                        Adagrad).  'worker': each worker steps it (any
                        torch optimizer; servers with --optimizer average in
                        sync mode, add in async).  Default: server when
                        they can run it.  Pick server to keep the update
                        off the GPU's critical path (the servers' CPUs
                        update while the workers compute); worker for an
                        optimizer the servers lack (Adadelta, RMSprop,
                        LAMB), per-group settings, or to clip the averaged
                        gradient (synchronize())
      grad_edits        None (or True): gradients go at step(), as .grad
                        then holds them (micro-batches summed by several
                        backward() calls, clipped, unscaled).  False: each
                        goes during backward, overlapping it, for loops of
                        one backward per step (or backward_passes_per_step /
                        no_sync()) that never edit .grad: a break of that is
                        refused when seen, after what had left was applied
      backward_passes_per_step  k micro-batches accumulate into one push
      compression       Compression.none / fp16 / bf16: the wire type
                        (the servers' --wire-dtype must agree)
      op                Average (the servers average); Sum, Adasum refused
      client            a ps.Client not yet started (default: init()'s)
      init_from_rank0   worker 0's initial weights win (default)
      wait_timeout      seconds the start and end barriers wait for the
                        other workers, saying every 10 s whom (0: forever)
      sync_buffers_every  average the model's buffers every N steps (0:
                        only at pull_final/join)
      tables            which embeddings of model become tables on the
                        servers (the weight becomes a TableWeight, the
                        worker's copy dropped; its own parameter group):
                        None, every nn.Embedding / nn.EmbeddingBag with
                        sparse=True, of at least table_min_bytes (64 MiB)
                        or on the meta device, and the parameters a module
                        passes to F.embedding* itself when it says
                        sparse=True or is that large; "all"; a list of
                        module or parameter names; a dict name -> that
                        table's options (optimizer, init, scale, seed,
                        max_rows, full, max_ids, hashed_ids); [] none.
                        docs/TORCH.md "Embedding tables"
      table_optimizer   None: each table follows its parameter group in
                        optimizer (SGD, Adagrad, SparseAdam, RowWiseAdagrad;
                        others refused, saying so); or the servers' table
                        optimizer for all: "adagrad", "adam" (lazy), "sgd",
                        "rowwise_adagrad", a dict {'optimizer': 'adagrad',
                        'lr': 0.05, ...} or a torch optimizer
      table_max_ids     the ids one batch may give a table (16 x dim x this
                        bytes of buffers per table)
      table_init_max_bytes  a materialised module's rows sent to the servers
                        at start (its first rows), at most; more is refused
                        (declare an initializer on a meta module instead)
      table_hashed_ids  ids are hashes: any int64, not checked against
                        num_embeddings (IndexError otherwise, as torch)
      samples_per_step  the samples one step() trains on (the batch): with
                        the client's metrics on (PS_METRICS_PORT) they go to
                        ps_worker_samples_total, every step() to
                        ps_worker_steps_total (docs/OPERATIONS.md "Metrics")
      tables_from       an export's folder (ps.torch.export, ps_export): a
                        warm start.  The dense parameters start from its
                        model.pt (rank 0's first weights), their optimizer
                        state from its state (same optimizer), and the
                        servers must hold its tables (ps_server --import
                        DIR: checked in sync mode; the model's own rows
                        of those tables are not sent)

    The older form DistributedOptimizer(model, optimizer=None, client=None)
    (the update on the servers, optimizer checked against theirs) works too."""
    tab = dict(tables=tables, table_optimizer=table_optimizer, table_max_ids=table_max_ids,
               table_min_bytes=table_min_bytes, table_init_max_bytes=table_init_max_bytes,
               table_hashed_ids=table_hashed_ids, samples_per_step=samples_per_step,
               tables_from=tables_from)
    if isinstance(optimizer, torch.nn.Module):
        model, optimizer = optimizer, named_parameters
        client = compression if client is None else client
        if optimizer is None:
            optimizer = ServersOptimizer(model.parameters())
        named_parameters = None
        args = dict(model=model, client=client, update=update or "server",
                    grad_edits=grad_edits, init_from_rank0=init_from_rank0,
                    wait_timeout=wait_timeout, sync_buffers_every=sync_buffers_every, **tab)
        pos = (optimizer,)
    else:
        named_parameters = list(named_parameters) if named_parameters is not None else None
        pos = (optimizer, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, model, client, update, grad_edits, init_from_rank0,
               wait_timeout, sync_buffers_every)
        args = tab
    if tables_from is not None:
        _export.load_dense(tables_from, model, named_parameters)
    opt = _make(*pos, **args)
    if tables_from is not None:
        try:
            _export.warm_start(opt, tables_from)
        except BaseException:
            opt.close()  # the job it joined goes on without it
            raise
    return opt


class DistributedModel(torch.nn.Module):
    """A model trained through the servers: calls it.  .module is the model
    itself (its state_dict has no prefix); a deepcopy is a copy of it, a
    plain model."""

    def __init__(self, module, client=None, optimizer=None, init_from_rank0=True,
                 wait_timeout=600.0):
        super().__init__()
        self.module = module
        expect = server_settings(optimizer) if optimizer is not None else None
        if client is None:
            client = _context.init()
        ex = Exchange(module.named_parameters(), client, expect, module, init_from_rank0,
                      "server", wait_timeout)
        ex.auto_step = True  # no step(): every backward is one
        # not submodule attributes: no part of the state
        object.__setattr__(self, "exchange", ex)
        object.__setattr__(self, "_optimizer", None)
        _context.on_start(client, None, ex, module)

    @classmethod
    def _of(cls, module, exchange, optimizer):
        m = cls.__new__(cls)
        torch.nn.Module.__init__(m)
        m.module = module
        object.__setattr__(m, "exchange", exchange)
        object.__setattr__(m, "_optimizer", optimizer)
        return m

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __deepcopy__(self, memo):
        return copy.deepcopy(self.module, memo)

    @property
    def client(self):
        return self.exchange.client

    @property
    def steps(self):
        """Steps pushed so far (the latest parameter's)."""
        return max(self.exchange.steps)

    def finish(self):
        """Wait for the requests in flight and use what they pulled (e.g.
        before evaluating mid-run)."""
        self.exchange.finish()

    def pull_final(self):
        """After the last step, on every worker, whatever its step count: the
        servers' final weights into the parameters, the buffers averaged
        (see DistributedOptimizer.pull_final)."""
        self.exchange.pull_final()

    def join(self):
        """hvd.join(): pull_final."""
        self.exchange.join()

    def average_buffers(self):
        """Every floating buffer (BatchNorm statistics) becomes the workers'
        mean (a collective: every worker calls it)."""
        _context.average_buffers(self.module, self.client)

    def no_sync(self):
        """Backward passes inside it accumulate in .grad without a push."""
        if self._optimizer is not None:
            return self._optimizer.no_sync()
        raise RuntimeError("no_sync() needs a DistributedOptimizer: wrap() pushes every "
                           "backward")

    def take_wait_ns(self):
        return self.exchange.take_wait_ns()

    def close(self):
        """Close the client; the parameters keep their last weights in memory
        of their own.  Idempotent."""
        self.exchange.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wrap(model, client=None, optimizer=None, init_from_rank0=True, wait_timeout=600.0):
    """Train model through the servers without an optimizer step: every
    backward is a step, the servers apply the update.  Returns a
    DistributedModel.

    client: a ps.Client that is not started yet (None: one from the
    environment).  optimizer: a torch optimizer whose settings the servers
    must run (checked at start; never stepped).  init_from_rank0: worker 0's
    initial weights win (False: every worker inits and the first init of
    each chunk wins, fine when all are seeded alike)."""
    return DistributedModel(model, client, optimizer, init_from_rank0, wait_timeout)


def join():
    """hvd.join(): this worker is done (uneven step counts); returns when
    every worker has joined.  The last DistributedOptimizer's."""
    opt = _context._ctx.optimizer
    if opt is None:
        raise RuntimeError("join() needs a DistributedOptimizer")
    opt.join()
