"""Horovod's Keras callbacks for tf_keras (Keras 2): BroadcastGlobalVariablesCallback, MetricAverageCallback,
LearningRateScheduleCallback, LearningRateWarmupCallback, BestModelCheckpoint."""

import tf_keras as _keras

from krug._keras.callbacks import make_callbacks as _make

globals().update(_make(_keras))

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]
