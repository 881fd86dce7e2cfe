"""krug.spark.keras: KerasEstimator and KerasModel (Horovod's horovod.spark.keras). Training
uses krug.keras (Horovod's horovod.keras API) in every rank."""

from krug.spark.keras.estimator import KerasEstimator, KerasModel

__all__ = ["KerasEstimator", "KerasModel"]
