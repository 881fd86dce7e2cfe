"""broadcast_optimizer_state for every optimizer torch.optim has, on a model where some
parameters never get a gradient (a frozen layer and an unused one), with ranks whose states
differ: some stepped, some never did, each with its own hyperparameters.
Run inside ranks:
build/krugrun -np N /usr/bin/python3 -m pytest -q tests/python/test_broadcast_optimizer_state.py
"""

import copy

import pytest
import torch

import krug.torch as hvd

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
ROOTS = sorted({0, SIZE - 1})
# Horovod rejects LBFGS's nested state; so does krug (test_functions checks the ValueError).
NOT_BROADCASTABLE = {torch.optim.LBFGS: 'its state cannot be broadcast, as in Horovod'}


def optimizer_classes():
    """Every Optimizer subclass torch.optim exports, found at run time so that one a newer torch
    adds is tested too."""
    found = {c for c in vars(torch.optim).values()
             if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)
             and c is not torch.optim.Optimizer}
    return sorted(found, key=lambda c: c.__name__)


class Net(torch.nn.Module):
    """Embeddings then linear layers. ``frozen`` takes part in the forward pass but never
    requires a gradient; ``unused`` requires one and never gets it. With ``sparse`` the
    embeddings give sparse gradients (SparseAdam needs them and nothing else); without
    ``bias`` every parameter is a matrix (Muon takes nothing else)."""

    def __init__(self, sparse, bias):
        super().__init__()
        self.sparse = sparse
        self.embed = torch.nn.Embedding(8, 4, sparse=sparse)
        self.frozen = torch.nn.Embedding(8, 4, sparse=sparse)
        self.frozen.weight.requires_grad_(False)
        self.unused = torch.nn.Embedding(8, 4, sparse=sparse)
        if not sparse:
            self.hidden = torch.nn.Linear(4, 5, bias=bias)
            self.head = torch.nn.Linear(5, 2, bias=bias)

    def forward(self, idx):
        x = self.embed(idx) * self.frozen(idx)
        if not self.sparse:
            x = self.head(torch.tanh(self.hidden(x)))
        return x.pow(2).mean()

    def param_groups(self, lr):
        """Two groups with different learning rates, each with a parameter that never gets a
        gradient."""
        if self.sparse:
            first = [self.embed.weight, self.frozen.weight]
            second = [self.unused.weight]
        else:
            first = [self.embed.weight, self.frozen.weight, *self.hidden.parameters()]
            second = [*self.head.parameters(), self.unused.weight]
        return [{'params': first, 'lr': lr}, {'params': second, 'lr': lr / 2}]


def make(cls, rank):
    """(model, optimizer) with ``rank``'s hyperparameters, or (None, why not) where the class
    cannot be built on the model, with biases or without, or cannot step on it."""
    lr = 0.01 * (rank + 1)
    for bias in (True, False):
        torch.manual_seed(100 + rank)
        model = Net(sparse=cls is torch.optim.SparseAdam, bias=bias)
        try:
            opt = cls(model.param_groups(lr), lr=lr)
            break
        except Exception as e:  # what refuses a model differs by class and torch version
            refusal = 'cannot be built on this model: %s: %s' % (type(e).__name__, e)
    else:
        return None, refusal
    # Rank 0 has no momentum, no AMSGrad and no centered RMSprop: its state lacks the buffers
    # the others have for them (or, in torch 1.13's SGD, holds None for momentum).
    rank_options = {'weight_decay': 0.001 * (rank + 1), 'momentum': 0.3 * min(rank, 1),
                    'amsgrad': rank != 0, 'centered': rank != 0}
    for group in opt.param_groups:
        for key, value in rank_options.items():
            # numbers for numbers, flags for flags (a tensor-valued option stays)
            if key in group and type(group[key]) in (int, float, bool) and \
                    isinstance(value, bool) == isinstance(group[key], bool):
                group[key] = value
    try:
        trial = copy.deepcopy((model, opt))
        take_steps(*trial, steps=1, seed=0)
    except Exception as e:
        return None, 'cannot step on this model: %s: %s' % (type(e).__name__, e)
    return model, opt


def take_steps(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randint(0, 8, (6,), generator=g)).backward()
        opt.step()


def assert_bitwise_equal(got, want, where):
    assert type(got) is type(want), (where, type(got), type(want))
    if torch.is_tensor(want):
        assert (got.dtype, got.shape, got.device) == (want.dtype, want.shape, want.device), where
        as_bytes = (lambda t: t.detach().cpu().contiguous().reshape(-1).view(torch.uint8))
        assert torch.equal(as_bytes(got), as_bytes(want)), (where, got, want)
    elif isinstance(want, dict):
        assert sorted(got, key=str) == sorted(want, key=str), where
        for key in want:
            assert_bitwise_equal(got[key], want[key], '%s[%r]' % (where, key))
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_bitwise_equal(g, w, '%s[%d]' % (where, i))
    else:
        assert got == want, (where, got, want)


@pytest.mark.parametrize('root', ROOTS)
@pytest.mark.parametrize('cls', optimizer_classes(), ids=lambda c: c.__name__)
def test_every_rank_gets_the_roots_state(cls, root):
    if cls in NOT_BROADCASTABLE:
        pytest.skip('%s: %s' % (cls.__name__, NOT_BROADCASTABLE[cls]))
    model, opt = make(cls, RANK)
    # Ranks differ in hyperparameters, so one might refuse what another takes: all skip then.
    refusals = hvd.allgather_object(None if model is not None else opt, name='refusals')
    refusals = ['rank %d: %s' % (r, why) for r, why in enumerate(refusals) if why is not None]
    if refusals:
        pytest.skip('%s %s' % (cls.__name__, '; '.join(refusals)))
    # Rank 1 never steps (its state is created by the call); the others step as many times as
    # their rank plus one, on their own data.
    if RANK != 1:
        take_steps(model, opt, steps=RANK + 1, seed=RANK)
    before = copy.deepcopy(opt.state_dict())

    hvd.broadcast_optimizer_state(opt, root_rank=root)

    mine = opt.state_dict()
    roots = hvd.broadcast_object(mine, root_rank=root, name='roots_state_dict')
    assert_bitwise_equal(mine, roots, '%s state_dict' % cls.__name__)
    if RANK == root:
        # the root's own state is left as it was (created, if it never stepped)
        compared = before if RANK != 1 else {'param_groups': before['param_groups']}
        assert_bitwise_equal({k: mine[k] for k in compared}, compared,
                             '%s root state_dict' % cls.__name__)
    # the hyperparameters are the root's, so the ranks step alike from here
    lr = 0.01 * (root + 1)
    assert [g['lr'] for g in opt.param_groups] == [lr, lr / 2]
    assert not model.frozen.weight.requires_grad and model.frozen.weight.grad is None
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    take_steps(model, opt, steps=2, seed=7)
    params = hvd.broadcast_object(model.state_dict(), root_rank=root, name='roots_params')
    assert_bitwise_equal(model.state_dict(), params, '%s parameters' % cls.__name__)
