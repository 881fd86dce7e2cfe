"""Local gradient aggregation (Horovod's ``backward_passes_per_step``): each rank sums its
gradients over n backward passes and the ranks reduce the sums together on every n-th pass only.

One class serves eager code and tf.function alike (Horovod has a helper for each,
LocalGradientAggregationHelper and ...Eager): eagerly the decisions are Python ``if``s on the
counter's value, in a graph they are ``tf.cond``s. Every rank counts the same passes, so all
take the same branch and the collectives inside it match."""

import tensorflow as tf

from krug.tensorflow.gradients import var_key


class LocalGradientAggregator:
    """Counts backward passes and keeps one running sum per variable.

    ``compute_gradients(grads, variables)`` adds this pass's gradients to the sums. On the n-th
    pass it returns ``reduce_fn`` of the sums (divided by n with
    ``average_aggregated_gradients``), zeroes the sums and sets ``counter`` back to 0; on the
    other passes it returns the sums so far. ``apply_gradients(apply_fn, skip_fn)`` then runs
    apply_fn where a cycle has just been reduced (``counter`` is 0) and skip_fn elsewhere."""

    def __init__(self, backward_passes_per_step, average_aggregated_gradients, reduce_fn):
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.average_aggregated_gradients = average_aggregated_gradients
        self._reduce = reduce_fn
        self._counter = None
        self._sums = {}

    @property
    def counter(self):
        """Passes summed since the last reduction (a tf.Variable, int32)."""
        if self._counter is None:
            with tf.init_scope():  # created once, whether first called eagerly or traced
                self._counter = tf.Variable(0, dtype=tf.int32, trainable=False,
                                            name="krug_aggregation_counter")
        return self._counter

    def _sum_of(self, variable, dtype):
        key = var_key(variable)
        if key not in self._sums:
            with tf.init_scope():
                self._sums[key] = tf.Variable(tf.zeros(variable.shape, dtype), trainable=False,
                                              name="krug_aggregated_gradient")
        return self._sums[key]

    def compute_gradients(self, grads, variables):
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        sums = [self._sum_of(variables[i], grads[i].dtype) for i in present]
        for s, i in zip(sums, present):
            s.assign_add(grads[i])
        count = self.counter.assign_add(1)
        partial = [s.read_value() for s in sums]
        summed_vars = [variables[i] for i in present]

        def reduce_and_restart():
            reduced = self._reduce(partial, summed_vars)
            if self.average_aggregated_gradients:
                reduced = [g / self.backward_passes_per_step for g in reduced]
            # Zeros, not a subtraction of the sum: an infinite gradient in this cycle would
            # leave inf - inf = nan in every later one (Horovod's fix, horovod#3505).
            for s in sums:
                s.assign(tf.zeros_like(s))
            self.counter.assign(0)
            return reduced

        last_pass = tf.equal(count, self.backward_passes_per_step)
        if tf.executing_eagerly():
            out = reduce_and_restart() if bool(last_pass) else partial
        else:
            out = tf.nest.flatten(tf.cond(last_pass, reduce_and_restart, lambda: partial))
        result = [None] * len(grads)
        for i, g in zip(present, out):
            result[i] = g
        return result

    def apply_gradients(self, apply_fn, skip_fn):
        """apply_fn() on the pass that ended a cycle, skip_fn() on the others."""
        cycle_done = tf.equal(self.counter.read_value(), 0)
        if tf.executing_eagerly():
            return apply_fn() if bool(cycle_done) else skip_fn()

        def run(fn, applied):
            fn()
            return tf.constant(applied)
        return tf.cond(cycle_done, lambda: run(apply_fn, True), lambda: run(skip_fn, False))
