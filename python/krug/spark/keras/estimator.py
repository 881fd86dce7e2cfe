"""KerasEstimator: trains a Keras model on a Spark DataFrame with krug.keras (Horovod's
horovod.spark.keras.KerasEstimator), and the KerasModel it returns. Data, Store and params are
those of TorchEstimator (krug.spark.common)."""

from pyspark import keyword_only

from krug.spark.common.estimator import KrugEstimator, KrugModel
from krug.spark.common.params import _declare
from krug.spark.keras.remote import make_trainer


class KerasEstimator(KrugEstimator):
    """Spark Estimator for Keras models. Parameters as Horovod's: ``num_proc``, ``model`` (a
    keras.Model), ``optimizer`` (a keras optimizer, wrapped in krug.keras.DistributedOptimizer),
    ``loss``, ``loss_weights``, ``metrics``, ``custom_objects``, ``feature_cols``,
    ``label_cols``, ``input_shapes``, ``validation``, ``batch_size``, ``val_batch_size``,
    ``epochs``, ``store``, ``callbacks`` (Keras callbacks, after krug's broadcast and
    metric-averaging ones), ``run_id``, ``random_seed``, ``shuffle``, ``train_steps_per_epoch``,
    ``validation_steps_per_epoch``, ``gradient_compression``, ``verbose``."""

    _name = "krug.spark.keras.KerasEstimator"

    @keyword_only
    def __init__(self, num_proc=None, model=None, backend=None, store=None,
                 custom_objects=None, optimizer=None, loss=None, loss_weights=None,
                 sample_weight_col=None, gradient_compression=None, metrics=None,
                 feature_cols=None, label_cols=None, validation=None, callbacks=None,
                 batch_size=None, val_batch_size=None, epochs=None, verbose=1,
                 random_seed=None, shuffle_buffer_size=None, partitions_per_process=None,
                 run_id=None, train_steps_per_epoch=None, validation_steps_per_epoch=None,
                 transformation_fn=None, train_reader_num_workers=None,
                 val_reader_num_workers=None, reader_pool_type="thread", label_shapes=None,
                 checkpoint_callback=None, inmemory_cache_all=False,
                 backward_passes_per_step=1, shuffle=True, input_shapes=None,
                 output_cols=None, use_gpu=True, mp_start_method=None):
        super().__init__()
        self._setDefault(custom_objects=None, checkpoint_callback=None,
                         backward_passes_per_step=1)
        kwargs = dict(self._input_kwargs)
        # Keras weighs several losses itself.
        self._keras_loss_weights = kwargs.pop("loss_weights", None)
        self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def setParams(self, **kwargs):
        return self._set(**kwargs)

    def _check_model(self):
        import keras

        if not isinstance(self.getModel(), keras.Model):
            raise ValueError("%s: model must be a keras.Model, got %r"
                             % (self._name, type(self.getModel())))
        if self.getOptimizer() is None or self.getLoss() is None:
            raise ValueError("%s: the optimizer and loss parameters are required" % self._name)
        if self.getBackwardPassesPerStep() != 1:
            raise ValueError("%s: backward_passes_per_step other than 1 is not supported"
                             % self._name)

    def _train_fn(self, run_id, dataset_idx, has_val):
        import keras

        model = self.getModel()
        spec = {
            "store": self.getStore(), "run_id": run_id, "dataset_idx": dataset_idx,
            "has_val": has_val, "model_json": model.to_json(), "weights": model.get_weights(),
            "optimizer": keras.optimizers.serialize(self.getOptimizer()),
            "custom_objects": self.getCustomObjects(), "loss": self.getLoss(),
            "loss_weights": self._keras_loss_weights, "metrics": self.getMetrics(),
            "feature_cols": list(self.getFeatureCols()), "label_cols": list(self.getLabelCols()),
            "input_shapes": self.getInputShapes(), "batch_size": self.getBatchSize(),
            "val_batch_size": self.getValBatchSize(), "epochs": self.getEpochs(),
            "random_seed": self.getRandomSeed(), "shuffle": self.getShuffle(),
            "train_steps_per_epoch": self.getTrainStepsPerEpoch(),
            "validation_steps_per_epoch": self.getValidationStepsPerEpoch(),
            "callbacks": self.getCallbacks(), "verbose": self.getVerbose(),
            "gradient_compression": self.getGradientCompression(),
            "use_gpu": self.getUseGpu(),
        }
        return make_trainer(spec)

    def _create_model(self, result, run_id, metadata):
        import keras

        history, weights = result
        model = keras.models.model_from_json(self.getModel().to_json(),
                                             custom_objects=self.getCustomObjects())
        model.set_weights(weights)
        return KerasModel(model=model, history=history, feature_columns=self.getFeatureCols(),
                          label_columns=self.getLabelCols(),
                          output_cols=self.getOrDefault(self.output_cols),
                          input_shapes=self.getInputShapes(), run_id=run_id, metadata=metadata,
                          custom_objects=self.getCustomObjects())


_declare(KerasEstimator, [
    ("custom_objects", None, "custom Keras objects the model and optimizer need"),
    ("checkpoint_callback", None, "accepted for Horovod compatibility: rank 0 writes the final "
                                  "weights to the store"),
    ("backward_passes_per_step", 1, "gradient accumulation steps (only 1 is supported)"),
])


class KerasModel(KrugModel):
    """The trained Keras model as a Spark Transformer (``getModel()`` returns it)."""

    def _predict_fn(self):
        model_json = self.getModel().to_json()
        weights = self.getModel().get_weights()
        custom = self.getOrDefault(self.custom_objects)
        features = list(self.getFeatureColumns())
        shapes = self.getInputShapes()

        def predict(columns):
            import keras

            from krug.spark.keras.remote import _inputs

            model = keras.models.model_from_json(model_json, custom_objects=custom)
            model.set_weights(weights)
            out = model.predict(_inputs(columns, features, shapes), verbose=0)
            return list(out) if isinstance(out, (list, tuple)) else [out]

        return predict


_declare(KerasModel, [("custom_objects", None, "custom Keras objects of the model")])
