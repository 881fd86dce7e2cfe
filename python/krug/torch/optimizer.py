"""DistributedOptimizer: wraps a torch optimizer so that gradients are averaged across ranks
(the horovod.torch.DistributedOptimizer API and semantics).

Each parameter's gradient accumulator (the AccumulateGrad autograd node) gets a hook; when it
has fired ``backward_passes_per_step`` times, the parameter's allreduce is started
asynchronously, so communication overlaps the rest of the backward pass. ``synchronize()``
(called by ``step()``) submits whatever is still missing, waits, and writes the reduced
gradients back into ``p.grad``.
"""

import os
import warnings
from contextlib import contextmanager

import torch

from krug.torch.compression import Compression
from krug.torch.functions import broadcast_object
from krug.torch.mpi_ops import (Adasum, Average, allreduce_async_, global_process_set,
                                grouped_allreduce_async_, local_rank, local_size, size,
                                sparse_allreduce_async, synchronize)


def _split_list(items, n):
    """Splits items into n contiguous parts whose lengths differ by at most one."""
    n = max(1, min(n, len(items)))
    q, r = divmod(len(items), n)
    parts, start = [], 0
    for i in range(n):
        end = start + q + (1 if i < r else 0)
        parts.append(items[start:end])
        start = end
    return [p for p in parts if p]


_TOO_MANY_PASSES = ('Gradients were computed more than backward_passes_per_step times before '
                    'call to step(). Increase backward_passes_per_step to accumulate gradients '
                    'locally.')


def _find_duplicates(names):
    seen, dups = set(), set()
    for n in names:
        if n in seen:
            dups.add(n)
        seen.add(n)
    return dups


def _wait(handle):
    if callable(handle):
        return handle()  # sparse_allreduce_async's
    return synchronize(handle)


def _count_backward_pass(opt, p):
    """Counts one local backward pass of p's gradient; True when it is time to reduce it."""
    if opt._allreduce_delay[p] <= 0:
        raise AssertionError(_TOO_MANY_PASSES)
    assert not p.grad.requires_grad
    opt._allreduce_delay[p] -= 1
    return opt._allreduce_delay[p] == 0


def _checked_named_parameters(param_groups, named_parameters):
    """(name, parameter) pairs for every parameter, checked as Horovod checks them: tuples,
    unique names, every parameter named; generated names when none are given."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [('allreduce.noname.%d.%d' % (i, j), p)
                            for i, group in enumerate(param_groups)
                            for j, p in enumerate(group['params'])]
    if any(not isinstance(np, tuple) for np in named_parameters):
        raise ValueError('named_parameters should be a sequence of tuples (name, parameter), '
                         'usually produced by model.named_parameters().')
    dups = _find_duplicates([name for name, _ in named_parameters])
    if dups:
        raise ValueError('Parameter names in named_parameters must be unique. '
                         'Found duplicates: %s' % ', '.join(sorted(map(str, dups))))
    all_ids = {id(p) for group in param_groups for p in group['params']}
    named_ids = {id(p) for _, p in named_parameters}
    unnamed = all_ids - named_ids
    if unnamed:
        raise ValueError('named_parameters was specified, but one or more model parameters '
                         'were not named. Python object ids: %s'
                         % ', '.join(str(i) for i in sorted(unnamed)))
    return named_parameters


def _init_state(opt, named_parameters, compression, backward_passes_per_step):
    """The state of both distributed optimizers (``opt``, its param groups set): parameter
    names, the backward passes each gradient waits for, pending handles. Returns the checked
    (name, parameter) pairs."""
    opt._compression = compression
    named_parameters = _checked_named_parameters(opt.param_groups, named_parameters)
    opt._parameter_names = {p: name for name, p in named_parameters}
    opt.backward_passes_per_step = backward_passes_per_step
    opt._allreduce_delay = {p: backward_passes_per_step for _, p in named_parameters}
    # key (a parameter, or a tuple of parameters for a group) -> (handle, ctx)
    opt._handles = {}
    opt._grad_accs = []
    opt._requires_update = set()
    opt._synchronized = False
    opt._should_synchronize = True
    return named_parameters


def _hook_gradient(opt, p):
    """Calls ``opt._make_hook(p)`` each time a backward pass has accumulated p's gradient."""
    opt._requires_update.add(p)
    # torch 1.13 has no register_post_accumulate_grad_hook: reach the parameter's
    # AccumulateGrad node through a view and hook it (it runs after p.grad is set).
    acc = p.expand_as(p).grad_fn.next_functions[0][0]
    acc.register_hook(opt._make_hook(p))
    opt._grad_accs.append(acc)  # keep the node (and so the hook) alive


def _set_backward_passes_per_step(self, passes):
    self.backward_passes_per_step = passes
    for p in self._allreduce_delay:
        self._allreduce_delay[p] = passes


def _zero_grad(self, *args, **kwargs):
    if self._handles:
        raise AssertionError('optimizer.zero_grad() was called after loss.backward() but '
                             'before optimizer.step() or optimizer.synchronize(). This is '
                             'prohibited as it can cause a race condition.')
    return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedOptimizer(torch.optim.Optimizer):
    # Attributes of this class body are copied into a subclass of the wrapped optimizer's
    # class (see DistributedOptimizer), so methods use super(self.__class__, self).
    _krug_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        _init_state(self, named_parameters, compression, backward_passes_per_step)
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set

        if groups is not None:
            if isinstance(groups, list):
                seen = set()
                for group in groups:
                    for p in group:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError('groups must consist of torch.Tensor.')
                        if id(p) in seen:
                            raise ValueError('A parameter can only appear once in groups.')
                        seen.add(id(p))
            elif not (isinstance(groups, int) and groups > 0):
                raise ValueError('groups should be a non-negative integer or '
                                 'a list of list of torch.Tensor.')
        self._groups = groups
        self._p_to_group = {}
        self._group_counts = {}

        if self.process_set.included() and (size() > 1 or os.environ.get('HOROVOD_ELASTIC') == '1'
                                            or os.environ.get('KRUG_ELASTIC') == '1'):
            self._register_hooks()

    # ----------------------------------------------------------------- public API

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    set_backward_passes_per_step = _set_backward_passes_per_step

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting those not yet started, e.g. for
        parameters that got no gradient on this rank: they contribute zeros) and writes the
        results into ``p.grad``."""
        if not self.process_set.included():
            self._synchronized = True
            return

        started = set()
        for key, (handle, _) in self._handles.items():
            if handle is not None:
                started.update(key if isinstance(key, tuple) else (key,))
        # Submit in a deterministic order (the parameters' order in the param groups).
        for p in self._ordered_params():
            if p not in self._requires_update or p in started:
                continue
            if self._groups is not None:
                group = self._p_to_group[p]
                for gp in group:
                    self._handles.pop(gp, None)
                self._handles[group] = self._grouped_allreduce_grad_async(group)
                self._group_counts[group] = 0
                started.update(group)
            else:
                self._handles[p] = self._allreduce_grad_async(p)
                started.add(p)

        for key, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                continue  # its group was submitted above under the group's key
            if isinstance(key, tuple):
                outputs = _wait(handle)
                for gp, output, gctx in zip(key, outputs, ctx):
                    self._allreduce_delay[gp] = self.backward_passes_per_step
                    self._write_grad(gp, output, gctx)
                self._group_counts[key] = 0
            else:
                output = _wait(handle)
                self._allreduce_delay[key] = self.backward_passes_per_step
                self._write_grad(key, output, ctx)
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """``step()`` inside this context does not synchronize; use after an explicit
        ``optimizer.synchronize()`` (e.g. to clip the reduced gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn('optimizer.step() called without optimizer.skip_synchronize() '
                              'context after optimizer.synchronize(). This can cause training '
                              'slowdown. You may want to consider using '
                              'optimizer.skip_synchronize() context if you use '
                              'optimizer.synchronize() in your code.')
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    zero_grad = _zero_grad

    # ----------------------------------------------------------------- internals

    def _ordered_params(self):
        return [p for group in self.param_groups for p in group['params']]

    def _register_hooks(self):
        if self._groups is not None:
            trainable = [p for p in self._ordered_params() if p.requires_grad]
            # Every rank must form the same groups in the same order: take rank 0's order of
            # parameter names.
            names = [self._parameter_names.get(p) for p in trainable]
            root_names = broadcast_object(names, root_rank=0,
                                          name='DistributedOptimizer.parameter_order',
                                          process_set=self.process_set)
            position = {n: i for i, n in enumerate(root_names)}
            trainable.sort(key=lambda p: position.get(self._parameter_names.get(p), len(position)))
            if isinstance(self._groups, list):
                trainable_ids = {id(p) for p in trainable}
                p_groups, grouped = [], set()
                for group in self._groups:
                    members = [p for p in group if id(p) in trainable_ids]
                    if members:
                        p_groups.append(members)
                        grouped.update(id(p) for p in members)
                p_groups += [[p] for p in trainable if id(p) not in grouped]
            else:
                p_groups = _split_list(trainable, self._groups)
            for group in p_groups:
                group = tuple(group)
                for p in group:
                    self._p_to_group[p] = group
                self._group_counts[group] = 0

        for p in self._ordered_params():
            if p.requires_grad:
                _hook_gradient(self, p)

    def _make_hook(self, p):
        def hook(*_):
            handle, ctx = None, None
            if _count_backward_pass(self, p):
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        for gp in group:
                            self._handles.pop(gp, None)
                        self._handles[group] = self._grouped_allreduce_grad_async(group)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def _scale_factors(self):
        if self.op == Average:
            # The core divides by the set size after postscale; together: sum * (1/f) * f/size.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _dense_grad(self, p):
        if p.grad is None:
            # No gradient on this rank (parameter unused in this forward): contribute zeros,
            # since other ranks may have one and every rank must submit the same op.
            p.grad = torch.zeros_like(p.data)
        return p.grad

    def _allreduce_grad_async(self, p):
        name = self._parameter_names.get(p)
        tensor = self._dense_grad(p)
        if tensor.is_sparse:
            if self.sparse_as_dense:
                tensor = tensor.to_dense()
            else:
                return sparse_allreduce_async(tensor, name, self.op, self.process_set), None
        compressed, ctx = self._compression.compress(tensor)
        prescale, postscale = self._scale_factors()
        handle = allreduce_async_(compressed, name=name, op=self.op,
                                  prescale_factor=prescale, postscale_factor=postscale,
                                  process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group):
        name = self._parameter_names.get(group[0])
        compressed, ctxs = [], []
        for p in group:
            tensor = self._dense_grad(p)
            if tensor.is_sparse:
                # Grouped reductions are dense; a sparse gradient in a group travels dense.
                tensor = tensor.to_dense()
            t, c = self._compression.compress(tensor)
            compressed.append(t)
            ctxs.append(c)
        prescale, postscale = self._scale_factors()
        handle = grouped_allreduce_async_(compressed, name=name, op=self.op,
                                          prescale_factor=prescale, postscale_factor=postscale,
                                          process_set=self.process_set)
        return handle, ctxs

    def _write_grad(self, p, output, ctx):
        reduced = self._compression.decompress(output, ctx) if ctx is not None else output
        if p.grad.is_sparse:
            if not reduced.is_sparse:
                reduced = reduced.to_sparse()
            p.grad = reduced
        elif reduced is not p.grad:
            p.grad.copy_(reduced.reshape(p.grad.shape))


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Adasum: each rank applies its own optimizer step per parameter as soon as the gradient is
    ready, and the parameter *deltas* are combined with the Adasum reduction."""
    _krug_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        named_parameters = _init_state(self, named_parameters, compression,
                                       backward_passes_per_step)
        # The model as of the last step, identical on all ranks; deltas are added to it.
        self._starting_models = {p: torch.zeros_like(p.data) for _, p in named_parameters}
        for p in [p for group in self.param_groups for p in group['params']]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p.data)
                _hook_gradient(self, p)

    set_backward_passes_per_step = _set_backward_passes_per_step

    def _allreduce_grad_async(self, p):
        name = self._parameter_names.get(p)
        start = self._starting_models[p]
        start.copy_(p.data)
        # Step only p: temporarily restrict every param group to p (or nothing).
        stashed = [group['params'] for group in self.param_groups]
        for group in self.param_groups:
            group['params'] = [p] if any(p is q for q in group['params']) else []
        try:
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group['params'] = params
        p.data.sub_(start)  # p now holds this rank's delta
        compressed, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(compressed, name=name, op=Adasum)
        return handle, ctx

    def _make_hook(self, p):
        def hook(*_):
            handle, ctx = None, None
            if _count_backward_pass(self, p):
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        pass

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError('Skipping synchronization is not supported when using Adasum '
                             'optimizer.')
        yield  # pragma: no cover

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for p in [p for group in self.param_groups for p in group['params']]:
            if p in self._requires_update and (p not in self._handles
                                               or self._handles[p][0] is None):
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            delta = self._compression.decompress(_wait(handle), ctx)
            start = self._starting_models[p]
            start.add_(delta.reshape(start.shape))
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    zero_grad = _zero_grad


def _spins_briefly():
    """Whether torch's OpenMP threads wait without spinning long: passively, or for at most the
    spins krugrun gives ranks that share a host (GOMP_SPINCOUNT=1000)."""
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        return True
    try:
        return int(os.environ.get("GOMP_SPINCOUNT", "")) <= 1000
    except ValueError:
        return False


def _warn_if_oversubscribed():
    """torch's OpenMP threads spin while they wait for each other, so ranks of one host that run
    more of them than it has cores take each other's cores: ResNet-18 with 2 ranks x 2 threads
    on 2 cores trained 3-5x slower than with GOMP_SPINCOUNT=1000, which krugrun sets
    (docs/benchmarks.md). Says so once per job, on the host's first rank, when training
    starts, where the threads spin long."""
    threads, ranks = torch.get_num_threads(), local_size()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if local_rank() != 0 or threads == 1 or threads * ranks <= (cores or 1) or _spins_briefly():
        return
    warnings.warn(
        "krug: the %d ranks on this host each run %d torch threads, %d on %d cores; torch's "
        "OpenMP threads spin while they wait, so they take each other's cores and training "
        "slows several times. Give each rank %d (torch.set_num_threads, or OMP_NUM_THREADS), "
        "or let them spin briefly: start the job with krugrun, which sets GOMP_SPINCOUNT=1000 "
        "where ranks share a host, or set it (or OMP_WAIT_POLICY=PASSIVE) yourself."
        % (ranks, threads, threads * ranks, cores, max(1, (cores or 1) // ranks)),
        RuntimeWarning, stacklevel=3)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps ``optimizer`` so that ``step()`` applies gradients averaged (``op``) over the ranks
    of ``process_set``.

    Arguments (as horovod.torch.DistributedOptimizer):
      optimizer: a torch.optim.Optimizer; the result is an instance of a subclass of its class,
        sharing its param groups.
      named_parameters: ``model.named_parameters()``; names the allreduce operations (unique).
        Default: names derived from positions in the param groups.
      compression: ``Compression.none`` or ``Compression.fp16``.
      backward_passes_per_step: backward passes accumulated locally before each allreduce.
      op: ``Average`` (default), ``Sum`` or ``Adasum`` (reduces parameter deltas instead).
      gradient_predivide_factor: with op=Average, gradients are multiplied by 1/f before the sum
        and by f/size after it.
      num_groups: deprecated, same as ``groups=num_groups``.
      groups: an int n (split the parameters into n grouped allreduces) or a list of lists of
        parameters (each list reduced as one group; the rest individually).
      sparse_as_dense: reduce sparse gradients as dense tensors; otherwise they are allgathered.
      process_set: the ranks that take part.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError('gradient_predivide_factor not supported with op != Average')
    if num_groups != 0:
        warnings.warn('Parameter `num_groups` has been replaced by `groups` '
                      'and will be removed in v0.23.0.', DeprecationWarning)
        if groups is None:
            groups = num_groups

    _warn_if_oversubscribed()
    if op != Adasum or size() == 1:
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step, op, gradient_predivide_factor, groups,
                   sparse_as_dense, process_set)
    if process_set is not global_process_set:
        raise NotImplementedError('Adasum does not support non-global process sets yet.')
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedAdasumOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
