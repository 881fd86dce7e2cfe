"""krug.torch collectives on CUDA tensors, against references every rank computes on the CPU
from the other ranks' inputs (each rank's data comes from a seed it shares).

Every rank runs the same tests in the same order (collectives pair up by name). The plane is
whatever KRUG_GPU_OPERATIONS says (scripts/gpu-check runs this file under nccl and under host);
inputs are small integers, so sums, products and the power-of-two scale factors are exact in
every dtype and results can be compared exactly whatever order the plane reduces in."""

import math
import zlib

import pytest
import torch

import krug.torch as hvd

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
        torch.uint32, torch.uint64]
OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
       "product": hvd.Product}


def cuda():
    return torch.device("cuda", torch.cuda.current_device())


def data(rank, shape, dtype, seed, low=-4, high=5):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    if not dtype.is_signed:
        low, high = 0, 4
    return torch.randint(low, high, shape, generator=g).to(dtype)


def ranks_data(shape, dtype, seed, **kw):
    return [data(r, shape, dtype, seed, **kw) for r in range(hvd.size())]


def scale_ref(t, factor, dtype):
    """What krug's scale does (Horovod's rule): float64 in float64; the other floats in float32,
    with the factor rounded to float32; integers in float64, truncated."""
    if dtype.is_floating_point and dtype != torch.float64:
        return (t.float() * torch.tensor(factor, dtype=torch.float32)).double()
    x = t.to(torch.float64) * factor
    return torch.trunc(x) if not dtype.is_floating_point else x


def reduce_ref(inputs, op, dtype, prescale=1.0, postscale=1.0):
    xs = [scale_ref(t, prescale, dtype) for t in inputs]
    if not dtype.is_floating_point:
        xs = [x.to(dtype).to(torch.float64) for x in xs]
    stacked = torch.stack(xs)
    if op in ("sum", "average"):
        out = stacked.sum(0)
    elif op == "min":
        out = stacked.min(0).values
    elif op == "max":
        out = stacked.max(0).values
    else:
        out = stacked.prod(0)
    if not dtype.is_floating_point:
        out = out.to(dtype).to(torch.float64)  # the integer reduction wraps like the dtype
    post = postscale / (hvd.size() if op == "average" else 1)
    return scale_ref(out, post, dtype).to(dtype)


def check(out, want, what):
    assert out.device.type == "cuda", "%s: result on %s, not on the GPU" % (what, out.device)
    got = out.cpu()
    assert got.dtype == want.dtype, "%s: dtype %s, want %s" % (what, got.dtype, want.dtype)
    assert got.shape == want.shape, "%s: shape %s, want %s" % (what, got.shape, want.shape)
    if want.dtype.is_floating_point:
        tol = 1e-2 if want.dtype in (torch.float16, torch.bfloat16) else 1e-6
        assert torch.allclose(got.double(), want.double(), rtol=tol, atol=tol), \
            "%s: got %s, want %s" % (what, got.flatten()[:8], want.flatten()[:8])
    else:
        assert torch.equal(got, want), "%s: got %s, want %s" % (what, got.flatten()[:8],
                                                                 want.flatten()[:8])


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_allreduce_every_op_and_dtype(op, dtype):
    if op == "product" and dtype in (torch.uint8, torch.int8):
        pytest.skip("products of several ranks overflow 8-bit integers")
    seed = zlib.crc32(("%s %s" % (op, dtype)).encode()) % 1000  # the same on every rank
    shape = (3, 37)  # odd sizes on purpose
    inputs = ranks_data(shape, dtype, seed, low=-2 if op == "product" else -4,
                        high=3 if op == "product" else 5)
    scaled = dtype.is_floating_point and op != "product"
    pre, post = (0.5, 4.0) if scaled else (1.0, 1.0)
    x = inputs[hvd.rank()].to(cuda())
    out = hvd.allreduce(x, name="gpu.ar.%s.%s" % (op, dtype), op=OPS[op], prescale_factor=pre,
                        postscale_factor=post)
    check(out, reduce_ref(inputs, op, dtype, pre, post), "allreduce %s %s" % (op, dtype))
    check(x, inputs[hvd.rank()], "allreduce input left alone")


def test_allreduce_in_place_and_zero_size():
    inputs = ranks_data((1000,), torch.float32, 11)
    x = inputs[hvd.rank()].to(cuda())
    hvd.allreduce_(x, name="gpu.ar.inplace", op=hvd.Sum)
    check(x, reduce_ref(inputs, "sum", torch.float32), "in-place allreduce")
    empty = torch.empty(0, device=cuda())
    out = hvd.allreduce(empty, name="gpu.ar.empty", op=hvd.Sum)
    assert out.numel() == 0 and out.is_cuda


def test_grouped_allreduce_fuses_on_the_device():
    shapes = [(5,), (17, 3), (1,), (256, 4)]
    inputs = [ranks_data(s, torch.float32, 20 + i) for i, s in enumerate(shapes)]
    xs = [inp[hvd.rank()].to(cuda()) for inp in inputs]
    outs = hvd.grouped_allreduce(xs, name="gpu.grouped", op=hvd.Average)
    for i, out in enumerate(outs):
        check(out, reduce_ref(inputs[i], "average", torch.float32), "grouped member %d" % i)


def test_many_async_allreduces_fuse():
    inputs = [ranks_data((64,), torch.float32, 40 + i) for i in range(12)]
    handles = [hvd.allreduce_async(inp[hvd.rank()].to(cuda()), name="gpu.fuse.%d" % i,
                                   op=hvd.Sum) for i, inp in enumerate(inputs)]
    for i, h in enumerate(handles):
        check(hvd.synchronize(h), reduce_ref(inputs[i], "sum", torch.float32), "fused %d" % i)


def test_allgather_with_uneven_first_dimensions():
    for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8):
        inputs = [data(r, (r + 1, 3), dtype, 60) for r in range(hvd.size())]
        out = hvd.allgather(inputs[hvd.rank()].to(cuda()), name="gpu.ag.%s" % dtype)
        check(out, torch.cat(inputs), "allgather %s" % dtype)
    # Even first dimensions take NCCL's allgather itself.
    inputs = [data(r, (4, 2), torch.float32, 61) for r in range(hvd.size())]
    out = hvd.allgather(inputs[hvd.rank()].to(cuda()), name="gpu.ag.even")
    check(out, torch.cat(inputs), "allgather even")


def test_broadcast_from_every_root():
    for root in range(hvd.size()):
        inputs = ranks_data((9, 5), torch.float32, 70 + root)
        x = inputs[hvd.rank()].to(cuda())
        out = hvd.broadcast(x, root_rank=root, name="gpu.bc.%d" % root)
        check(out, inputs[root], "broadcast from %d" % root)
        hvd.broadcast_(x, root_rank=root, name="gpu.bc_.%d" % root)
        check(x, inputs[root], "in-place broadcast from %d" % root)


def test_alltoall_with_splits():
    n = hvd.size()
    # Rank s sends (s + d) % 3 + 1 rows to rank d.
    rows = [[(s + d) % 3 + 1 for d in range(n)] for s in range(n)]
    inputs = [data(s, (sum(rows[s]), 4), torch.float32, 80) for s in range(n)]
    me = hvd.rank()
    out, received = hvd.alltoall(inputs[me].to(cuda()), splits=rows[me], name="gpu.a2a")
    want = []
    for s in range(n):
        start = sum(rows[s][:me])
        want.append(inputs[s][start:start + rows[s][me]])
    check(out, torch.cat(want), "alltoall")
    assert received.tolist() == [rows[s][me] for s in range(n)]


def test_reducescatter_uneven():
    n = hvd.size()
    for op in ("sum", "average"):
        inputs = ranks_data((2 * n + 1, 3), torch.float32, 90)
        out = hvd.reducescatter(inputs[hvd.rank()].to(cuda()), name="gpu.rs.%s" % op,
                                op=OPS[op], prescale_factor=0.5, postscale_factor=2.0)
        full = reduce_ref(inputs, op, torch.float32, 0.5, 2.0)
        counts = [(2 * n + 1) // n + (1 if r < (2 * n + 1) % n else 0) for r in range(n)]
        start = sum(counts[:hvd.rank()])
        check(out, full[start:start + counts[hvd.rank()]], "reducescatter %s" % op)


def test_ready_event_orders_a_side_stream():
    """The input is written on a side stream just before the enqueue: the engine must wait for
    that stream's event, not for the default stream."""
    inputs = ranks_data((1 << 20,), torch.float32, 100)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(1 << 20, device=cuda())
        for _ in range(20):  # enough kernels that the stream is still busy at the enqueue
            x.mul_(1.0)
        x.add_(inputs[hvd.rank()].to(cuda(), non_blocking=True))
        h = hvd.allreduce_async(x, name="gpu.sidestream", op=hvd.Sum)
    out = hvd.synchronize(h)
    check(out, reduce_ref(inputs, "sum", torch.float32), "side-stream input")


def test_cpu_and_cuda_tensors_in_one_process():
    a = ranks_data((33,), torch.float32, 110)
    b = ranks_data((33,), torch.float32, 111)
    h_gpu = hvd.allreduce_async(a[hvd.rank()].to(cuda()), name="gpu.mixed.cuda", op=hvd.Sum)
    h_cpu = hvd.allreduce_async(b[hvd.rank()], name="gpu.mixed.cpu", op=hvd.Sum)
    out_cpu = hvd.synchronize(h_cpu)
    check(hvd.synchronize(h_gpu), reduce_ref(a, "sum", torch.float32), "CUDA beside CPU")
    assert out_cpu.device.type == "cpu"
    assert torch.equal(out_cpu, reduce_ref(b, "sum", torch.float32))


def test_device_mismatch_across_ranks_fails_on_every_rank():
    if hvd.size() < 2:
        pytest.skip("needs two ranks")
    x = torch.ones(8)
    if hvd.rank() == 0:
        x = x.to(cuda())
    with pytest.raises(Exception, match="Mismatched devices"):
        hvd.allreduce(x, name="gpu.mismatch")
    # The engine goes on.
    out = hvd.allreduce(torch.ones(4, device=cuda()), name="gpu.after_mismatch", op=hvd.Sum)
    check(out, torch.full((4,), float(hvd.size())), "allreduce after a mismatch")


def test_adasum_on_cuda_matches_cpu():
    n = hvd.size()
    if n & (n - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    x = data(hvd.rank(), (50,), torch.float32, 120).float() + 0.5
    on_cpu = hvd.allreduce(x, name="gpu.adasum.cpu", op=hvd.Adasum)
    on_gpu = hvd.allreduce(x.to(cuda()), name="gpu.adasum.cuda", op=hvd.Adasum)
    assert on_gpu.is_cuda
    assert torch.allclose(on_gpu.cpu(), on_cpu, rtol=1e-5, atol=1e-5)


def test_distributed_optimizer_on_a_cuda_model():
    torch.manual_seed(1234 + hvd.rank())  # different initial weights: broadcast must fix them
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2)).to(cuda())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(5 + hvd.rank())  # each rank its own batches
    first = last = None
    for _ in range(15):
        xb = torch.randn(32, 8, generator=g).to(cuda())
        yb = (xb[:, :1] > 0).long().squeeze(1)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert flat.is_cuda
    every = hvd.allgather(flat.unsqueeze(0), name="gpu.opt.params")
    for r in range(hvd.size()):
        assert torch.equal(every[r], every[0]), "rank %d's parameters differ from rank 0's" % r
    assert math.isfinite(last) and last < first, "loss went %s -> %s" % (first, last)


def test_sync_batch_norm_on_cuda_matches_the_whole_batch():
    n = hvd.size()
    batches = [torch.randn(4 + r, 3, 5, generator=torch.Generator().manual_seed(130 + r))
               for r in range(n)]
    total = sum(b.shape[0] for b in batches)
    # A weighted loss: the plain sum of a normalized output has a zero input gradient.
    weights = torch.randn(total, 3, 5, generator=torch.Generator().manual_seed(140))
    start = sum(4 + r for r in range(hvd.rank()))
    mine = slice(start, start + 4 + hvd.rank())
    bn = hvd.SyncBatchNorm(3).to(cuda())
    x = batches[hvd.rank()].to(cuda()).requires_grad_()
    y = bn(x)
    (y * weights[mine].to(cuda())).sum().backward()
    ref_bn = torch.nn.BatchNorm1d(3)
    whole = torch.cat(batches).requires_grad_()
    ref = ref_bn(whole)
    (ref * weights).sum().backward()
    assert y.is_cuda
    assert torch.allclose(y.detach().cpu(), ref.detach()[mine], rtol=1e-4, atol=1e-4)
    assert torch.allclose(x.grad.cpu(), whole.grad[mine], rtol=1e-4, atol=1e-4)
    assert torch.allclose(bn.running_mean.cpu(), ref_bn.running_mean, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("count", [1, 3, 1001, (1 << 20) + 3])
def test_allreduce_of_sizes_that_split_unevenly(count):
    """Across hosts the NCCL plane's allreduce is hierarchical (scripts/gpu-check runs this file
    with two hosts of two ranks): it cuts the buffer into a slice per rank of a host, unevenly
    for these counts, reduces inside the host, stages each slice across hosts and gathers."""
    inputs = ranks_data((count,), torch.float32, 300 + count % 97)
    out = hvd.allreduce(inputs[hvd.rank()].to(cuda()), name="gpu.uneven.%d" % count, op=hvd.Sum)
    check(out, reduce_ref(inputs, "sum", torch.float32), "allreduce of %d floats" % count)
