"""krug.keras: Horovod's ``horovod.keras`` API for Keras 3 (the ``keras`` package, TensorFlow
backend).

    import keras
    import krug.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""

import keras as _keras

from krug._keras.frontend import frontend_names as _frontend_names

# krug.tensorflow's calls, the collectives with Horovod's Keras signatures,
# DistributedOptimizer, PartialDistributedOptimizer, load_model and
# SyncBatchNormalization.
globals().update(_frontend_names(_keras))

from krug.keras import callbacks, elastic  # noqa: E402
from krug.keras.callbacks import *  # noqa: E402,F401,F403 (the callback classes)
