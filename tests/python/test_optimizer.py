"""DistributedOptimizer tests. Run inside ranks:
    build/krugrun -np N /usr/bin/python3 -m pytest -q tests/python/test_optimizer.py
Every rank runs the same tests in the same order; each test compares distributed training
with a single-process reference computed on every rank from the whole (all ranks') batch."""

import copy
import os
import warnings

import pytest
import torch

import krug.torch as hvd

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
BATCH = 4  # samples per rank per backward pass


def make_model(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, 3)).to(dtype)


def make_data(step, micro=0, dtype=torch.float64):
    """The whole batch of one backward pass: SIZE * BATCH samples (same on every rank)."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(SIZE * BATCH, 5, generator=g, dtype=dtype)
    y = torch.randn(SIZE * BATCH, 3, generator=g, dtype=dtype)
    return x, y


def rank_slice(t, r):
    return t[r * BATCH:(r + 1) * BATCH]


def mse(model, x, y):
    return ((model(x) - y) ** 2).mean()


def assert_same_on_all_ranks(model, tag):
    for name, p in model.named_parameters():
        rows = hvd.allgather(p.detach().reshape(1, -1).contiguous(), name='%s.%s' % (tag, name))
        for r in range(SIZE):
            assert torch.equal(rows[r], rows[0]), (name, r)


def train_pair(make_opt, steps=4, passes=1, dist_kwargs=None, loss_fn=mse, op_sum=False,
               before_step=None, tag='t'):
    """Trains a model with DistributedOptimizer on this rank's slices and a reference copy on
    the whole batch; returns (distributed model, reference model)."""
    model = make_model()
    ref = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **(dist_kwargs or {}))
    ref_opt = make_opt(ref.parameters())
    for step in range(steps):
        opt.zero_grad()
        ref_opt.zero_grad()
        for micro in range(passes):
            x, y = make_data(step, micro)
            (loss_fn(model, rank_slice(x, RANK), rank_slice(y, RANK), RANK) / passes).backward()
            # Reference: the distributed gradient is the average (or sum) over ranks of the
            # local gradients, i.e. the gradient of the average (sum) of the local losses.
            ref_loss = sum(loss_fn(ref, rank_slice(x, r), rank_slice(y, r), r)
                           for r in range(SIZE))
            if not op_sum:
                ref_loss = ref_loss / SIZE
            (ref_loss / passes).backward()
        if before_step is not None:
            before_step(opt, model)
            before_step(ref_opt, ref)
        else:
            opt.step()
        ref_opt.step()
    assert_same_on_all_ranks(model, tag)
    return model, ref


def plain_loss(model, x, y, r):
    return mse(model, x, y)


def assert_close(model, ref, tol=1e-10):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=tol, atol=tol), (name, (p - q).abs().max().item())


SGD = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)  # noqa: E731
ADAM = lambda params: torch.optim.Adam(params, lr=0.01)  # noqa: E731


@pytest.mark.parametrize('make_opt', [SGD, ADAM], ids=['sgd', 'adam'])
def test_matches_single_process(make_opt):
    model, ref = train_pair(make_opt, loss_fn=plain_loss, tag='match')
    assert_close(model, ref)


def test_wrapped_class():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD)
    assert type(opt).__name__ == 'SGD'
    assert hasattr(opt, 'synchronize') and hasattr(opt, 'skip_synchronize')


@pytest.mark.parametrize('passes', [2, 3])
def test_backward_passes_per_step(passes):
    model, ref = train_pair(SGD, steps=3, passes=passes, loss_fn=plain_loss, tag='bpps')
    assert_close(model, ref)


def test_op_sum():
    model, ref = train_pair(SGD, dist_kwargs={'op': hvd.Sum}, loss_fn=plain_loss, op_sum=True,
                            tag='sum')
    assert_close(model, ref)


def test_gradient_predivide_factor():
    model, ref = train_pair(SGD, dist_kwargs={'gradient_predivide_factor': 2.0},
                            loss_fn=plain_loss, tag='predivide')
    assert_close(model, ref)


def test_num_groups():
    with pytest.warns(DeprecationWarning):
        model, ref = train_pair(SGD, dist_kwargs={'num_groups': 2}, loss_fn=plain_loss,
                                tag='numgroups')
    assert_close(model, ref)


@pytest.mark.parametrize('groups', [1, 3, 10])
def test_groups_int(groups):
    model, ref = train_pair(ADAM, dist_kwargs={'groups': groups}, loss_fn=plain_loss,
                            tag='groups%d' % groups)
    assert_close(model, ref)


def test_groups_list():
    model = make_model()
    ref = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(SGD(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   groups=[[model[0].weight, model[2].bias], [model[0].bias]])
    ref_opt = SGD(ref.parameters())
    for step in range(3):
        opt.zero_grad()
        ref_opt.zero_grad()
        x, y = make_data(step)
        mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
        mse(ref, x, y).backward()
        opt.step()
        ref_opt.step()
    assert_same_on_all_ranks(model, 'groupslist')
    assert_close(model, ref)


def test_groups_invalid():
    model = make_model()
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(SGD(model.parameters()), groups=[[model[0].weight, 3]])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(SGD(model.parameters()),
                                 groups=[[model[0].weight], [model[0].weight]])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(SGD(model.parameters()), groups=-1)


def clip_then_step(opt, model):
    if hasattr(opt, 'synchronize'):
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with opt.skip_synchronize():
            opt.step()
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)


def test_skip_synchronize():
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no "step() after synchronize()" warning
        # (This harness runs torch's default threads, one per core, in every rank.)
        warnings.filterwarnings('ignore', message='krug: the .* ranks on this host')
        model, ref = train_pair(SGD, loss_fn=plain_loss, before_step=clip_then_step,
                                tag='skip')
    assert_close(model, ref)


def test_step_after_synchronize_warns():
    model = make_model()
    opt = hvd.DistributedOptimizer(SGD(model.parameters()),
                                   named_parameters=model.named_parameters())
    x, y = make_data(0)
    mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match='skip_synchronize'):
        opt.step()


def test_zero_grad_before_step_raises():
    model = make_model()
    opt = hvd.DistributedOptimizer(SGD(model.parameters()),
                                   named_parameters=model.named_parameters())
    x, y = make_data(0)
    mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
    if SIZE > 1:  # with one rank there are no hooks and nothing in flight
        with pytest.raises(AssertionError, match='zero_grad'):
            opt.zero_grad()
    opt.step()
    opt.zero_grad()


def test_an_unregistered_process_set_fails_instead_of_skipping_the_averaging():
    # Its members must hear that it is not registered: with no hooks they would train on
    # unaveraged gradients without a word.
    if SIZE == 1:
        pytest.skip("with one rank there are no hooks")
    model = make_model()
    ps = hvd.ProcessSet([0])
    assert ps.included() == (RANK == 0)
    opt = hvd.DistributedOptimizer(SGD(model.parameters()),
                                   named_parameters=model.named_parameters(), process_set=ps)
    x, y = make_data(0)
    if RANK == 0:
        with pytest.raises((ValueError, RuntimeError), match="not registered"):
            mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
            opt.step()
    else:
        mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
        opt.step()


def test_too_many_backward_passes_raises():
    model = make_model()
    opt = hvd.DistributedOptimizer(SGD(model.parameters()),
                                   named_parameters=model.named_parameters())
    x, y = make_data(0)
    mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
    if SIZE > 1:
        with pytest.raises(AssertionError, match='backward_passes_per_step'):
            mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
    opt.synchronize()
    assert_same_on_all_ranks(model, 'toomany')


def test_named_parameters_checks():
    model = make_model()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match='unique'):
        hvd.DistributedOptimizer(SGD(model.parameters()),
                                 named_parameters=[('same', p) for _, p in named])
    with pytest.raises(ValueError, match='tuples'):
        hvd.DistributedOptimizer(SGD(model.parameters()), named_parameters=[p for _, p in named])
    with pytest.raises(ValueError, match='not named'):
        hvd.DistributedOptimizer(SGD(model.parameters()), named_parameters=named[:2])
    with pytest.raises(ValueError, match='gradient_predivide_factor'):
        hvd.DistributedOptimizer(SGD(model.parameters()), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)


def test_default_names():
    # named_parameters=None: names derived from positions in the param groups.
    model = make_model()
    ref = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(SGD(model.parameters()))
    ref_opt = SGD(ref.parameters())
    for step in range(2):
        opt.zero_grad()
        ref_opt.zero_grad()
        x, y = make_data(step)
        mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
        mse(ref, x, y).backward()
        opt.step()
        ref_opt.step()
    assert_close(model, ref)


class Branchy(torch.nn.Module):
    """A model whose `extra` layer is used only on rank 0 (and `never` on no rank)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(5, 3).double()
        self.extra = torch.nn.Linear(5, 3).double()
        self.never = torch.nn.Linear(5, 3).double()

    def forward(self, x, use_extra):
        out = self.body(x)
        return out + self.extra(x) if use_extra else out


def test_unused_parameters():
    model = Branchy()
    ref = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        ref_opt.zero_grad()
        x, y = make_data(step)
        ((model(rank_slice(x, RANK), RANK == 0) - rank_slice(y, RANK)) ** 2).mean().backward()
        sum(((ref(rank_slice(x, r), r == 0) - rank_slice(y, r)) ** 2).mean()
            for r in range(SIZE)).div(SIZE).backward()
        opt.step()
        ref_opt.step()
    assert_same_on_all_ranks(model, 'unused')
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-10), name


def test_fp16_compression_converges():
    torch.manual_seed(0)
    true_w = torch.randn(5, 1)
    model = torch.nn.Linear(5, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    losses = []
    for step in range(40):
        g = torch.Generator().manual_seed(step * SIZE + RANK)
        x = torch.randn(16, 5, generator=g)
        y = x @ true_w
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        assert model.weight.dtype == torch.float32 and model.weight.grad.dtype == torch.float32
    assert losses[-1] < 0.05 * losses[0], losses
    assert_same_on_all_ranks(model, 'fp16')


def test_compression_roundtrip():
    t = torch.randn(10, dtype=torch.float64)
    c, ctx = hvd.Compression.fp16.compress(t)
    assert c.dtype == torch.float16
    d = hvd.Compression.fp16.decompress(c, ctx)
    assert d.dtype == torch.float64 and torch.allclose(d, t, rtol=1e-3, atol=1e-3)
    i = torch.arange(5)
    c, ctx = hvd.Compression.fp16.compress(i)
    assert c is i and hvd.Compression.fp16.decompress(c, ctx) is i
    c, ctx = hvd.Compression.none.compress(t)
    assert c is t and hvd.Compression.none.decompress(c, ctx) is t


class Embedder(torch.nn.Module):
    def __init__(self, sparse):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(20, 4, sparse=sparse).double()
        self.out = torch.nn.Linear(4, 1).double()

    def forward(self, idx):
        return self.out(self.emb(idx)).squeeze(-1)


@pytest.mark.parametrize('sparse_as_dense', [False, True])
def test_sparse_gradients(sparse_as_dense):
    model = Embedder(sparse=True)
    ref = Embedder(sparse=False)
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        idx = torch.randint(0, 20, (SIZE * BATCH, 3), generator=g)
        y = torch.randn(SIZE * BATCH, 3, generator=g, dtype=torch.float64)
        opt.zero_grad()
        ref_opt.zero_grad()
        ((model(rank_slice(idx, RANK)) - rank_slice(y, RANK)) ** 2).mean().backward()
        sum(((ref(rank_slice(idx, r)) - rank_slice(y, r)) ** 2).mean()
            for r in range(SIZE)).div(SIZE).backward()
        opt.step()
        ref_opt.step()
    assert_same_on_all_ranks(model, 'sparse%d' % sparse_as_dense)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-10), name


def test_adasum_keeps_ranks_identical():
    # Adasum is part of every build (it runs on the communicators' send/recv), so nothing here
    # is skipped: a build that lost it fails.
    if SIZE & (SIZE - 1):
        with pytest.raises(NotImplementedError, match='power-of-two number of ranks'):
            hvd.allreduce(torch.ones(2), op=hvd.Adasum, name='adasum_npot')
        return
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    before = [p.detach().clone() for p in model.parameters()]
    for step in range(3):
        opt.zero_grad()
        x, y = make_data(step)
        mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
        opt.step()
    assert_same_on_all_ranks(model, 'adasum')
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
    if SIZE > 1:  # with one rank Adasum is the plain DistributedOptimizer
        with pytest.raises(AssertionError):
            with opt.skip_synchronize():
                pass


def test_load_state_dict_resets():
    model = make_model()
    opt = hvd.DistributedOptimizer(ADAM(model.parameters()),
                                   named_parameters=model.named_parameters())
    x, y = make_data(0)
    opt.zero_grad()
    mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
    opt.step()
    opt.load_state_dict(opt.state_dict())
    opt.zero_grad()
    mse(model, rank_slice(x, RANK), rank_slice(y, RANK)).backward()
    opt.step()
    assert_same_on_all_ranks(model, 'loadstate')


def test_threads_that_oversubscribe_the_host_are_named_on_its_first_rank(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)  # krugrun's, for ranks that share a host
    before, cores = torch.get_num_threads(), len(os.sched_getaffinity(0))
    expected = 1 if hvd.local_rank() == 0 and hvd.local_size() > 1 and cores > 1 else 0

    def warnings_naming_the_cure():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hvd.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1))
        return [w for w in caught if "OMP_WAIT_POLICY=PASSIVE" in str(w.message)]

    try:
        torch.set_num_threads(cores)  # every rank of the host as many as its cores
        assert len(warnings_naming_the_cure()) == expected
        # Passive OpenMP threads sleep while they wait: nothing to say.
        monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
        assert warnings_naming_the_cure() == []
        monkeypatch.delenv("OMP_WAIT_POLICY")
        # Nor where they spin briefly, as krugrun has them where ranks share a host.
        monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
        assert warnings_naming_the_cure() == []
        monkeypatch.setenv("GOMP_SPINCOUNT", "300000")  # GNU OpenMP's own
        assert len(warnings_naming_the_cure()) == expected
        monkeypatch.delenv("GOMP_SPINCOUNT")
        torch.set_num_threads(1)
        assert warnings_naming_the_cure() == []
    finally:
        torch.set_num_threads(before)
