"""Running Horovod's Keras calls in a TF1 graph: horovod.keras evaluates its collectives and
``broadcast_global_variables`` in Keras' own session (``K.get_session()``) and returns values.
tf_keras keeps that session; Keras 3 has none, so there the graph path says what to use."""

from krug.tensorflow.util import _executing_eagerly


def keras_session(keras):
    """The tf.compat.v1.Session Keras runs its graph in (created on first use, as Keras does)."""
    if keras.__name__.split(".")[0] == "tf_keras":
        # tf_keras no longer exports get_session; its backend module still owns the session.
        from tf_keras.src import backend
        return backend.get_session()
    raise RuntimeError(
        "Keras %s has no TF1 session: krug.keras runs its collectives and "
        "broadcast_global_variables eagerly only. In a tf.compat.v1 graph use "
        "krug.tensorflow.keras with tf_keras, or krug.tensorflow's ops in your own "
        "tf.compat.v1.Session." % getattr(keras, "__version__", "3"))


def evaluate(keras, result):
    """``result`` as Horovod's Keras calls return it: the tensor when executing eagerly; in a
    graph, its value computed in Keras' session."""
    if _executing_eagerly():
        return result
    return keras_session(keras).run(result)
