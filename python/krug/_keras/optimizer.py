"""DistributedOptimizer for Keras optimizers: a subclass of the wrapped optimizer's class whose
gradients are reduced over the ranks before they are applied (Horovod's).

Where the reduction happens:
- tf_keras (new and legacy optimizers): ``compute_gradients`` / ``_compute_gradients`` (and the
  legacy ``get_gradients``) return the reduced gradients, as Horovod's wrapper does; ``minimize``
  and ``model.fit`` go through them. ``apply_gradients`` then applies what it is given. Called
  without them, with gradients from a plain tape, ``apply_gradients`` reduces them itself.
- Keras 3: optimizers have no gradient computation of their own (no ``compute_gradients``,
  ``get_gradients`` or ``minimize``), so ``apply`` (which ``apply_gradients`` and ``model.fit``
  call) reduces; the missing methods raise an error that names the alternatives.

With ``backward_passes_per_step`` = n > 1 the gradients go through a LocalGradientAggregator
(krug.tensorflow.gradient_aggregation): summed locally, reduced on every n-th pass, applied on
that pass only; the other passes count as optimizer iterations, as in Horovod.
"""

import tensorflow as tf

from krug.tensorflow.compression import Compression
from krug.tensorflow.gradient_aggregation import LocalGradientAggregator
from krug.tensorflow.gradients import check_groups, make_allreduce_grads_fn
from krug.tensorflow.local_gradients import LocalSources
from krug.tensorflow.mpi_ops import Adasum, Average, global_process_set

_KERAS3_NO_GRADIENTS = (
    "{name}: Keras 3 optimizers do not compute gradients (they have no compute_gradients, "
    "_compute_gradients, get_gradients or minimize), so krug.keras.DistributedOptimizer cannot "
    "return reduced gradients as Horovod's does. Compute them with "
    "krug.tensorflow.DistributedGradientTape (reduced there) and pass them to apply_gradients, "
    "or give plain gradients to apply_gradients / model.fit (reduced there), or use "
    "krug.tensorflow.keras with tf_keras (TF_USE_LEGACY_KERAS=1) for Horovod's Keras 2 API.")


class _Params:
    def __init__(self, name, compression, sparse_as_dense, gradient_predivide_factor, op,
                 backward_passes_per_step, average_aggregated_gradients, groups, process_set,
                 scale_local_gradients):
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if op == Adasum:
            raise ValueError("op == Adasum is not supported yet with Keras")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be > 0")
        self.name = name
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.average_aggregated_gradients = average_aggregated_gradients
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.reduce = make_allreduce_grads_fn(name or "DistributedOptimizer", compression,
                                              sparse_as_dense, op, gradient_predivide_factor,
                                              groups, process_set)


class _DistributedMixin:
    """Reduces gradients before the wrapped class applies them. `_krug` is set per class; the
    per-instance state (local variables, the aggregator) is made on first use, since Keras
    builds instances through from_config and load_model changes their class in place."""

    _krug = None

    def _krug_local_sources(self):
        if "_krug_local" not in self.__dict__:
            self.__dict__["_krug_local"] = LocalSources(self._krug.process_set,
                                                        self._krug.scale_local_gradients)
        return self.__dict__["_krug_local"]

    @property
    def _agg_helper(self):
        """The LocalGradientAggregator with backward_passes_per_step > 1, else None (Horovod's
        attribute name)."""
        if self._krug.backward_passes_per_step == 1:
            return None
        if "_krug_aggregator" not in self.__dict__:
            self.__dict__["_krug_aggregator"] = LocalGradientAggregator(
                self._krug.backward_passes_per_step, self._krug.average_aggregated_gradients,
                self._krug_reduce)
        return self.__dict__["_krug_aggregator"]

    def register_local_var(self, var):
        """Keeps `var`'s gradient local to this rank (divided by the size with
        scale_local_gradients), as Horovod's."""
        self._krug_local_sources().register(var)

    def _krug_reduce(self, grads, variables):
        return self._krug_local_sources().reduce(self._krug.reduce, grads, variables)

    def _krug_gradients(self, grads, variables):
        """This pass's gradients as they are to be applied: reduced, or with
        backward_passes_per_step aggregated (and reduced on every n-th pass)."""
        helper = self._agg_helper
        if helper is None:
            return self._krug_reduce(list(grads), list(variables))
        return helper.compute_gradients(list(grads), list(variables))

    def _krug_apply(self, grads, variables, apply_fn, reduced):
        """apply_fn(grads, variables) with grads reduced first unless `reduced`; with
        aggregation only on the pass that ends a cycle."""
        grads = list(grads)
        variables = list(variables)
        if not reduced:
            grads = self._krug_gradients(grads, variables)
        helper = self._agg_helper
        if helper is None:
            return apply_fn(grads, variables)
        with tf.init_scope():
            self.iterations  # noqa: B018 (legacy optimizers make it on first use; not in a cond)
        return helper.apply_gradients(lambda: apply_fn(grads, variables), self._krug_skip_pass)

    def _krug_skip_pass(self):
        # Every pass counts as an iteration, as in Horovod (horovod#3631): learning-rate
        # schedules see the same step numbers with and without aggregation.
        self.iterations.assign_add(1)


class _Keras3Mixin(_DistributedMixin):
    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        if not self.built:
            with tf.init_scope():
                self.build(list(trainable_variables))
        base = super(_Keras3Mixin, self)
        return self._krug_apply(grads, trainable_variables, lambda g, v: base.apply(g, v),
                                reduced=False)

    def compute_gradients(self, *args, **kwargs):
        raise NotImplementedError(_KERAS3_NO_GRADIENTS.format(name="compute_gradients"))

    def _compute_gradients(self, *args, **kwargs):
        raise NotImplementedError(_KERAS3_NO_GRADIENTS.format(name="_compute_gradients"))

    def get_gradients(self, *args, **kwargs):
        raise NotImplementedError(_KERAS3_NO_GRADIENTS.format(name="get_gradients"))

    def minimize(self, *args, **kwargs):
        raise NotImplementedError(_KERAS3_NO_GRADIENTS.format(name="minimize"))


class _TfKerasMixin(_DistributedMixin):
    """tf_keras' new optimizers compute gradients in compute_gradients(loss, var_list, tape),
    the legacy ones in _compute_gradients(loss, var_list, grad_loss, tape); both names work on
    both kinds, as on Horovod's wrapper."""

    def _krug_plain_gradients(self, loss, var_list, grad_loss, tape):
        base = super(_TfKerasMixin, self)
        if hasattr(base, "_compute_gradients"):  # legacy optimizer (OptimizerV2)
            return base._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
        if grad_loss is not None:
            raise ValueError("grad_loss needs a legacy optimizer (tf_keras.optimizers.legacy); "
                             "%s computes gradients without it" % type(self).__name__)
        return base.compute_gradients(loss, var_list, tape=tape)

    def _krug_hand_out(self, grads_and_vars):
        """The reduced (grad, var) pairs; the next apply_gradients applies what it is given."""
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        reduced = self._krug_gradients(grads, variables)
        self._krug_gradients_handed_out = True
        return list(zip(reduced, variables))

    def compute_gradients(self, loss, var_list, tape=None):
        """(gradient, variable) pairs of `loss`, reduced over the ranks (aggregated with
        backward_passes_per_step)."""
        return self._krug_hand_out(self._krug_plain_gradients(loss, var_list, None, tape))

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's wrapper method: compute_gradients with the legacy signature."""
        return self._krug_hand_out(self._krug_plain_gradients(loss, var_list, grad_loss, tape))

    def get_gradients(self, loss, params):
        """Legacy graph-mode (tf.compat.v1) gradients of `loss`, reduced over the ranks."""
        base = super(_TfKerasMixin, self)
        if not hasattr(base, "get_gradients"):
            raise NotImplementedError(
                "get_gradients is the legacy optimizers' graph-mode API "
                "(tf_keras.optimizers.legacy); %s computes gradients with "
                "compute_gradients(loss, var_list, tape)" % type(self).__name__)
        params = list(params)
        grads = base.get_gradients(loss, params)
        return [g for g, _ in self._krug_hand_out(zip(grads, params))]

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        reduced = getattr(self, "_krug_gradients_handed_out", False)
        self._krug_gradients_handed_out = False
        base = super(_TfKerasMixin, self)
        return self._krug_apply(
            [g for g, _ in grads_and_vars], [v for _, v in grads_and_vars],
            lambda g, v: base.apply_gradients(
                [(a, b) for a, b in zip(g, v) if a is not None], *args, **kwargs),
            reduced=reduced)


def _is_keras3(keras):
    return int(keras.__version__.split(".")[0]) >= 3


def distributed_class(keras, cls, params):
    """The subclass of optimizer class `cls` that reduces gradients with `params`."""
    mixin = _Keras3Mixin if _is_keras3(keras) else _TfKerasMixin
    return type(cls.__name__, (mixin, cls), {"_krug": params})


def create_distributed_optimizer(keras, optimizer, name=None, device_dense="", device_sparse="",
                                 compression=Compression.none, sparse_as_dense=False,
                                 gradient_predivide_factor=1.0, op=Average,
                                 backward_passes_per_step=1, average_aggregated_gradients=False,
                                 num_groups=0, groups=None, process_set=global_process_set,
                                 scale_local_gradients=True):
    """A new optimizer of `optimizer`'s class and configuration that averages gradients over
    the ranks of `process_set` before applying them."""
    groups = check_groups(groups, num_groups)
    params = _Params(name, compression, sparse_as_dense, gradient_predivide_factor, op,
                     backward_passes_per_step, average_aggregated_gradients, groups, process_set,
                     scale_local_gradients)
    cls = distributed_class(keras, optimizer.__class__, params)
    return cls.from_config(optimizer.get_config())
