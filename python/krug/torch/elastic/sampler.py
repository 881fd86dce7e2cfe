"""ElasticSampler: deals an epoch's examples to the ranks and survives resets."""

import torch.utils.data

from krug.torch import mpi_ops


def _topology():
    # One lookup point for (rank, size), which tests replace to lay out n ranks in one process.
    return mpi_ops.rank(), mpi_ops.size()


class ElasticSampler(torch.utils.data.Sampler):
    """A distributed sampler that remembers which examples of the epoch were trained on, so
    that after a reset the rest of the epoch is dealt to the new set of ranks.

    Each epoch the indices ``0 .. len(dataset)-1`` are shuffled with ``seed + epoch`` (the
    same order on every rank). The *remaining* ones (not yet processed) are padded to a
    multiple of the number of ranks n by repeating from the start, and rank r takes
    positions r, r + n, r + 2n, ... With a per-rank batch b, the n local batches of step j
    are together exactly positions ``[j*b*n, (j+1)*b*n)`` of the remaining order. So a job
    that keeps its global batch ``b*n`` constant trains on the same global batches in the
    same order whatever n is and however often it is reset (only the padding of an epoch's
    last batch depends on n).

        sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=42)
        state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
        ...
        for i in range(-(-len(sampler) // b)):       # this rank's steps since the reset
            x = dataset[sampler.get_indices(i, b)]
            ... train on x ...
            sampler.record_batch(i, b)
            state.commit()
        sampler.set_epoch(epoch + 1)

    It also works as ``DataLoader(dataset, batch_size=b, sampler=sampler)``: iterating it
    yields this rank's share of the remaining indices. Batch numbers given to
    :meth:`get_indices` and :meth:`record_batch` count from the last :meth:`reset` (or
    :meth:`set_epoch`), as a DataLoader loop started after the reset counts them. Requires
    ``krug.torch.init()`` before construction (it reads the rank and size).
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.reset()

    def set_epoch(self, epoch):
        """Starts ``epoch``: forgets the processed indices and deals the epoch's new order
        (identical on every rank)."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def reset(self):
        """Re-reads the rank and size and deals the epoch's remaining indices among the
        ranks. Called after a reset of krug (TorchState does it) and by the methods that
        change the epoch or the processed indices."""
        self.rank, self.num_replicas = _topology()
        self.remaining_indices = [i for i in self._epoch_order()
                                  if i not in self.processed_indices]
        n, remaining = self.num_replicas, self.remaining_indices
        self.num_samples = -(-len(remaining) // n)
        self.total_size = self.num_samples * n
        # Wrap around (several times if fewer remain than ranks) so every rank gets as many.
        self._padded = [remaining[i % len(remaining)] for i in range(self.total_size)]
        self.indices = self._padded[self.rank::n]

    def _epoch_order(self):
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices for local batch ``batch_idx`` (counted since the last reset)
        of ``batch_size`` examples; the last one may be shorter, and empty past the end."""
        return self.indices[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def record_batch(self, batch_idx, batch_size):
        """Marks batch ``batch_idx`` of ``batch_size`` as processed: this rank's, and with it
        the other ranks' batches of the same step (every rank knows how the remaining order
        is dealt). So every rank records the whole global batch, and a rank that dies does
        not take its record of the committed batches with it. Every rank must use the same
        ``batch_size``."""
        stop = min((batch_idx + 1) * batch_size, self.num_samples)
        start = min(batch_idx * batch_size, stop)
        n = self.num_replicas
        self.processed_indices.update(self._padded[start * n:stop * n])

    def record_indices(self, indices):
        """Marks ``indices`` as processed on this rank only; the ranks' records are merged at
        the next state sync (after a failure, or when workers join)."""
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self):
        """The epoch and the processed indices (plain Python values, picklable)."""
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state_dict):
        """Takes the epoch and processed indices of :meth:`state_dict` and deals the rest of
        the epoch to the current ranks."""
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self):
        """Number of indices this rank iterates (its share of the remaining ones)."""
        return self.num_samples
