"""krug.spark.torch: TorchEstimator and TorchModel (Horovod's horovod.spark.torch)."""

from krug.spark.torch.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
