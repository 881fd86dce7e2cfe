"""What krug.keras (Keras 3) and krug.tensorflow.keras (tf_keras, Keras 2) share: the
DistributedOptimizer, the callbacks and load_model, written once over the Keras module they
are given (as Horovod's ``horovod._keras``)."""
