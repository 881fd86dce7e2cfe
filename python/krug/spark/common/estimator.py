"""What krug's Spark estimators share: checks before training, DataFrame -> Store, one
krug.spark.run of the framework's trainer, and a Spark ML Model whose transform() adds the
model's outputs (computed on the executors)."""

import inspect
import time

from pyspark.ml import Estimator, Model

from krug.spark.common.data import check_columns, write_dataframe
from krug.spark.common.params import UNSUPPORTED, EstimatorParams, ModelParams
from krug.spark.common.store import Store


class KrugEstimator(Estimator, EstimatorParams):
    """Base of TorchEstimator and KerasEstimator. Subclasses give ``_name``, ``_check_model``,
    ``_train_fn(run_id, train_rows, val_rows)`` (returns a function run on every rank) and
    ``_create_model(result, run_id, metadata)``."""

    _name = "krug.spark"
    # Keyword arguments of the constructor besides the params, which the subclass handles.
    _extra_arguments = ()

    def __init__(self, **kwargs):
        """Horovod's keyword arguments: every param (see ``help`` for the list)."""
        super().__init__()
        unknown = sorted(k for k in kwargs
                         if k not in self._extra_arguments and k not in self._param_defaults)
        if unknown:
            raise TypeError("%s() got unexpected keyword arguments: %s"
                            % (type(self).__name__, ", ".join(unknown)))

    def _set_arguments(self, kwargs):
        self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def setParams(self, **kwargs):
        return self._set(**kwargs)

    # -- checks ---------------------------------------------------------------------------
    def _check_params(self):
        for name in UNSUPPORTED:
            if self.getOrDefault(getattr(self, name)) is not None:
                raise ValueError("%s: the %s parameter is not supported by krug's estimators"
                                 % (self._name, name))
        for name in ("model", "store", "feature_cols", "label_cols"):
            if not self.getOrDefault(getattr(self, name)):
                raise ValueError("%s: the %s parameter is required" % (self._name, name))
        store = self.getStore()
        if not isinstance(store, Store):
            raise ValueError("%s: store must be a krug.spark.common.store.Store (Store.create("
                             "path)), got %r" % (self._name, store))
        for name in ("batch_size", "epochs"):
            value = self.getOrDefault(getattr(self, name))
            if not isinstance(value, int) or value < 1:
                raise ValueError("%s: %s must be a positive integer, got %r"
                                 % (self._name, name, value))
        self._check_model()

    def _check_model(self):
        pass

    def _data_columns(self):
        return list(self.getFeatureCols()) + list(self.getLabelCols())

    def _run_id(self):
        return self.getRunId() or "%s_%d" % (self._name.rsplit(".", 1)[-1], int(time.time()))

    def _spec(self, run_id, dataset_idx, has_val):
        """What every framework's trainer takes (krug.spark.<framework>.remote): the run, its
        data and the training params; a subclass adds the model and the optimizer."""
        return {
            "store": self.getStore(), "run_id": run_id, "dataset_idx": dataset_idx,
            "has_val": has_val, "loss": self.getLoss(), "metrics": self.getMetrics(),
            "feature_cols": list(self.getFeatureCols()), "label_cols": list(self.getLabelCols()),
            "input_shapes": self.getInputShapes(), "batch_size": self.getBatchSize(),
            "val_batch_size": self.getValBatchSize(), "epochs": self.getEpochs(),
            "random_seed": self.getRandomSeed(), "shuffle": self.getShuffle(),
            "train_steps_per_epoch": self.getTrainStepsPerEpoch(),
            "validation_steps_per_epoch": self.getValidationStepsPerEpoch(),
            "callbacks": self.getCallbacks(), "verbose": self.getVerbose(),
            "gradient_compression": self.getGradientCompression(), "use_gpu": self.getUseGpu(),
        }

    def _model_params(self, history, run_id, metadata):
        """The params of the trained model (a KrugModel) that fit returns, its model aside."""
        return dict(history=history, feature_columns=self.getFeatureCols(),
                    label_columns=self.getLabelCols(),
                    output_cols=self.getOrDefault(self.output_cols),
                    input_shapes=self.getInputShapes(), run_id=run_id, metadata=metadata)

    # -- fit ------------------------------------------------------------------------------
    def _fit(self, df):
        self._check_params()
        store = self.getStore()
        validation = self.getValidation()
        columns = self._data_columns()
        check_columns(df, columns + ([validation] if isinstance(validation, str) else []),
                      self._name)
        store.check_writable()
        train_df, val_df = self._split(df, validation)
        train_rows = write_dataframe(train_df, store, store.get_train_data_path(), columns)
        val_rows = 0
        if val_df is not None:
            val_rows = write_dataframe(val_df, store, store.get_val_data_path(), columns)
        if train_rows == 0:
            raise ValueError("%s: the DataFrame has no training rows" % self._name)
        return self._fit_on_prepared_data(train_rows, val_rows)

    def _split(self, df, validation):
        if validation is None or validation == 0:
            return df, None
        if isinstance(validation, str):
            return (df.filter(df[validation].cast("int") == 0),
                    df.filter(df[validation].cast("int") == 1))
        if isinstance(validation, float) and 0 < validation < 1:
            seed = self.getRandomSeed()
            train, val = df.randomSplit([1 - validation, validation],
                                        seed=seed if seed is not None else 0)
            return train, val
        raise ValueError("%s: validation must be a column name or a fraction in (0, 1), got %r"
                         % (self._name, validation))

    def fit_on_parquet(self, params=None, dataset_idx=None):
        """Trains on Parquet data already in the store (its train_data[.idx] and, when present,
        val_data[.idx] paths), e.g. written by an earlier fit."""
        est = self.copy(params) if params else self
        est._check_params()
        store = est.getStore()
        store.check_writable()
        train_path = store.get_train_data_path(dataset_idx)
        if not store.is_parquet_dataset(train_path):
            raise ValueError("%s: no Parquet training data at %s in %s" % (est._name, train_path,
                                                                           store))
        val_path = store.get_val_data_path(dataset_idx)
        has_val = store.is_parquet_dataset(val_path)
        return est._fit_on_prepared_data(None, None if has_val else 0, dataset_idx)

    def _fit_on_prepared_data(self, train_rows, val_rows, dataset_idx=None):
        from krug.spark import run

        run_id = self._run_id()
        trainer = self._train_fn(run_id, dataset_idx, val_rows != 0)
        results = run(trainer, num_proc=self.getNumProc(), verbose=self.getVerbose())
        metadata = {"train_rows": train_rows, "val_rows": val_rows, "num_proc": len(results)}
        return self._create_model(results[0], run_id, metadata)


class KrugModel(Model, ModelParams):
    """A trained model as a Spark Transformer: transform(df) adds output_cols (default
    ``<label>__output``), each the model's output for the row (a number, or an array for a
    vector output). Subclasses give ``_predict_fn()``: a function from {column: numpy array}
    of a batch of rows to the model's outputs, one numpy array per output column."""

    def __init__(self, **kwargs):
        super().__init__()
        self._set(**kwargs)

    def getOutputCols(self):
        cols = self.getOrDefault(self.output_cols)
        return cols or ["%s__output" % c for c in self.getLabelColumns()]

    def _transform(self, df):
        import numpy as np
        from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

        from krug.spark.common.data import _vectors_to_arrays

        features = list(self.getFeatureColumns())
        check_columns(df, features, "transform")
        df = _vectors_to_arrays(df, features)
        predict = self._predict_fn()
        out_cols = self.getOutputCols()
        sample = df.select(*features).limit(1).toPandas()
        if len(sample) == 0:
            kinds = [False] * len(out_cols)
        else:
            outs = predict(_pandas_to_numpy(sample, features))
            kinds = [np.asarray(o).reshape(1, -1).shape[1] > 1 for o in outs]
        fields = [StructField(c, ArrayType(DoubleType()) if vec else DoubleType())
                  for c, vec in zip(out_cols, kinds)]
        schema = StructType(df.schema.fields + fields)

        def predict_partition(frames):
            for pdf in frames:
                if len(pdf) == 0:
                    continue
                outs = predict(_pandas_to_numpy(pdf, features))
                pdf = pdf.copy()
                for c, vec, o in zip(out_cols, kinds, outs):
                    o = np.asarray(o, dtype=np.float64).reshape(len(pdf), -1)
                    pdf[c] = list(o) if vec else o[:, 0]
                yield pdf

        return df.mapInPandas(predict_partition, schema)


def keyword_signature(cls):
    """Gives ``cls.__init__`` (``**kwargs``) the signature that help() and inspect show:
    every param of ``cls`` with its default, then the extra arguments."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(name, keyword, default=default)
               for name, default in cls._param_defaults.items()]
    params += [inspect.Parameter(name, keyword, default=None) for name in cls._extra_arguments]
    cls.__init__.__signature__ = inspect.Signature(params)
    return cls


def _pandas_to_numpy(pdf, columns):
    import numpy as np

    out = {}
    for c in columns:
        values = pdf[c].to_numpy()
        if len(values) and isinstance(values[0], (list, np.ndarray)):
            values = np.stack([np.asarray(v) for v in values])
        out[c] = values
    return out
