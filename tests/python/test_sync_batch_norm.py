"""SyncBatchNorm equals torch BatchNorm on the concatenation of all ranks' batches.
Run inside ranks: build/krugrun -np N /usr/bin/python3 -m pytest -q tests/python/test_sync_batch_norm.py
"""

import copy

import pytest
import torch

import krug.torch as hvd

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def counts(uneven):
    # samples per rank; uneven batches exercise the count-weighted combination
    return [2 + r if uneven else 3 for r in range(SIZE)]


def whole_batch(shape_tail, n, seed, scale=3.0, shift=5.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n,) + shape_tail, generator=g, dtype=torch.float64) * scale + shift
    dy = torch.randn((n,) + shape_tail, generator=g, dtype=torch.float64)
    return x, dy


def bounds(cs, r):
    start = sum(cs[:r])
    return start, start + cs[r]


BN = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
      5: torch.nn.BatchNorm3d}


@pytest.mark.parametrize('tail', [(4,), (4, 5), (3, 2, 3), (2, 2, 2, 2)],
                         ids=['NC', 'NCL', 'NCHW', 'NCDHW'])
@pytest.mark.parametrize('uneven', [False, True])
@pytest.mark.parametrize('affine', [True, False])
def test_forward_backward_match_batchnorm(tail, uneven, affine):
    c = tail[0]
    cs = counts(uneven)
    sync = hvd.SyncBatchNorm(c, affine=affine).double()
    ref = BN[len(tail) + 1](c, affine=affine).double()
    if affine:
        with torch.no_grad():
            sync.weight.copy_(torch.linspace(0.5, 1.5, c))
            sync.bias.copy_(torch.linspace(-1, 1, c))
        ref.load_state_dict(sync.state_dict())
    lo, hi = bounds(cs, RANK)
    for it in range(2):  # twice: running statistics accumulate
        x, dy = whole_batch(tail, sum(cs), seed=it)
        xs = x[lo:hi].clone().requires_grad_()
        xr = x.clone().requires_grad_()
        out = sync(xs)
        out_ref = ref(xr)
        assert torch.allclose(out, out_ref[lo:hi], atol=1e-10)
        out.backward(dy[lo:hi])
        out_ref.backward(dy)
        assert torch.allclose(xs.grad, xr.grad[lo:hi], atol=1e-10)
        assert torch.allclose(sync.running_mean, ref.running_mean, atol=1e-10)
        assert torch.allclose(sync.running_var, ref.running_var, atol=1e-10)
        if affine:
            # parameter gradients are this rank's share; their sum over ranks is the whole's
            gw = hvd.allreduce(sync.weight.grad.clone(), op=hvd.Sum, name='sbn.gw')
            gb = hvd.allreduce(sync.bias.grad.clone(), op=hvd.Sum, name='sbn.gb')
            assert torch.allclose(gw, ref.weight.grad, atol=1e-10)
            assert torch.allclose(gb, ref.bias.grad, atol=1e-10)
            sync.zero_grad()
            ref.zero_grad()
    assert int(sync.num_batches_tracked) == int(ref.num_batches_tracked) == 2


def test_eval_uses_running_stats():
    sync = hvd.SyncBatchNorm(3).double()
    ref = torch.nn.BatchNorm1d(3).double()
    cs = counts(True)
    lo, hi = bounds(cs, RANK)
    x, _ = whole_batch((3,), sum(cs), seed=5)
    sync(x[lo:hi])
    ref(x)
    sync.eval()
    ref.eval()
    x2, _ = whole_batch((3,), 4, seed=RANK + 10)  # local only: no collective in eval
    assert torch.allclose(sync(x2), ref(x2), atol=1e-10)


def test_momentum_none_cumulative_average():
    sync = hvd.SyncBatchNorm(2, momentum=None).double()
    ref = torch.nn.BatchNorm1d(2, momentum=None).double()
    cs = counts(False)
    lo, hi = bounds(cs, RANK)
    for it in range(3):
        x, _ = whole_batch((2,), sum(cs), seed=20 + it)
        sync(x[lo:hi])
        ref(x)
    assert torch.allclose(sync.running_mean, ref.running_mean, atol=1e-10)
    assert torch.allclose(sync.running_var, ref.running_var, atol=1e-10)


def test_no_running_stats():
    sync = hvd.SyncBatchNorm(3, track_running_stats=False).double()
    ref = torch.nn.BatchNorm1d(3, track_running_stats=False).double()
    cs = counts(True)
    lo, hi = bounds(cs, RANK)
    x, _ = whole_batch((3,), sum(cs), seed=30)
    for mode in ('train', 'eval'):  # without running stats eval also uses (global) batch stats
        getattr(sync, mode)()
        getattr(ref, mode)()
        assert torch.allclose(sync(x[lo:hi]), ref(x)[lo:hi], atol=1e-10)


def test_float32_input():
    sync = hvd.SyncBatchNorm(4)
    ref = torch.nn.BatchNorm2d(4)
    cs = counts(False)
    lo, hi = bounds(cs, RANK)
    x, dy = whole_batch((4, 3, 3), sum(cs), seed=40)
    x, dy = x.float(), dy.float()
    xs = x[lo:hi].clone().requires_grad_()
    xr = x.clone().requires_grad_()
    out = sync(xs)
    out_ref = ref(xr)
    assert out.dtype == torch.float32
    assert torch.allclose(out, out_ref[lo:hi], atol=1e-4)
    out.backward(dy[lo:hi])
    out_ref.backward(dy)
    assert torch.allclose(xs.grad, xr.grad[lo:hi], atol=1e-4)


def test_rejects_1d_input():
    with pytest.raises(ValueError):
        hvd.SyncBatchNorm(3)(torch.randn(3))


def test_training_with_distributed_optimizer():
    """A model with SyncBatchNorm trained by DistributedOptimizer matches single-process
    training of the torch BatchNorm model on the whole batch."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                              torch.nn.ReLU(), torch.nn.Linear(4, 1)).double()
    model = copy.deepcopy(ref)
    model[1] = hvd.SyncBatchNorm(4).double()
    model[1].load_state_dict(ref[1].state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    per = 4
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(per * SIZE, 3, generator=g, dtype=torch.float64)
        y = torch.randn(per * SIZE, 1, generator=g, dtype=torch.float64)
        opt.zero_grad()
        ref_opt.zero_grad()
        # local mean loss; SyncBatchNorm's backward gives every rank the gradient of the sum
        # of all ranks' losses, and the optimizer averages: the whole batch's mean loss.
        sl = slice(RANK * per, (RANK + 1) * per)
        ((model(x[sl]) - y[sl]) ** 2).mean().backward()
        ((ref(x) - y) ** 2).mean().backward()
        opt.step()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-9), name


def test_empty_batch_on_one_rank():
    cs = [0] + [3] * (SIZE - 1) if SIZE > 1 else [3]
    sync = hvd.SyncBatchNorm(2).double()
    ref = torch.nn.BatchNorm1d(2).double()
    lo, hi = bounds(cs, RANK)
    x, dy = whole_batch((2, 3), sum(cs), seed=50)
    xs = x[lo:hi].clone().requires_grad_()
    xr = x.clone().requires_grad_()
    out = sync(xs)
    out_ref = ref(xr)
    assert torch.allclose(out, out_ref[lo:hi], atol=1e-10)
    out.backward(dy[lo:hi])
    out_ref.backward(dy)
    assert torch.allclose(xs.grad, xr.grad[lo:hi], atol=1e-10)
    assert torch.allclose(sync.running_var, ref.running_var, atol=1e-10)


def test_a_layer_built_on_one_rank_only_does_not_shift_the_others():
    # An evaluation copy built on rank 0 alone: the layers every rank calls must still meet.
    if SIZE == 1:
        pytest.skip("needs ranks that differ")
    if RANK == 0:
        hvd.SyncBatchNorm(3)
    layer = hvd.SyncBatchNorm(4)
    x = torch.arange(20.0, dtype=torch.float64).reshape(5, 4) * (RANK + 1)
    layer.double()(x.requires_grad_()).sum().backward()
    assert x.grad is not None
