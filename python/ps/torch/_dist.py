"""ps.torch.DistributedOptimizer: the user's torch optimizer, made to train
through the servers.

As Horovod's and BytePS's, it is an instance of a class made on the spot
that derives from the user's optimizer class (so isinstance holds, every
lr_scheduler takes it, state_dict() and zero_grad() are torch's) and shares
the user's optimizer's parameter groups and state.  What differs is step(),
by where the update runs (`update`; None: as the servers were started):

  server  (servers started with the optimizer: SGD with or without momentum
          or nesterov, Adam, Adagrad, as server_flags() says) the servers
          apply the update while the workers compute; step() pushes what
          backward did not, and a hyper-parameter that changed (a
          scheduler, a hand edit of param_groups) is sent to them before the
          next pushes: sync rounds from that step on use it, async pushes
          from then on.  state_dict() holds the servers' optimizer state
          (momentum, Adam's moments and step), load_state_dict() gives it
          back to them.
  worker  (servers started with --optimizer average in sync mode, add in
          async mode; any torch optimizer) every worker steps its own
          optimizer: sync, the servers average the round's gradients, step()
          puts the mean in .grad and steps (exact: every worker makes the
          same update); async, step() steps and pushes what it changed in
          the weights (the delta), which the servers add, as BytePS does.

Gradients leave at step(): what .grad holds then (micro-batches summed by
several backward() calls, clipped, unscaled) is what the servers get, one
push per step, whatever a step does; nothing is pushed twice (synchronize()
after step() has nothing new).  grad_edits=False pushes each gradient
during backward the moment autograd has made it (overlapping the rest of
backward) for a loop that promises one backward per step (or
backward_passes_per_step=k, or no_sync() around the passes that only
accumulate) and no edit of .grad before step(); a break of that promise
is refused when it is seen (the extra backward, at its first gradient; the
edit, at step()), but what had left was applied.
"""

import contextlib
import sys

import torch

from .. import _lib
from ..client import PSError, parse_wire_dtype
from . import _context
from . import _tables
from ._exchange import Exchange
from ._optim import (STATE_NAMES, hyper_of, planes_to_state, server_flags, server_settings,
                     state_to_planes)

_EMISMATCH = _lib.ERRORS.index("EMISMATCH")


class Compression:
    """Horovod's compression argument: the wire type of gradients and
    weights (the servers must run the same --wire-dtype)."""
    none = "f32"
    fp16 = "f16"
    bf16 = "bf16"


Average, Sum, Adasum = _context.Average, _context.Sum, "adasum"


class ServersOptimizer(torch.optim.Optimizer):
    """The optimizer of DistributedOptimizer(model) without a torch one: the
    servers run whatever they were started with, unchecked."""

    def __init__(self, params):
        super().__init__(params, {})


class _Methods:
    """The methods the made class adds to the user's optimizer class
    (copied into it, so each uses super(self.__class__, self))."""

    # ---- set-up ----

    def _ps_setup(self, named, model, client, update, k, grad_edits, wire, init_from_rank0,
                  wait_timeout, sync_buffers_every, tables=()):
        self._ps_synced = False
        self._ps_skip = False
        self._ps_backwards = 0  # the exchange's backward count at the last step()
        self._ps_steps = 0
        # an elastic job: the membership, read at step boundaries (membership())
        self._ps_members = None
        self._ps_members_every = 1
        self._ps_members_cb = []
        self._ps_buffers_every = sync_buffers_every
        self._ps_model = model
        self._ps_view = None
        self._ps_kind = None
        mode_async = client.mode == _lib.MODE_ASYNC
        # no dense tensor (a model of server tables alone): nothing of the
        # servers' dense optimizer to check
        servers_own = isinstance(self, ServersOptimizer) or not named
        if update == "server":
            expect = None if servers_own else server_settings(self)
            self._ps_kind = None if servers_own else expect["optimizer"]
            how = "server"
        elif update == "worker":
            expect = {"optimizer": "add" if mode_async else "average"}
            self._ps_kind = expect["optimizer"]
            how = "worker-async" if mode_async else "worker-sync"
        else:  # as the servers run: checked once they said
            expect, how = None, "auto"
        try:
            ex = Exchange(named, client, expect, model, init_from_rank0, how, wait_timeout, wire,
                          tables)
        except PSError as e:
            if e.code == _EMISMATCH and "optimizer:" in e.message:
                raise PSError(e.code, e.message + "; the servers must run %s: update='worker' "
                              "takes ps_server --optimizer average (sync) or add (async), "
                              "update='server' the optimizer of server_flags(optimizer)"
                              % self._ps_kind, "start") from None
            raise
        self._ps_ex = ex
        self._ps_update = ex.update
        # the tensors the servers hold; any other of the groups (a group
        # added after wrapping, a tensor unfrozen since) is averaged by
        # allreduce and stepped here (_ps_others)
        self._ps_mine = {id(p) for p in ex.params}
        if how == "auto" and ex.update == "server" and not servers_own:
            self._ps_check_servers(client)
        ex.passes_per_step = k
        ex.push_mode = "backward" if grad_edits is False else "step"
        self._ps_grad_edits = grad_edits
        ex.on_step_start = self._ps_step_start
        self._ps_known = None
        if self._ps_update == "server":
            now = client.hyper()  # what they run now (another worker may have changed it)
            self._ps_kind = now["optimizer"]
            if not servers_own and ex.params:  # (only tables: nothing runs it)
                self._ps_known = {key: now[key] for key in hyper_of(self, self._ps_groups())}
        if tables:  # their first rows, hyper-parameters and forward hook
            _tables.start(ex, model)
        _context.on_start(client, self, ex, model)
        if self._ps_update != "server":
            # every worker starts from rank 0's optimizer state and settings
            sd = _context.broadcast_object(_context._to_cpu(
                super(self.__class__, self).state_dict()), client=client)
            if client.rank != 0:
                super(self.__class__, self).load_state_dict(sd)

    def _ps_check_servers(self, client):
        """update=None and the servers run an optimizer: it must be this
        kind (its hyper-parameters are the torch optimizer's from the first
        step on, as a scheduler's changes are)."""
        now = client.hyper()
        try:
            mine = server_settings(self)
        except ValueError as e:
            client.close()
            raise ValueError("%s; or start the servers with --optimizer average (sync) or add "
                             "(async), and every worker steps its own" % e) from None
        if mine["optimizer"] != now["optimizer"]:
            client.close()
            raise PSError(_EMISMATCH, "optimizer: server has %s, worker %d has %s; start the "
                          "servers with %s, or with --optimizer average (sync) or add (async) "
                          "to step it on the workers" % (now["optimizer"], client.rank,
                                                         mine["optimizer"], server_flags(self)),
                          "start")

    @property
    def exchange(self):
        return self._ps_ex

    @property
    def client(self):
        return self._ps_ex.client

    @property
    def model(self):
        """The wrapped model (ps.torch.DistributedModel): calls it, and
        has finish(), pull_final(), join(), no_sync()."""
        from . import DistributedModel
        if self._ps_model is None:
            raise AttributeError("this DistributedOptimizer was made without model=; its "
                                 "parameters are still trained (step() takes the weights)")
        if self._ps_view is None:
            self._ps_view = DistributedModel._of(self._ps_model, self._ps_ex, self)
        return self._ps_view

    @property
    def tables(self):
        """The model's server tables, by name (model order: prefetch's list
        order): each its weight in the model, a TableWeight (.table.lookup(ids)
        reads rows)."""
        return _tables.tables_of(self._ps_ex)

    def prefetch(self, ids):
        """Hand the ids of an upcoming batch to the model's server tables so
        their rows are fetched while this batch computes: one tensor per
        table (a list in the order of .tables, a dict by name, or the ids
        alone with one table), exactly the ids the module's forward will
        get (its input; any shape).  Batches are taken in the order handed,
        at most two ahead of the step: call it once per step with the next
        batch (and once before the first forward with the first batch, or
        let that forward fetch its own).  prefetching(loader) does this."""
        ex = self._ps_ex
        for t, i in zip(ex.tables, _tables.ids_per_table(ex.tables, ids)):
            t.hand(i)

    def prefetching(self, loader, ids_of):
        """The batches of loader, each one's table ids handed (prefetch) one
        batch ahead: ids_of(batch) is what prefetch takes.  The loop's body
        runs one step per batch, as usual."""
        it = iter(loader)
        try:
            cur = next(it)
        except StopIteration:
            return
        self.prefetch(ids_of(cur))
        for nxt in it:
            self.prefetch(ids_of(nxt))
            yield cur
            cur = nxt
        yield cur

    @property
    def update(self):
        """Where the update runs: 'server', 'worker-sync' or 'worker-async'."""
        return self._ps_update

    # ---- the model leaving the servers (_export.py) ----

    def export(self, path, state=True, dense_tables="auto", **kw):
        """The job's model to the folder path at the step this worker is at:
        ps.torch.export (docs/TORCH.md "Export and serve")."""
        from . import _export
        return _export.export(self, path, state=state, dense_tables=dense_tables, **kw)

    def serving_spec(self):
        """What a ps.torch.Reader needs to read this job while it trains."""
        from . import _export
        return _export.serving_spec(self)

    # ---- each step ----

    def _ps_step_start(self):
        """Before the step's first forward or push (after the exchange's
        check of written weights): changed hyper-parameters go to the
        servers, to apply from this step."""
        if self._ps_update == "server" and self._ps_known is not None:
            self._ps_send_hyper()
        if self._ps_ex.tables:
            _tables.send_hyper(self._ps_ex, self)

    def _ps_groups(self):
        """The parameter groups whose tensors the servers hold."""
        return [g for g in self.param_groups if any(id(p) in self._ps_mine for p in g["params"])]

    def _ps_send_hyper(self):
        groups = self._ps_groups()
        try:
            now = server_settings(self, groups)
        except ValueError as e:
            raise ValueError("the optimizer's hyper-parameters changed to something the servers "
                             "cannot run: %s" % e) from None
        if now["optimizer"] != self._ps_kind:
            raise ValueError("the optimizer became %s, but the servers run %s: the kind cannot "
                             "change during a run" % (now["optimizer"], self._ps_kind))
        want = hyper_of(self, groups)
        change = {k: v for k, v in want.items() if self._ps_known.get(k) != v}
        if change:
            got = self.client.hyper(change, min(self._ps_ex.steps))
            self._ps_known = {k: got[k] for k in want}

    # ---- tensors the servers do not hold ----

    def add_param_group(self, param_group):
        """torch's, after wrapping too (fine-tuning that unfreezes layers):
        the servers hold only the tensors registered at start, so the new
        group's are averaged over the workers at every step (allreduce
        through server 0) and stepped by this optimizer with the group's own
        hyper-parameters, the same update on every worker; rank 0's values
        go to every worker now.  A collective: every worker adds the same
        group at the same step."""
        super(self.__class__, self).add_param_group(param_group)
        if getattr(self, "_ps_ex", None) is None:
            return  # torch's __init__ (not through make)
        if isinstance(self, ServersOptimizer):
            self.param_groups.pop()
            raise ValueError("add_param_group: DistributedOptimizer(model) without a torch "
                             "optimizer has nothing to step new tensors with; wrap a torch "
                             "optimizer (DistributedOptimizer(torch.optim.SGD(...), model=...))")
        fresh = [p for p in self.param_groups[-1]["params"] if id(p) not in self._ps_mine]
        _context.broadcast_tensors([("group:%d" % i, p) for i, p in enumerate(fresh)],
                                   self.client)

    def _ps_others(self):
        """This optimizer's tensors that the servers do not hold and that
        require grad (a frozen one costs nothing), in group order (the same
        on every worker); the server tables' groups are the servers' too."""
        return [p for g in self.param_groups if "ps_table" not in g for p in g["params"]
                if id(p) not in self._ps_mine and p.requires_grad]

    def _ps_average_others(self):
        """The workers' mean gradient into .grad of each tensor the servers
        do not hold (one allreduce; a worker without a gradient adds zeros,
        a tensor no worker has one for keeps .grad None).  Returns those
        tensors."""
        others = self._ps_others()
        if not others:
            return []
        flat = torch.cat([torch.tensor([p.grad is not None], dtype=torch.float32)
                          for p in others] +
                         [(p.grad if p.grad is not None else torch.zeros_like(p))
                          .detach().reshape(-1).float().cpu() for p in others])
        mean = _context.allreduce(flat, client=self.client)
        off = len(others)
        out = []
        with torch.no_grad():
            for k, p in enumerate(others):
                n = p.numel()
                if mean[k] > 0:
                    g = mean[off:off + n].reshape(p.shape).to(device=p.device, dtype=p.dtype)
                    if p.grad is None:
                        p.grad = g
                    else:
                        p.grad.copy_(g)
                    out.append(p)
                off += n
        return out

    def _ps_step_others(self, others):
        """This optimizer's step for the tensors the servers do not hold
        (update on the servers: torch's step over groups holding those
        alone, each with its own settings)."""
        if not others:
            return
        ids = {id(p) for p in others}
        groups = self.param_groups
        self.param_groups = [dict(g, params=[p for p in g["params"] if id(p) in ids])
                             for g in groups]
        try:
            super(self.__class__, self).step()
        finally:
            self.param_groups = groups

    def _ps_push(self):
        """This step's gradients to the servers: .grad as it is now (with
        grad_edits=False, what backward did not push, after the check that
        none it pushed was edited since)."""
        ex = self._ps_ex
        if ex.push_mode == "backward":
            late = [ex.names[i] for i in ex.edited_after_backward() if ex.pushed[i]]
            if late:
                raise RuntimeError(
                    "the gradient of %s changed after backward (clip_grad_norm_, "
                    "GradScaler.unscale_, an edit of .grad), but with grad_edits=False it had "
                    "gone to the servers during backward, so the edit cannot take effect: leave "
                    "grad_edits at its default (None), and gradients go at step()"
                    % ", ".join(late[:3]))
        ex.begin_step()
        ex.push_rest()

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        ex = self._ps_ex
        if ex.closed:
            raise PSError(_lib.ERRORS.index("ECLOSED"), "the exchange is closed", "step")
        if ex.left:
            raise RuntimeError("step() after pull_final() or join(): this worker left the "
                               "servers' rounds (the end of its training); to evaluate mid-run "
                               "call finish() instead")
        if self._ps_skip and not self._ps_synced:
            raise RuntimeError("step() under skip_synchronize() needs synchronize() first")
        if self._ps_update == "worker-async":
            ex.begin_step()
            self._ps_average_others()
            before = ex.stage_deltas()
            super(self.__class__, self).step()
            ex.push_deltas(before)
            ex.note_weights()
            if ex.module is None:
                ex.take_weights()
        elif self._ps_update == "worker-sync":
            if not self._ps_synced:
                self._ps_push()
                ex.means_into_grads()
                self._ps_average_others()
            super(self.__class__, self).step()
            ex.note_weights()
        else:  # the servers apply .grad as it is now (synchronize() left it here)
            self._ps_push()
            self._ps_step_others(self._ps_average_others())
            if ex.module is None:
                ex.take_weights()
        self._ps_synced = False
        self._ps_backwards = ex.backwards
        self._ps_steps += 1
        ex.end_step()
        if self.client.elastic and self._ps_steps % self._ps_members_every == 0:
            self._ps_follow_members()
        if self._ps_buffers_every and self._ps_model is not None and \
                self._ps_steps % self._ps_buffers_every == 0:
            _context.average_buffers(self._ps_model, self.client)
        return loss

    # ---- an elastic job's membership (docs/TORCH.md "Elastic jobs") ----

    def _ps_follow_members(self):
        now = self.client.members()
        old, self._ps_members = self._ps_members, now
        if old is not None and old[2] != now[2]:
            for fn in list(self._ps_members_cb):
                fn(now[0], now[1])

    def membership(self):
        """(rank, size, version): this worker's dense rank among the members,
        their number and the membership's version, as of the last step
        boundary (read after every step in an elastic job, every
        members_every steps; a fixed job: (rank, size, 0))."""
        if self._ps_members is None:
            self._ps_members = self.client.members()
        return self._ps_members

    def on_membership_change(self, fn, every=None):
        """Call fn(rank, size) at the step boundary after which the members
        changed (a worker joined or left), as Horovod Elastic's reset
        callbacks: re-split the data there (ElasticSampler.set_epoch does
        at the next epoch).  every: read the membership every that many
        steps (1)."""
        self._ps_members_cb.append(fn)
        if every is not None:
            if every < 1:
                raise ValueError("every must be at least 1, got %r" % (every,))
            self._ps_members_every = int(every)
        self.membership()
        return fn

    def synchronize(self):
        """Horovod's: with the update on the workers (sync), push this
        step's gradients now, wait for the mean and put it in .grad (clip
        it then, and step() under skip_synchronize()).  With the update on
        the servers nothing comes back to edit: the push waits for step(),
        so an edit after this still reaches them.  After step(), with no
        backward since, there is nothing new: it does nothing."""
        ex = self._ps_ex
        if self._ps_synced or self._ps_update == "worker-async" or \
                ex.backwards == self._ps_backwards:
            return
        if self._ps_update == "worker-sync":
            self._ps_push()
            ex.means_into_grads()
            self._ps_average_others()
            ex.note_grads()  # edits from here on are the user's
        self._ps_synced = True

    def zero_grad(self, set_to_none=False):
        """torch's (in place by default, as torch 1.13's); noted, so the next
        backward's pushes copy the gradient instead of adding it to zeros."""
        super(self.__class__, self).zero_grad(set_to_none)
        self._ps_ex.note_zeroed()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's: step() inside it does not synchronize (call
        synchronize() before)."""
        self._ps_skip = True
        try:
            yield
        finally:
            self._ps_skip = False

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside it accumulate in .grad without a push (as
        DDP's no_sync); the next backward outside pushes the sum, or step()."""
        self._ps_ex.no_sync_depth += 1
        try:
            yield
        finally:
            self._ps_ex.no_sync_depth -= 1

    # ---- state ----

    def state_dict(self):
        """torch's state_dict; with the update on the servers its state is
        theirs (fetched now), so a checkpoint holds it."""
        if self._ps_update == "server":
            self._ps_fetch_state()
        sd = super(self.__class__, self).state_dict()
        if self._ps_ex.tables:
            sd["ps_tables"] = {t.name: t.declaration() for t in self._ps_ex.tables}
        return sd

    def load_state_dict(self, state_dict):
        """torch's; with the update on the servers, rank 0's state goes to
        them (the others' is taken from there), after the requests in
        flight, and the loaded hyper-parameters before the next step.  Its
        tables (ps_tables: their declarations) must be this model's; their
        rows come from the servers' checkpoints."""
        mine = {t.name: t.declaration() for t in self._ps_ex.tables}
        theirs = state_dict.get("ps_tables", {})
        for name, d in theirs.items():
            m = mine.get(name)
            if m is None or (m["key"], m["embedding_dim"]) != (d["key"], d["embedding_dim"]):
                raise ValueError("load_state_dict: table %r of the state (key %#x, dim %d) is not "
                                 "one of this model's server tables (%s)"
                                 % (name, d["key"], d["embedding_dim"], ", ".join(mine) or
                                    "none"))
        state_dict = {k: v for k, v in state_dict.items() if k != "ps_tables"}
        super(self.__class__, self).load_state_dict(state_dict)
        if self._ps_update == "server" and self.client.rank == 0:
            self._ps_store_state()

    def _ps_params(self):
        ex = self._ps_ex
        return list(zip(ex.params, ex.keys, ex.steps))

    def _ps_fetch_state(self):
        ex = self._ps_ex
        ex.finish()
        ns = len(STATE_NAMES[self._ps_kind])
        ce = ex.client.chunk_elems
        reqs = []
        for p, key, pushed in self._ps_params():
            if ns == 0:
                reqs.append((p, None, None, pushed))
                continue
            buf = torch.empty(p.numel() * ns, dtype=torch.float32)
            reqs.append((p, buf, ex.client.state(key, buf, ns), pushed))
        for p, buf, r, pushed in reqs:
            step = r.wait() if r is not None else pushed
            planes = [] if buf is None else _split_planes(buf, p.numel(), ns, ce)
            st = planes_to_state(self._ps_kind, [t.view(p.shape).to(p.device) for t in planes],
                                 step, pushed)
            if st is None:
                self.state.pop(p, None)
            else:
                self.state[p] = st

    def _ps_store_state(self):
        ex = self._ps_ex
        ex.finish()
        ns = len(STATE_NAMES[self._ps_kind])
        ce = ex.client.chunk_elems
        reqs = []
        for p, key, _ in self._ps_params():
            got = state_to_planes(self._ps_kind, self.state.get(p))
            if got is None:
                continue
            planes, step = got
            buf = _join_planes([t.detach().reshape(-1).float().cpu() for t in planes], ns, ce)
            reqs.append(ex.client.set_state(key, buf, ns, step))
        for r in reqs:
            r.wait()

    # ---- the end ----

    def finish(self):
        """Wait for the requests in flight (e.g. before evaluating)."""
        self._ps_ex.finish()

    def pull_final(self):
        """After the last step, on every worker, whatever its step count
        (uneven data: DDP's Join, hvd.join()): this worker leaves the
        servers' rounds, so the others finish their steps without it, waits
        until every worker is done, then takes the servers' final weights
        (where they hold them) and the workers' mean of the model's floating
        buffers.  close(), or the end of the script, does it for a worker
        that did not (after an error: only the leaving).  No step after it:
        to evaluate mid-run, finish()."""
        self._ps_ex.pull_final()

    def join(self):
        """hvd.join(), DDP's Join: pull_final."""
        self._ps_ex.join()

    def take_wait_ns(self):
        return self._ps_ex.take_wait_ns()

    def close(self):
        self._ps_ex.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _split_planes(buf, n, ns, ce):
    """The servers' state of one tensor (chunk after chunk, each chunk's
    arrays one after the other: ps_client_state) as ns flat arrays."""
    out = [torch.empty(n, dtype=torch.float32) for _ in range(ns)]
    for o in range(0, n, ce):
        m = min(ce, n - o)
        for k in range(ns):
            out[k][o:o + m] = buf[o * ns + k * m:o * ns + (k + 1) * m]
    return out


def _join_planes(planes, ns, ce):
    n = planes[0].numel()
    buf = torch.empty(n * ns, dtype=torch.float32)
    for o in range(0, n, ce):
        m = min(ce, n - o)
        for k in range(ns):
            buf[o * ns + k * m:o * ns + (k + 1) * m] = planes[k][o:o + m]
    return buf


def make(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
         op=None, gradient_predivide_factor=1.0, model=None, client=None, update=None,
         grad_edits=None, init_from_rank0=True, wait_timeout=600.0, sync_buffers_every=0,
         tables=None, table_optimizer=None, table_max_ids=_tables.MAX_IDS,
         table_min_bytes=_tables.MIN_BYTES, table_init_max_bytes=_tables.INIT_MAX_BYTES,
         table_hashed_ids=False, samples_per_step=0, tables_from=None):
    """DistributedOptimizer(optimizer, ...): see ps.torch.DistributedOptimizer."""
    del gradient_predivide_factor  # with the mean it changes nothing
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("DistributedOptimizer takes a torch.optim.Optimizer, got %s"
                        % type(optimizer).__name__)
    if op not in (None, Average):
        raise ValueError("op=%r: the servers average the workers' gradients (op=Average); "
                         "for a sum, scale the learning rate by the number of workers" % (op,))
    if update not in (None, "server", "worker"):
        raise ValueError("update must be 'server' (the servers run the optimizer) or 'worker' "
                         "(each worker steps it), got %r" % (update,))
    if int(backward_passes_per_step) < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    chosen = []
    if model is not None:  # its embeddings become server tables, their weights dropped
        chosen = _tables.choose(model, optimizer, tables, table_optimizer, table_max_ids,
                                table_min_bytes, table_init_max_bytes, table_hashed_ids)
        if tables_from is not None:  # the servers imported these: no first rows to send
            from . import _export
            _export.imported_tables(chosen, tables_from)
    elif tables:
        raise ValueError("tables= needs model=: the wrapper replaces the model's embedding "
                         "modules")
    names = {}
    if named_parameters is not None:
        named_parameters = list(named_parameters)
        names = {id(p): n for n, p in named_parameters}
        if len(names) < len(named_parameters):
            raise ValueError("named_parameters names a parameter twice")
    elif model is not None:
        names = {id(p): n for n, p in model.named_parameters()}
    params = [p for g in optimizer.param_groups if not _tables.is_table_group(g)
              for p in g["params"]]
    named = [(names.get(id(p), "param.%d" % i), p) for i, p in enumerate(params)]
    if client is None:
        client = _context.init()
    wire = None if compression is None else parse_wire_dtype(compression)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _Methods.__dict__.items() if k not in ("__dict__", "__weakref__")})
    obj = cls.__new__(cls)
    obj.__dict__.update(optimizer.__dict__)  # the same param_groups and state
    obj._ps_setup(named, model, client, update, int(backward_passes_per_step), grad_edits, wire,
                  init_from_rank0, wait_timeout, sync_buffers_every, chosen)
    obj._ps_ex.samples_per_step = int(samples_per_step)
    return obj
