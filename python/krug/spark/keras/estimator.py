"""KerasEstimator: trains a Keras model on a Spark DataFrame with krug.keras (Horovod's
horovod.spark.keras.KerasEstimator), and the KerasModel it returns. Data, Store and params are
those of TorchEstimator (krug.spark.common)."""

from krug.spark.common.estimator import KrugEstimator, KrugModel, keyword_signature
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

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Keras weighs several losses itself.
        self._keras_loss_weights = kwargs.pop("loss_weights", None)
        self._set_arguments(kwargs)

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
        spec = self._spec(run_id, dataset_idx, has_val)
        spec.update(model_json=model.to_json(), weights=model.get_weights(),
                    optimizer=keras.optimizers.serialize(self.getOptimizer()),
                    custom_objects=self.getCustomObjects(),
                    loss_weights=self._keras_loss_weights)
        return make_trainer(spec)

    def _create_model(self, result, run_id, metadata):
        import keras

        history, weights = result
        model = keras.models.model_from_json(self.getModel().to_json(),
                                             custom_objects=self.getCustomObjects())
        model.set_weights(weights)
        return KerasModel(model=model, custom_objects=self.getCustomObjects(),
                          **self._model_params(history, run_id, metadata))


_declare(KerasEstimator, [
    ("custom_objects", None, "custom Keras objects the model and optimizer need"),
    ("checkpoint_callback", None, "accepted for Horovod compatibility: rank 0 writes the final "
                                  "weights to the store"),
    ("backward_passes_per_step", 1, "gradient accumulation steps (only 1 is supported)"),
])
keyword_signature(KerasEstimator)


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
