"""TorchEstimator: trains a PyTorch model on a Spark DataFrame with krug (Horovod's
horovod.spark.torch.TorchEstimator), and the TorchModel it returns."""

import copy
import io

from pyspark import keyword_only

from krug.spark.common.estimator import KrugEstimator, KrugModel
from krug.spark.torch.remote import make_trainer


class TorchEstimator(KrugEstimator):
    """Spark Estimator for PyTorch models. Parameters as Horovod's (docs/spark.md lists what
    krug does with each): ``num_proc``, ``model`` (a torch.nn.Module whose forward takes one
    tensor per feature column), ``optimizer`` (bound to model's parameters; wrapped in
    krug.torch.DistributedOptimizer), ``loss`` (f(outputs, labels), or a list of them per
    output), ``metrics`` (f(outputs, labels) on the validation data), ``feature_cols``,
    ``label_cols``, ``input_shapes``, ``label_shapes``, ``validation``, ``batch_size``,
    ``val_batch_size``, ``epochs``, ``store``, ``callbacks`` (objects with
    ``on_epoch_end(epoch, logs)``), ``run_id``, ``random_seed``, ``shuffle``,
    ``train_steps_per_epoch``, ``validation_steps_per_epoch``, ``gradient_compression``,
    ``use_gpu``, ``verbose``."""

    _name = "krug.spark.torch.TorchEstimator"

    @keyword_only
    def __init__(self, num_proc=None, model=None, backend=None, store=None, optimizer=None,
                 loss=None, loss_constructors=None, metrics=None, loss_weights=None,
                 sample_weight_col=None, gradient_compression=None, feature_cols=None,
                 input_shapes=None, validation=None, label_cols=None, callbacks=None,
                 batch_size=None, val_batch_size=None, epochs=None, verbose=1,
                 random_seed=None, shuffle_buffer_size=None, shuffle=True,
                 partitions_per_process=None, run_id=None, train_minibatch_fn=None,
                 train_steps_per_epoch=None, validation_steps_per_epoch=None,
                 transformation_fn=None, train_reader_num_workers=None,
                 val_reader_num_workers=None, reader_pool_type="thread", label_shapes=None,
                 inmemory_cache_all=False, use_gpu=True, mp_start_method=None,
                 output_cols=None):
        super().__init__()
        kwargs = dict(self._input_kwargs)
        if kwargs.pop("loss_constructors", None) is not None:
            if "loss" in kwargs:
                raise ValueError("%s: give loss or loss_constructors, not both" % self._name)
            kwargs["loss"] = [make() for make in loss_constructors]
        if kwargs.pop("train_minibatch_fn", None) is not None:
            raise ValueError("%s: train_minibatch_fn is not supported by krug" % self._name)
        self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def setParams(self, **kwargs):
        return self._set(**kwargs)

    def _check_model(self):
        import torch

        if not isinstance(self.getModel(), torch.nn.Module):
            raise ValueError("%s: model must be a torch.nn.Module, got %r"
                             % (self._name, type(self.getModel())))
        if not isinstance(self.getOptimizer(), torch.optim.Optimizer):
            raise ValueError("%s: optimizer must be a torch.optim.Optimizer bound to the model's "
                             "parameters" % self._name)
        if self.getLoss() is None:
            raise ValueError("%s: the loss parameter is required" % self._name)

    def _train_fn(self, run_id, dataset_idx, has_val):
        optimizer = self.getOptimizer()
        spec = {
            "store": self.getStore(), "run_id": run_id, "dataset_idx": dataset_idx,
            "has_val": has_val, "model": copy.deepcopy(self.getModel()),
            "optimizer_cls": type(optimizer), "optimizer_defaults": dict(optimizer.defaults),
            "optimizer_state": optimizer.state_dict(), "loss": self.getLoss(),
            "metrics": self.getMetrics(), "feature_cols": list(self.getFeatureCols()),
            "label_cols": list(self.getLabelCols()), "input_shapes": self.getInputShapes(),
            "label_shapes": self.getLabelShapes(), "batch_size": self.getBatchSize(),
            "val_batch_size": self.getValBatchSize(), "epochs": self.getEpochs(),
            "random_seed": self.getRandomSeed(), "shuffle": self.getShuffle(),
            "train_steps_per_epoch": self.getTrainStepsPerEpoch(),
            "validation_steps_per_epoch": self.getValidationStepsPerEpoch(),
            "callbacks": self.getCallbacks(), "verbose": self.getVerbose(),
            "gradient_compression": self.getGradientCompression(), "use_gpu": self.getUseGpu(),
        }
        return make_trainer(spec)

    def _create_model(self, result, run_id, metadata):
        import torch

        history, state = result
        model = copy.deepcopy(self.getModel())
        model.load_state_dict(torch.load(io.BytesIO(state), map_location="cpu"))
        model.eval()
        return TorchModel(model=model, history=history, feature_columns=self.getFeatureCols(),
                          label_columns=self.getLabelCols(),
                          output_cols=self.getOrDefault(self.output_cols),
                          input_shapes=self.getInputShapes(), run_id=run_id, metadata=metadata)


class TorchModel(KrugModel):
    """The trained PyTorch model as a Spark Transformer (``getModel()`` returns the module,
    ``getHistory()`` the per-epoch metrics)."""

    def _predict_fn(self):
        model = self.getModel()
        features = list(self.getFeatureColumns())
        shapes = self.getInputShapes()

        def predict(columns):
            import torch

            xs = []
            for i, name in enumerate(features):
                t = torch.as_tensor(columns[name]).float()
                if shapes and i < len(shapes) and shapes[i] is not None:
                    t = t.reshape([-1] + list(shapes[i]))
                xs.append(t)
            with torch.no_grad():
                out = model.eval()(*xs)
            outs = out if isinstance(out, (list, tuple)) else [out]
            return [o.numpy() for o in outs]

        return predict
