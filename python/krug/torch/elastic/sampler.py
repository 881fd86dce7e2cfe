"""ElasticSampler: a DistributedSampler that resumes an epoch where a reset left it."""
import torch
import torch.utils.data

from krug.torch.mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Deals an epoch's indices of ``dataset`` to the ranks and remembers which were processed,
    so that after a reset (a new number of ranks) the rest of the epoch is dealt to the new ranks:
    no sample is trained twice or skipped beyond the last commit.

    Every rank shuffles identically (``seed`` + epoch); the indices not yet processed are padded
    to a multiple of the number of ranks by wrapping around, and rank r takes positions
    r, r + n, r + 2n, ... So with a per-rank batch of b, the n local batches of step j are
    together positions [j*b*n, (j+1)*b*n) of the remaining order: a job that keeps the global
    batch b*n constant trains on the same global batches whatever n is.

    Call ``record_batch(batch_idx, batch_size)`` after each step (or ``record_indices``) and
    ``set_epoch(epoch)`` at each epoch's start; a TorchState given the sampler saves, restores
    and syncs what was processed.

    Unlike Horovod's, ``record_batch`` records the step's batch of *every* rank (data-parallel
    steps are synchronous, and the dealing is known to all): so every rank's record is the
    same, and what a rank that dies had processed is not lost and trained again."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.reset()

    def set_epoch(self, epoch):
        """Starts `epoch`: nothing processed yet, a new shuffle."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks step `batch_idx` (local batches of `batch_size` samples) as processed on every
        rank: positions [batch_idx * batch_size * n, (batch_idx + 1) * batch_size * n) of this
        dealing's padded order."""
        start = batch_idx * batch_size * self.num_replicas
        self.record_indices(self.padded_indices[start:start + batch_size * self.num_replicas])

    def record_indices(self, indices):
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx, batch_size):
        """The dataset indices of this rank's local batch `batch_idx`."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def reset(self):
        """Re-deals the rest of the epoch to the current ranks (call after a reset)."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = -(-len(self.remaining_indices) // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:
            padded += padded[:self.total_size - len(padded)]
        self.padded_indices = padded
        self.indices = padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
