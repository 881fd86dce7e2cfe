"""krug.spark.keras.KerasEstimator on the tests' local Spark cluster: the digits example trains
to >= 95 % held-out. Needs krug.keras (Horovod's horovod.keras API); skipped, saying so, when
this build has none."""

import importlib
import os
import sys

import pytest

from conftest import assert_no_stray_processes, by_value

try:
    import krug.keras  # noqa: F401
    KRUG_KERAS = None
except ImportError as e:
    KRUG_KERAS = "krug.keras is not available in this build (%s); KerasEstimator trains with it" % e

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


@pytest.mark.skipif(KRUG_KERAS is not None, reason=str(KRUG_KERAS))
def test_keras_digits_example_trains_to_95_percent(spark, tmp_path):
    sys.path.insert(0, EXAMPLES)
    try:
        example = importlib.import_module("spark_keras_digits")
    finally:
        sys.path.remove(EXAMPLES)
    by_value(example.__name__)
    store_path = str(tmp_path / "store")
    accuracy, fitted = example.train(spark, num_proc=2, store_path=store_path, epochs=20)
    assert accuracy >= 0.95, accuracy
    assert len(fitted.getHistory()["loss"]) == 20
    assert os.path.getsize(os.path.join(store_path, "runs", fitted.getRunId(),
                                        "checkpoint")) > 0
    assert_no_stray_processes()


def test_keras_estimator_rejects_a_model_that_is_not_keras(spark, tmp_path):
    pytest.importorskip("keras")
    from krug.spark.common.store import Store
    from krug.spark.keras import KerasEstimator

    df = spark.createDataFrame([([0.0] * 4, 1)], "x array<double>, y long")
    est = KerasEstimator(num_proc=2, model=object(), store=Store.create(str(tmp_path)),
                         optimizer="sgd", loss="mse", feature_cols=["x"], label_cols=["y"],
                         epochs=1)
    with pytest.raises(ValueError, match="model must be a keras.Model"):
        est.fit(df)
