"""A jitted allgather whose shape differs across ranks, in a job of its own: it fails on every
rank with a message that says what to change, and, as every failure inside a collective, ends
krug's engine (ranks that had started exchanging cannot be left waiting), so the operations
after it report the same root cause instead of hanging."""

import jax
import jax.numpy as jnp
import pytest

import krug.jax as hvd


def test_a_shape_the_program_was_not_traced_for_fails_on_every_rank():
    if hvd.size() < 2:
        pytest.skip("needs ranks with different shapes")
    with pytest.raises(jax.errors.JaxRuntimeError, match="traced for .* call it outside jit"):
        jax.jit(hvd.allgather)(jnp.ones((hvd.rank() + 1, 2))).block_until_ready()
    with pytest.raises(hvd.HorovodInternalError, match="traced for"):
        hvd.allreduce(jnp.ones(2))
