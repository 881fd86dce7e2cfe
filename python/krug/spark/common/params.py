"""The Spark ML params of krug's estimators: Horovod's EstimatorParams and ModelParams, with a
getter and setter for each (getBatchSize / setBatchSize, ...)."""

from pyspark.ml.param.shared import Param, Params


def _camel(name):
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _declare(cls, specs):
    """Adds a Param and its get<Name> / set<Name> for every (name, default, doc) of specs, and
    its default to ``cls._param_defaults`` (a class's own and those it inherits, in order)."""
    cls._param_defaults = dict(getattr(cls, "_param_defaults", {}))
    for name, default, doc in specs:
        cls._param_defaults[name] = default
        setattr(cls, name, Param(Params._dummy(), name, doc))

        def getter(self, _name=name):
            return self.getOrDefault(getattr(self, _name))

        def setter(self, value, _name=name):
            return self._set(**{_name: value})

        setattr(cls, "get" + _camel(name), getter)
        setattr(cls, "set" + _camel(name), setter)
    return cls


ESTIMATOR_PARAMS = [
    ("num_proc", None, "number of krug ranks (default: the Spark context's default parallelism)"),
    ("model", None, "the model to train"),
    ("backend", None, "not supported by krug: give num_proc"),
    ("store", None, "Store for the training data, checkpoints and logs"),
    ("optimizer", None, "the optimizer, wrapped in the framework's DistributedOptimizer"),
    ("loss", None, "the loss function"),
    ("metrics", None, "metrics computed on the validation data each epoch"),
    ("loss_weights", None, "weights of several losses"),
    ("sample_weight_col", None, "column of per-row loss weights"),
    ("gradient_compression", None, "compression of the gradients (krug.torch.Compression)"),
    ("feature_cols", None, "columns of the model's inputs, in the order of its arguments"),
    ("label_cols", None, "columns of the labels, one per model output"),
    ("validation", None, "a fraction of rows held out for validation, or a 0/1 column"),
    ("callbacks", None, "callbacks run during training"),
    ("batch_size", 32, "rows per rank per step"),
    ("val_batch_size", None, "rows per rank per validation step (default: batch_size)"),
    ("epochs", 1, "number of epochs"),
    ("verbose", 1, "0 quiet, 1 one line per epoch, 2 more"),
    ("random_seed", None, "seed of the model's framework and of the shuffles"),
    ("shuffle", True, "shuffle the training rows every epoch"),
    ("shuffle_buffer_size", None, "accepted for Horovod compatibility; krug shuffles whole epochs"),
    ("partitions_per_process", None, "accepted for Horovod compatibility"),
    ("run_id", None, "name of the run in the store (default: made from the time)"),
    ("train_steps_per_epoch", None, "at most this many training steps per epoch"),
    ("validation_steps_per_epoch", None, "at most this many validation steps per epoch"),
    ("transformation_fn", None, "not supported by krug"),
    ("train_reader_num_workers", None, "accepted for Horovod compatibility (pyarrow reads)"),
    ("val_reader_num_workers", None, "accepted for Horovod compatibility (pyarrow reads)"),
    ("reader_pool_type", "thread", "accepted for Horovod compatibility (pyarrow reads)"),
    ("label_shapes", None, "shapes the labels are reshaped to"),
    ("input_shapes", None, "shapes the inputs are reshaped to (without the batch dimension)"),
    ("inmemory_cache_all", False, "accepted for Horovod compatibility: ranks hold their rows in "
                                  "memory anyway"),
    ("use_gpu", True, "train on this rank's GPU when there is one"),
    ("mp_start_method", None, "accepted for Horovod compatibility"),
    ("output_cols", None, "columns transform() adds (default: <label>__output)"),
]

# Params a user may set that krug's estimators cannot honour: fit() refuses them by name
# rather than training differently from what was asked.
UNSUPPORTED = ("backend", "transformation_fn", "sample_weight_col", "loss_weights")


class _DeclaredParams(Params):
    """Params whose defaults are the declared ones (``_param_defaults``)."""

    def __init__(self):
        super().__init__()
        self._setDefault(**self._param_defaults)


class EstimatorParams(_DeclaredParams):
    """Horovod's estimator params (see ESTIMATOR_PARAMS)."""


_declare(EstimatorParams, ESTIMATOR_PARAMS)

# (name, doc); a model's params have no default.
MODEL_PARAMS = [
    ("model", "the trained model"),
    ("history", "per-epoch metrics of the training"),
    ("feature_columns", "columns of the model's inputs"),
    ("label_columns", "columns of the labels"),
    ("output_cols", "columns transform() adds"),
    ("input_shapes", "shapes the inputs are reshaped to"),
    ("run_id", "name of the run in the store"),
    ("metadata", "row counts of the training data"),
]


class ModelParams(_DeclaredParams):
    """What a trained model carries (Horovod's ModelParams)."""


_declare(ModelParams, [(name, None, doc) for name, doc in MODEL_PARAMS])
