"""SyncBatchNorm: batch normalization whose batch statistics are computed over the batches of
all ranks (the horovod.torch.SyncBatchNorm API), on CPU tensors.

Forward: every rank computes its per-channel (count, mean, M2 = sum of squared deviations) and
the ranks allgather them; the global mean and variance follow from Chan et al.'s pairwise
combination, which is numerically stable (no sum-of-squares cancellation) and handles ranks
with empty batches. Backward: the two per-channel reductions the input gradient needs
(sum of dy and sum of dy * x_hat over the whole batch) are allreduced. The result equals
torch.nn.BatchNorm on the concatenation of all ranks' batches.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from krug.torch.mpi_ops import Sum, allgather, allreduce, size

def _channels_first(x):
    """(N, C, *) -> (C, N * prod(*))."""
    c = x.shape[1]
    return x.transpose(0, 1).reshape(c, -1)


def _per_channel_shape(x):
    return (1, x.shape[1]) + (1,) * (x.dim() - 2)


class _SyncBatchNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum, name):
        x = input.contiguous()
        flat = _channels_first(x)
        c = flat.shape[0]
        count = flat.shape[1]
        # Statistics in float64 whatever the input dtype: they are few, and it keeps the
        # result as close to the single-process one as the input precision allows.
        flat64 = flat.to(torch.float64)
        if count > 0:
            mean = flat64.mean(dim=1)
            m2 = ((flat64 - mean[:, None]) ** 2).sum(dim=1)
        else:
            mean = flat64.new_zeros(c)
            m2 = flat64.new_zeros(c)
        local = torch.cat([flat64.new_tensor([float(count)]), mean, m2]).reshape(1, 2 * c + 1)
        gathered = allgather(local, name=name + '.stats')
        counts = gathered[:, 0]                          # (R,)
        means = gathered[:, 1:c + 1]                     # (R, C)
        m2s = gathered[:, c + 1:]                        # (R, C)
        total = counts.sum()
        if total.item() <= 1:
            raise ValueError('Expected more than 1 value per channel when training, got input '
                             'size {} summed over all ranks'.format(list(input.shape)))
        g_mean = (counts[:, None] * means).sum(dim=0) / total
        g_m2 = m2s.sum(dim=0) + (counts[:, None] * (means - g_mean) ** 2).sum(dim=0)
        var = g_m2 / total
        invstd = torch.rsqrt(var + eps)

        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype),
                                                     alpha=momentum)
                unbiased = g_m2 / (total - 1)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype),
                                                    alpha=momentum)

        shape = _per_channel_shape(x)
        mean_t = g_mean.to(x.dtype).reshape(shape)
        invstd_t = invstd.to(x.dtype).reshape(shape)
        out = (x - mean_t) * invstd_t
        if weight is not None:
            out = out * weight.reshape(shape)
        if bias is not None:
            out = out + bias.reshape(shape)
        ctx.save_for_backward(x, weight, mean_t, invstd_t)
        ctx.total = total.item()
        ctx.has_bias = bias is not None
        ctx.name = name
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, mean_t, invstd_t = ctx.saved_tensors
        dy = grad_output.contiguous()
        shape = mean_t.shape
        xhat = (x - mean_t) * invstd_t
        dims = [0] + list(range(2, x.dim()))
        sum_dy = dy.sum(dim=dims)
        sum_dy_xhat = (dy * xhat).sum(dim=dims)

        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # The input gradient depends on the reductions over the whole (all ranks') batch.
            c = sum_dy.numel()
            both = allreduce(torch.cat([sum_dy, sum_dy_xhat]).to(torch.float64), op=Sum,
                             name=ctx.name + '.grad')
            mean_dy = (both[:c] / ctx.total).to(x.dtype).reshape(shape)
            mean_dy_xhat = (both[c:] / ctx.total).to(x.dtype).reshape(shape)
            scale = invstd_t if weight is None else invstd_t * weight.reshape(shape)
            grad_input = scale * (dy - mean_dy - xhat * mean_dy_xhat)
        # Parameter gradients stay local (this rank's share); DistributedOptimizer reduces them.
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = sum_dy
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Applies synchronous batch normalization over an input of shape (N, C, *): in training,
    the mean and variance are those of the batches of all ranks together.

    Arguments are those of torch.nn.BatchNorm*d. In evaluation mode with running statistics it
    is a plain local batch norm; with one rank it is torch.nn.functional.batch_norm.

    Every rank must call the layer the same number of times in the same order (each call is a
    collective).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features=num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats)
        # One name for every layer, as Horovod's: each call completes before the next starts,
        # and a per-layer number would differ across ranks that built different numbers of
        # layers (an evaluation copy on rank 0), pairing the wrong layers until a stall.
        self._krug_name = 'sync_batch_norm'

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError('expected at least 2D input (got {}D input)'.format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)

        # Same momentum bookkeeping as torch.nn.BatchNorm (momentum=None: cumulative average).
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)

        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or size() == 1:
            return F.batch_norm(
                input,
                self.running_mean if not self.training or self.track_running_stats else None,
                self.running_var if not self.training or self.track_running_stats else None,
                self.weight, self.bias, use_batch_stats, factor, self.eps)

        update_running = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias,
            self.running_mean if update_running else None,
            self.running_var if update_running else None,
            self.eps, factor, self._krug_name)
