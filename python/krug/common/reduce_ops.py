"""Horovod's reduction ops and the rules for their arguments, shared by every Python
frontend."""

import warnings


def handle_average_backwards_compatibility(op, average, average_op, sum_op):
    """Resolves Horovod's deprecated ``average=`` argument into ``op`` (the frontend's Average
    and Sum values given)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning, stacklevel=3)
        return average_op if average else sum_op
    return average_op


class ReduceOps:
    """The core's reduction ops (krug::reduce_ops(), krug/binding_rules.h: Horovod's names with
    krug's values), read from a frontend's compiled module."""

    def __init__(self, core):
        self.values = dict(core.reduce_ops())
        self._names = {value: name for name, value in self.values.items()}

    def horovod_constants(self):
        """(Average, Sum, Adasum, Min, Max, Product): the values of ``hvd.Average``, ..."""
        return tuple(self.values[name]
                     for name in ("Average", "Sum", "Adasum", "Min", "Max", "Product"))

    def name(self, op):
        """``op``'s name ("Average", ...), or ``op`` itself when it is none of them."""
        return self._names.get(op, op)

    def check(self, op):
        """Raises ValueError unless ``op`` is one of the reduction ops."""
        if op not in self._names:
            raise ValueError("unknown reduction op {!r}: use hvd.Average, hvd.Sum, hvd.Min, "
                             "hvd.Max, hvd.Product or hvd.Adasum".format(op))

    def check_differentiable(self, kind, op):
        """Raises NotImplementedError unless the gradient of ``kind`` ("allreduce",
        "reducescatter") with ``op`` is defined: Horovod defines it for Sum and Average."""
        if self._names.get(op) not in ("Sum", "Average"):
            raise NotImplementedError("the gradient of {} is only defined for Sum and Average, "
                                      "not {}".format(kind, self.name(op)))
