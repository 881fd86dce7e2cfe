"""Elastic training with tf_keras (Keras 2)'s fit: run, KerasState, ObjectState, CommitStateCallback,
UpdateBatchStateCallback, UpdateEpochStateCallback (Horovod's ``hvd.elastic``)."""

import tf_keras as _keras

from krug._keras.elastic import make_elastic as _make

_api = _make(_keras)
run = _api.run
ObjectState = _api.ObjectState
KerasState = _api.KerasState
CommitStateCallback = _api.CommitStateCallback
UpdateBatchStateCallback = _api.UpdateBatchStateCallback
UpdateEpochStateCallback = _api.UpdateEpochStateCallback

__all__ = ["run", "ObjectState", "KerasState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback"]
