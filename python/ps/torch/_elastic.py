"""ps.torch.sampler() for elastic jobs (docs/TORCH.md "Elastic jobs"):
torch's DistributedSampler whose rank and number of replicas follow the
membership at each epoch, as Horovod Elastic's ElasticSampler re-splits on
a reset.  set_epoch(e) reads the membership (ps.torch.membership(): this
worker's dense rank among the members and their number); the epoch's order
is torch's, drawn from (seed, epoch), the same on every worker, so the
members' shares are a partition of it (padded, or with drop_last cut, as
torch does).  Call set_epoch at the same step on every worker; a join or
leave that races it can give two workers different views for that epoch.
"""

import math

import torch

from . import _context


class ElasticSampler(torch.utils.data.DistributedSampler):
    def __init__(self, dataset, shuffle=True, seed=0, drop_last=False, membership=None):
        """membership: a function returning (rank, size, version); default
        ps.torch.membership (the started client's view)."""
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self._membership = membership or _context.membership

    def set_epoch(self, epoch):
        """Split epoch `epoch` among the members now."""
        super().set_epoch(epoch)
        rank, size, _ = self._membership()
        if rank < 0:
            raise RuntimeError("this worker is not a member of the job (it left, or was "
                               "removed after --worker-timeout): it has no share of the data")
        self.rank, self.num_replicas = rank, size
        n = len(self.dataset)
        # as DistributedSampler.__init__ sizes the shares
        if self.drop_last and n % size:
            self.num_samples = math.ceil((n - size) / size)
        else:
            self.num_samples = math.ceil(n / size)
        self.total_size = self.num_samples * size
