"""broadcast_parameters / broadcast_optimizer_state / broadcast_object / allgather_object.
Run inside ranks: build/krugrun -np N /usr/bin/python3 -m pytest -q tests/python/test_functions.py
"""

import importlib.util
import threading

import pytest
import torch

import krug.torch as hvd

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
ROOTS = sorted({0, SIZE - 1})


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6),
                               torch.nn.Linear(6, 2))


def assert_same_on_all_ranks(tensors, tag):
    for i, t in enumerate(tensors):
        t = t.detach().reshape(1, -1).to(torch.float64).contiguous()
        rows = hvd.allgather(t, name='%s.%d' % (tag, i))
        for r in range(SIZE):
            assert torch.equal(rows[r], rows[0]), (tag, i, r)


@pytest.mark.parametrize('root', ROOTS)
@pytest.mark.parametrize('form', ['state_dict', 'named_parameters', 'parameters'])
def test_broadcast_parameters(root, form):
    model = make_model(seed=100 + RANK)   # different on every rank
    expected = make_model(seed=100 + root)  # what the root has
    if form == 'state_dict':
        hvd.broadcast_parameters(model.state_dict(), root_rank=root)
        pairs = zip(model.state_dict().values(), expected.state_dict().values())
    elif form == 'named_parameters':
        hvd.broadcast_parameters(list(model.named_parameters()), root_rank=root)
        pairs = zip(model.parameters(), expected.parameters())
    else:
        hvd.broadcast_parameters(list(model.parameters()), root_rank=root)
        pairs = zip(model.parameters(), expected.parameters())
    for got, want in pairs:
        assert torch.equal(got, want)
    # still usable by autograd afterwards
    model(torch.randn(3, 4)).sum().backward()


def test_broadcast_parameters_invalid():
    with pytest.raises(ValueError):
        hvd.broadcast_parameters(42, root_rank=0)


def local_steps(model, opt, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(5, 4, generator=g)).pow(2).mean().backward()
        opt.step()


def optimizer_state_tensors(opt):
    sd = opt.state_dict()
    out = []
    for pid in sorted(sd['state']):
        for key in sorted(sd['state'][pid]):
            v = sd['state'][pid][key]
            out.append(v if torch.is_tensor(v) else torch.tensor(float(v)))
    return out


@pytest.mark.parametrize('root', ROOTS)
def test_broadcast_optimizer_state_adam(root):
    model = make_model(seed=RANK)
    opt = torch.optim.Adam(model.parameters(), lr=0.001 * (RANK + 1), betas=(0.8, 0.9 + 0.01 * RANK))
    local_steps(model, opt, RANK + 1, seed=RANK)  # different state (and step counts) per rank
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    assert opt.param_groups[0]['lr'] == pytest.approx(0.001 * (root + 1))
    assert opt.param_groups[0]['betas'] == (0.8, 0.9 + 0.01 * root)
    assert isinstance(opt.param_groups[0]['betas'], tuple)
    assert_same_on_all_ranks(optimizer_state_tensors(opt), 'adamstate%d' % root)
    # the optimizers now evolve identically
    local_steps(model, opt, 2, seed=7)
    assert_same_on_all_ranks(list(model.parameters()), 'adamparams%d' % root)


def test_broadcast_optimizer_state_fresh_optimizer_keeps_params():
    model = make_model(seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    # weight decay would move parameters during the state-creating step; it must not show
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (RANK + 1), momentum=0.9,
                          weight_decay=0.1)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)
        assert p.grad is None
    assert opt.param_groups[0]['lr'] == pytest.approx(0.1)
    assert len(opt.state_dict()['state']) == len(before)


def test_broadcast_optimizer_state_root_has_state_others_fresh():
    model = make_model(seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if RANK == 0:
        local_steps(model, opt, 3, seed=1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert_same_on_all_ranks(optimizer_state_tensors(opt), 'mixedstate')


def test_broadcast_optimizer_state_distributed_optimizer():
    model = make_model(seed=RANK)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01 * (RANK + 1)),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # must not allreduce (no step())
    assert opt.param_groups[0]['lr'] == pytest.approx(0.01)
    g = torch.Generator().manual_seed(RANK)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 4, generator=g)).pow(2).mean().backward()
        opt.step()
    assert_same_on_all_ranks(list(model.parameters()), 'distopt')


def test_broadcast_optimizer_state_lbfgs_rejected():
    model = make_model(seed=0)
    with pytest.raises(ValueError):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)


@pytest.mark.parametrize('root', ROOTS)
def test_broadcast_object(root):
    obj = {'rank': RANK, 'values': list(range(RANK + 3)), 'nested': {'t': torch.arange(RANK + 1)},
           'text': 'x' * (1000 * RANK)}
    got = hvd.broadcast_object(obj if RANK == root else None, root_rank=root)
    assert got['rank'] == root
    assert got['values'] == list(range(root + 3))
    assert torch.equal(got['nested']['t'], torch.arange(root + 1))
    assert got['text'] == 'x' * (1000 * root)


def test_broadcast_object_named_and_large():
    big = bytes(range(256)) * 8192  # 2 MiB
    got = hvd.broadcast_object(big if RANK == 0 else b'', root_rank=0, name='big_object')
    assert got == big


def test_allgather_object():
    obj = {'rank': RANK, 'payload': [RANK] * (RANK * 100)}
    got = hvd.allgather_object(obj)
    assert len(got) == SIZE
    for r, o in enumerate(got):
        assert o == {'rank': r, 'payload': [r] * (r * 100)}
    assert hvd.allgather_object(RANK, name='ints') == list(range(SIZE))


def test_an_object_that_cannot_be_sent_raises_on_every_rank():
    # A lock pickles with neither pickle nor cloudpickle: the others must not wait for it.
    lock = threading.Lock()
    with pytest.raises(ValueError, match=r"rank\(s\) 0 could not send the object"):
        hvd.broadcast_object(lock if RANK == 0 else None, root_rank=0)
    last = SIZE - 1
    with pytest.raises(ValueError, match=r"rank\(s\) {} could not send".format(last)):
        hvd.allgather_object(lock if RANK == last else RANK)
    # The job goes on, and where cloudpickle is installed a lambda travels (as in Horovod).
    travels = (lambda v: v + 1) if importlib.util.find_spec("cloudpickle") else (1).__add__
    add_one = hvd.broadcast_object(travels if RANK == 0 else None, root_rank=0)
    assert add_one(1) == 2
