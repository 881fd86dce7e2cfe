"""Where krug.spark's estimators keep their data and runs (Horovod's horovod.spark.common.store).

A Store is a prefix path on a filesystem: a local (or shared) directory, or any filesystem
fsspec knows (``s3://bucket/dir``, ``gs://...``, ``memory://...``; the protocol's fsspec
package must be installed). Under the prefix:

    train_data[.<idx>]/    Parquet files of the training rows (written by fit, read by ranks)
    val_data[.<idx>]/      the validation rows
    runs/<run_id>/         checkpoint (after every epoch) and logs/ (the history) of a run

Ranks read and write it with pyarrow through the same fsspec filesystem: the Store object is
pickled to them, so its filesystem must be reachable from every executor."""

import os
import posixpath
import uuid


class Store:
    """A prefix path on an fsspec filesystem. Use :meth:`create`."""

    def __init__(self, prefix_path, fs, train_path=None, val_path=None, test_path=None,
                 runs_path=None, save_runs=True, checkpoint_filename=None):
        self.prefix_path = prefix_path.rstrip("/") or "/"
        self.fs = fs
        self._train_path = train_path or self._join("train_data")
        self._val_path = val_path or self._join("val_data")
        self._test_path = test_path or self._join("test_data")
        self._runs_path = runs_path or self._join("runs")
        self._save_runs = save_runs
        self._checkpoint_filename = checkpoint_filename or "checkpoint"

    @staticmethod
    def create(prefix_path, *args, **kwargs):
        """A Store for ``prefix_path`` (Horovod's arguments: ``train_path``, ``val_path``,
        ``test_path``, ``runs_path``, ``save_runs``, ``checkpoint_filename``, and
        ``storage_options``, a dict for the fsspec filesystem): a local path (or file://...),
        ``dbfs:/...`` (Databricks' FUSE mount, /dbfs/...), else an fsspec URL."""
        if prefix_path.startswith("dbfs:/"):
            prefix_path = "/dbfs/" + prefix_path[len("dbfs:/"):].lstrip("/")
        if "://" not in prefix_path or prefix_path.startswith("file://"):
            return LocalStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)

    def _join(self, *parts):
        return posixpath.join(self.prefix_path, *parts)

    # Horovod's layout --------------------------------------------------------------------
    def get_filesystem(self):
        return self.fs

    def get_train_data_path(self, idx=None):
        return self._train_path if idx is None else "%s.%s" % (self._train_path, idx)

    def get_val_data_path(self, idx=None):
        return self._val_path if idx is None else "%s.%s" % (self._val_path, idx)

    def get_test_data_path(self, idx=None):
        return self._test_path if idx is None else "%s.%s" % (self._test_path, idx)

    def saving_runs(self):
        return self._save_runs

    def get_runs_path(self):
        return self._runs_path

    def get_run_path(self, run_id):
        return posixpath.join(self._runs_path, run_id)

    def get_checkpoint_path(self, run_id):
        return posixpath.join(self.get_run_path(run_id), self._checkpoint_filename) \
            if self._save_runs else None

    def get_checkpoint_filename(self):
        return self._checkpoint_filename

    def get_logs_subdir(self):
        return "logs"

    def get_logs_path(self, run_id):
        return posixpath.join(self.get_run_path(run_id), self.get_logs_subdir()) \
            if self._save_runs else None

    # Access ------------------------------------------------------------------------------
    def exists(self, path):
        return self.fs.exists(path)

    def read(self, path):
        with self.fs.open(path, "rb") as f:
            return f.read()

    def write(self, path, data):
        """Writes bytes to path (its parent directories are made), replacing it whole."""
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with self.fs.open(path, "wb") as f:
            f.write(data)

    def is_parquet_dataset(self, path):
        try:
            return any(p.endswith(".parquet") for p in self.fs.ls(path, detail=False))
        except (FileNotFoundError, OSError):
            return False

    def parquet_files(self, path):
        """The dataset's Parquet files, sorted (every rank lists them in the same order)."""
        return sorted(p for p in self.fs.ls(path, detail=False) if p.endswith(".parquet"))

    def check_writable(self):
        """Raises ValueError naming the store when a file cannot be written under its prefix."""
        probe = self._join(".krug-write-check-%s" % uuid.uuid4().hex)
        try:
            self.write(probe, b"ok")
            self.fs.rm(probe)
        except Exception as e:  # noqa: B902 - fsspec backends raise many types
            raise ValueError("krug.spark: the store %s cannot be written (%s: %s); give the "
                             "estimator a store path that this driver and every executor can "
                             "write" % (self, type(e).__name__, e)) from e

    def __repr__(self):
        return "%s(%r)" % (type(self).__name__, self.prefix_path)


class LocalStore(Store):
    """A directory of the local filesystem (shared by the executors, or one machine)."""

    def __init__(self, prefix_path, *args, storage_options=None, **kwargs):
        import fsspec

        del storage_options  # nothing to configure on the local filesystem
        if prefix_path.startswith("file://"):
            prefix_path = prefix_path[len("file://"):]
        super().__init__(os.path.abspath(prefix_path), fsspec.filesystem("file"), *args,
                         **kwargs)


class FilesystemStore(Store):
    """A prefix URL on any fsspec filesystem."""

    def __init__(self, prefix_path, *args, storage_options=None, **kwargs):
        from fsspec.core import url_to_fs

        fs, path = url_to_fs(prefix_path, **(storage_options or {}))
        super().__init__(path, fs, *args, **kwargs)
        self.url = prefix_path


__all__ = ["Store", "LocalStore", "FilesystemStore"]
