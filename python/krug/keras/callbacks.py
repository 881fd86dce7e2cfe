"""Horovod's Keras callbacks for Keras 3: BroadcastGlobalVariablesCallback, MetricAverageCallback,
LearningRateScheduleCallback, LearningRateWarmupCallback, BestModelCheckpoint."""

import keras as _keras

from krug._keras.callbacks import make_callbacks as _make

globals().update(_make(_keras))

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]
