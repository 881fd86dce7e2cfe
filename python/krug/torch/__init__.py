"""krug.torch: Horovod's horovod.torch API on krug's engine."""

from krug.torch.mpi_ops import *  # noqa: F401,F403  (collectives; owned by the torch-py branch)

from krug.torch.compression import Compression
from krug.torch.functions import (allgather_object, broadcast_object,
                                  broadcast_optimizer_state, broadcast_parameters)
from krug.torch.optimizer import DistributedOptimizer
from krug.torch.sync_batch_norm import SyncBatchNorm
