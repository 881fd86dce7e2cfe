"""Horovod's rules for the reduction-op arguments, shared by every Python frontend."""

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
