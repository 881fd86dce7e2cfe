"""``DistributedOptimizer`` for optax: the gradients averaged over the ranks before the wrapped
optimizer sees them (Horovod's DistributedOptimizer, for optax's GradientTransformation)."""

from krug.jax.functions import Compression, allreduce_gradients
from krug.jax.ops import Average, global_process_set


def DistributedOptimizer(optimizer, op=Average, compression=Compression.none,
                         gradient_predivide_factor=1.0, process_set=global_process_set):
    """Wraps the optax GradientTransformation ``optimizer``: its ``update(grads, state, params)``
    first reduces ``grads`` over the ranks (one grouped, fused request; usable inside
    jax.jit), then applies ``optimizer``. ``gradient_predivide_factor`` splits the averaging
    into a division before the sum and the rest after it, as in Horovod."""
    import optax  # only this helper needs optax

    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    prescale = 1.0 / gradient_predivide_factor
    postscale = gradient_predivide_factor

    def init(params):
        return optimizer.init(params)

    def update(grads, state, params=None, **extra_args):
        grads = allreduce_gradients(grads, op=op, compression=compression,
                                    process_set=process_set, prescale_factor=prescale,
                                    postscale_factor=postscale)
        return optimizer.update(grads, state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(init, update)
