"""ps.torch: train any torch.nn.Module through the parameter servers.

The lines a PyTorch training script adds:

    import ps.torch
    model = ps.torch.wrap(model)     # a ps.Client from PS_SERVERS, PS_RANK, ...
    for x, y in loader:              # an ordinary loop, with no optimizer step:
        loss = F.cross_entropy(model(x), y)
        loss.backward()              # the servers apply the update
    model.pull_final()               # every worker ends with the servers' weights
    model.close()

or, keeping a torch optimizer's calls (its settings are checked against the
servers' at start, and it is never stepped locally):

    opt = ps.torch.DistributedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.05))
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    opt.pull_final()

What happens (DESIGN.md "Overlap on the worker", the machinery ps_worker
uses, client/exchange.c inside libps): every parameter that requires grad is
registered, in named_parameters() order, with a key made of its position and
a CRC of its name and shape, so workers that wrap different models (or the
same layers in another order) are refused at start.  Worker 0's initial
weights win: it inits the servers, every worker waits at a barrier and then
pulls them.  Each backward pushes every gradient the moment autograd has made
it (last layer first) and posts the pull of the next version into a back
buffer; before a module's forward its parameters swap to that buffer: async
as soon as it has landed, sync once it has (waiting for that layer only).
Each backward is one step: do not call backward twice per step.  Gradient
clipping and other edits of .grad after backward do not reach the servers
(the gradient has left by then).  See _optim.py for how torch optimizers map
to the servers' flags.
"""

import sys

try:
    import torch
except ImportError as e:  # a python3 first on PATH that is not Debian's
    raise ImportError("ps.torch needs PyTorch, which %s cannot import (%s): run the script "
                      "with an interpreter that has it, e.g. Debian's /usr/bin/python3 with "
                      "python3-torch (ps_launch --exec /usr/bin/python3 ...)"
                      % (sys.executable, e)) from e

from ..client import Client, PSError
from ._exchange import Exchange, param_key
from ._optim import server_flags, server_settings

__all__ = ["wrap", "DistributedModel", "DistributedOptimizer", "server_flags",
           "server_settings", "param_key", "Client", "PSError"]


class DistributedModel(torch.nn.Module):
    """model wrapped by ps.torch.wrap: calls model, trains through the
    servers.  .module is the model itself (its state_dict has no prefix)."""

    def __init__(self, module, client=None, optimizer=None, init_from_rank0=True):
        super().__init__()
        expect = server_settings(optimizer) if optimizer is not None else None
        self.module = module
        # not a submodule attribute: the exchange is no part of the state
        object.__setattr__(self, "exchange", Exchange(module, client, expect, init_from_rank0))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @property
    def client(self):
        return self.exchange.client

    @property
    def steps(self):
        """Steps (backward passes) pushed so far."""
        return max(self.exchange.steps)

    def finish(self):
        """Wait for the requests in flight and use what they pulled (e.g.
        before evaluating mid-run)."""
        self.exchange.finish()

    def pull_final(self):
        """After the last step, on every worker: barrier, then the servers'
        final weights into the parameters."""
        self.exchange.pull_final()

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


def wrap(model, client=None, optimizer=None, init_from_rank0=True):
    """Train model through the servers: returns a DistributedModel.

    client: a ps.Client that is not started yet (None: one from the
    environment, PS_SERVERS, PS_RANK, ...).  optimizer: a torch optimizer
    whose settings the servers must run (checked at start; never stepped).
    init_from_rank0: worker 0's initial weights win (False: every worker
    inits and the first init of each chunk wins, fine when all are seeded
    alike).  Blocks until every server has said hello and the weights are
    pulled; raises PSError (EMISMATCH naming what differs, ETIMEDOUT)."""
    return DistributedModel(model, client, optimizer, init_from_rank0)


class DistributedOptimizer:
    """A drop-in for a torch optimizer: zero_grad/step keep their places in
    the loop, the update happens on the servers.

    DistributedOptimizer(model, optimizer=None, client=None): optimizer is a
    torch optimizer over model's parameters whose settings the servers must
    run (mapped by server_settings; checked at start).  step() runs the
    closure if given and returns its loss; the pushes and pulls happened in
    backward and forward."""

    def __init__(self, model, optimizer=None, client=None, init_from_rank0=True):
        self.optimizer = optimizer
        self.model = wrap(model, client, optimizer, init_from_rank0)
        self.exchange = self.model.exchange
        self.param_groups = (optimizer.param_groups if optimizer is not None
                             else [{"params": list(self.exchange.params)}])

    @property
    def client(self):
        return self.exchange.client

    def zero_grad(self, set_to_none=False):
        """As torch 1.13's optimizers: zero each .grad in place by default.
        (set_to_none=True frees them instead; then every backward allocates
        them anew, and glibc giving that memory back to the system and
        faulting it in again cost up to twice the step's compute in the
        benchmark's VM.)"""
        for p in self.exchange.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_()
                p.grad.zero_()

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        return loss

    def finish(self):
        self.model.finish()

    def pull_final(self):
        self.model.pull_final()

    def close(self):
        self.model.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
