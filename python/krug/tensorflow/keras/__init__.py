"""krug.tensorflow.keras: Horovod's ``horovod.tensorflow.keras`` API for tf_keras (Keras 2 on
TensorFlow 2.16 and newer; ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras`` that too).

    import tf_keras as keras
    import krug.tensorflow.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
"""

import tf_keras as _keras

from krug._keras.frontend import frontend_names as _frontend_names

# krug.tensorflow's calls, the collectives with Horovod's Keras signatures,
# DistributedOptimizer, PartialDistributedOptimizer, load_model and
# SyncBatchNormalization.
globals().update(_frontend_names(_keras))

from krug.tensorflow.keras import callbacks, elastic  # noqa: E402
from krug.tensorflow.keras.callbacks import *  # noqa: E402,F401,F403 (the callback classes)
