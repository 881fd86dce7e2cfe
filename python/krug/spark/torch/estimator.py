"""TorchEstimator: trains a PyTorch model on a Spark DataFrame with krug (Horovod's
horovod.spark.torch.TorchEstimator), and the TorchModel it returns."""

import copy
import io

from krug.spark.common.estimator import KrugEstimator, KrugModel, keyword_signature
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

    _extra_arguments = ("loss_constructors", "train_minibatch_fn")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        loss_constructors = kwargs.pop("loss_constructors", None)
        if loss_constructors is not None:
            if "loss" in kwargs:
                raise ValueError("%s: give loss or loss_constructors, not both" % self._name)
            kwargs["loss"] = [make() for make in loss_constructors]
        if kwargs.pop("train_minibatch_fn", None) is not None:
            raise ValueError("%s: train_minibatch_fn is not supported by krug" % self._name)
        self._set_arguments(kwargs)

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
        spec = self._spec(run_id, dataset_idx, has_val)
        spec.update(model=copy.deepcopy(self.getModel()), optimizer_cls=type(optimizer),
                    optimizer_defaults=dict(optimizer.defaults),
                    optimizer_state=optimizer.state_dict(), label_shapes=self.getLabelShapes())
        return make_trainer(spec)

    def _create_model(self, result, run_id, metadata):
        import torch

        history, state = result
        model = copy.deepcopy(self.getModel())
        model.load_state_dict(torch.load(io.BytesIO(state), map_location="cpu"))
        model.eval()
        return TorchModel(model=model, **self._model_params(history, run_id, metadata))


keyword_signature(TorchEstimator)


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
