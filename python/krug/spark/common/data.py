"""Training data of krug.spark's estimators: DataFrame -> Parquet files in the Store (written by
the executors with pyarrow, through the Store's fsspec filesystem) -> numpy arrays in each rank.
No petastorm: pyarrow reads and writes the files directly."""

import posixpath
import uuid

import numpy as np


def check_columns(df, columns, what):
    """Raises ValueError naming the columns of ``columns`` that df lacks."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError("%s: column(s) %s not in the DataFrame (its columns: %s)"
                         % (what, ", ".join(missing), ", ".join(df.columns)))


def _vectors_to_arrays(df, columns):
    """Spark ML vectors (VectorAssembler's output) become array<double> columns, which Arrow
    can carry."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    for field in df.schema.fields:
        if field.name in columns and isinstance(field.dataType, VectorUDT):
            df = df.withColumn(field.name, vector_to_array(df[field.name]))
    return df


def write_dataframe(df, store, path, columns):
    """Writes df's ``columns`` under ``path`` of ``store`` as Parquet files (one per non-empty
    partition), replacing what was there. Returns the number of rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    fs = store.fs
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.makedirs(path, exist_ok=True)
    run = uuid.uuid4().hex[:8]
    selected = _vectors_to_arrays(df.select(*columns), columns)

    def write_partition(batches):
        from pyspark import TaskContext

        batches = [b for b in batches if b.num_rows > 0]
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        name = posixpath.join(path, "part-%05d-%s.parquet" % (TaskContext.get().partitionId(),
                                                            run))
        with fs.open(name, "wb") as f:
            pq.write_table(table, f)
        yield pa.RecordBatch.from_pydict({"file": [name], "rows": [table.num_rows]})

    schema = StructType([StructField("file", StringType()), StructField("rows", LongType())])
    written = selected.mapInArrow(write_partition, schema).collect()
    return sum(r["rows"] for r in written)


def _column_to_numpy(column):
    import pyarrow as pa

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(column)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or \
            pa.types.is_fixed_size_list(column.type):
        values = column.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(n, -1) if n else values.reshape(0, 0)
    return column.to_numpy(zero_copy_only=False)


def read_columns(store, path, columns):
    """Every row of the Parquet dataset at ``path``: {column: numpy array} (list columns as 2-D
    arrays), files in sorted order so that every rank sees the same row order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = store.parquet_files(path)
    if not files:
        raise ValueError("krug.spark: no Parquet files under %s in %s; write the data first "
                         "(fit() does) or check the store path" % (path, store))
    tables = []
    for name in files:
        with store.fs.open(name, "rb") as f:
            tables.append(pq.read_table(f, columns=list(columns)))
    table = pa.concat_tables(tables)
    return {c: _column_to_numpy(table.column(c)) for c in columns}


def shard_indices(n, rank, size, seed=None):
    """This rank's row indices of an n-row dataset: a permutation by ``seed`` (none: in order),
    padded by wrapping so that every rank gets the same number, dealt round-robin (as
    torch.utils.data.DistributedSampler deals)."""
    order = np.arange(n) if seed is None else np.random.RandomState(seed).permutation(n)
    per_rank = -(-n // size)
    padded = np.resize(order, per_rank * size) if n else order
    return padded[rank::size]
