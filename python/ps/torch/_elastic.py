"""A sampler for elastic jobs (docs/TORCH.md "Elastic jobs"): torch's
DistributedSampler whose rank and number of replicas follow the membership
at each epoch, as Horovod Elastic's ElasticSampler re-splits on a reset.

Each epoch's order is a permutation drawn from (seed, epoch), the same on
every worker; set_epoch(e) reads the membership (ps.torch.membership())
and this worker takes every size-th index of it from its dense rank, the
order padded to a multiple of size, so every member gets as many batches.
Two workers that read the membership on either side of a change (a join
racing the epoch boundary) split that epoch differently: call set_epoch at
the same step on every worker (the start of an epoch, after step()), and
the next epoch agrees again.
"""

import torch
from torch.utils.data import Sampler

from . import _context


class ElasticSampler(Sampler):
    def __init__(self, dataset, shuffle=True, seed=0, membership=None):
        """membership: a function returning (rank, size, version); default
        ps.torch.membership (the started client's view)."""
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._membership = membership or _context.membership
        self.rank, self.num_replicas = 0, 1

    def set_epoch(self, epoch):
        """Take the membership now and split epoch `epoch` among its members."""
        self.epoch = epoch
        rank, size, _ = self._membership()
        if rank < 0:
            raise RuntimeError("this worker is not a member of the job (it left, or was "
                               "removed after --worker-timeout): it has no share of the data")
        self.rank, self.num_replicas = rank, size

    def _indices(self):
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        total = -(-n // self.num_replicas) * self.num_replicas
        order += order[:total - n]  # padded: every member as many
        return order[self.rank:total:self.num_replicas]

    def __iter__(self):
        return iter(self._indices())

    def __len__(self):
        return -(-len(self.dataset) // self.num_replicas)
