"""krug: distributed data-parallel training with a C++ core, in the family of Horovod.

Frameworks live in subpackages: ``import krug.torch as hvd`` gives Horovod's
``horovod.torch`` API. Start programs with ``krugrun -np N python3 train.py``.
"""

__version__ = "0.1.0"
