"""Elastic training with Keras 3's fit: run, KerasState, ObjectState, CommitStateCallback,
UpdateBatchStateCallback, UpdateEpochStateCallback (Horovod's ``hvd.elastic``)."""

import keras as _keras

from krug._keras.elastic import make_elastic as _make

globals().update(vars(_make(_keras)))

__all__ = ["run", "ObjectState", "KerasState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback"]
