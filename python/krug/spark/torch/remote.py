"""The training function every rank of a TorchEstimator.fit runs (inside krug.spark.run)."""

import io
import json
import posixpath


def _tensors(torch, columns, names, shapes, dtype):
    out = []
    for i, name in enumerate(names):
        t = torch.as_tensor(columns[name])
        t = t.to(dtype) if dtype is not None else t
        if shapes and i < len(shapes) and shapes[i] is not None:
            t = t.reshape([-1] + list(shapes[i]))
        out.append(t)
    return out


def _labels(torch, columns, names, shapes):
    out = []
    for i, name in enumerate(names):
        values = columns[name]
        t = torch.as_tensor(values)
        t = t.long() if t.dtype in (torch.int32, torch.int64, torch.int16, torch.int8) \
            else t.float()
        if shapes and i < len(shapes) and shapes[i] is not None:
            t = t.reshape([-1] + list(shapes[i]))
        out.append(t)
    return out


def _like(output, label):
    """The label in the output's shape when they hold as many values (Horovod's rule): a (N, 1)
    output against a (N,) label would otherwise broadcast to (N, N) in an element-wise loss."""
    if hasattr(output, "shape") and output.shape != label.shape and \
            output.numel() == label.numel():
        return label.reshape(output.shape)
    return label


def make_trainer(spec):
    """A function of no arguments for krug.spark.run; ``spec`` is a dict of plain values, the
    model and the optimizer (pickled to every rank with the function)."""

    def train():
        import numpy as np
        import torch

        import krug.torch as hvd
        from krug.spark.common.data import read_columns, shard_indices

        hvd.init()
        try:
            return _train(hvd, np, torch, read_columns, shard_indices, spec)
        finally:
            hvd.shutdown()

    return train


def _train(hvd, np, torch, read_columns, shard_indices, spec):
    run = _Training(hvd, np, torch, shard_indices, spec)
    start_epoch, history = run.restore_or_scale_lr()
    run.distribute()
    train, val = run.read_data(read_columns)
    for epoch in range(start_epoch, spec["epochs"]):
        logs = run.train_epoch(epoch, train)
        if val is not None:
            logs.update(run.validate(epoch, val))
        history.append(logs)
        run.end_epoch(epoch, logs, history)
    return run.result(history)


class _Training:
    """One rank's side of TorchEstimator.fit: its model, optimizer and shard of the data."""

    def __init__(self, hvd, np, torch, shard_indices, spec):
        from krug.spark.task import device_index

        self.hvd, self.np, self.torch, self.spec = hvd, np, torch, spec
        self.shard_indices = shard_indices
        self.store, self.run_id = spec["store"], spec["run_id"]
        self.seed = spec["random_seed"]
        if self.seed is not None:
            torch.manual_seed(self.seed)
        # The GPU Spark assigned to the task (Horovod's rule), else the local rank's.
        self.device = torch.device("cuda", device_index(hvd.local_rank())) \
            if spec["use_gpu"] and torch.cuda.is_available() else torch.device("cpu")
        self.model = spec["model"].to(self.device)
        self.optimizer = spec["optimizer_cls"](self.model.parameters(),
                                               **spec["optimizer_defaults"])
        self.optimizer.load_state_dict(spec["optimizer_state"])
        self.checkpoint = self.store.get_checkpoint_path(self.run_id)
        self.features, self.labels = spec["feature_cols"], spec["label_cols"]
        self.loss_fn, self.metrics = spec["loss"], spec["metrics"] or []

    def restore_or_scale_lr(self):
        """The first epoch to train and the history so far: a run with this id that was
        interrupted goes on from its last completed epoch."""
        if self.checkpoint and self.store.exists(self.checkpoint):
            state = self.torch.load(io.BytesIO(self.store.read(self.checkpoint)),
                                    map_location=self.device, weights_only=False)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            return state["epoch"] + 1, state["history"]
        # Horovod's estimators scale the learning rate with the number of ranks (the batch is
        # that many times larger); a checkpoint holds the scaled rate already.
        for group in self.optimizer.param_groups:
            group["lr"] = group["lr"] * self.hvd.size()
        return 0, []

    def distribute(self):
        """The distributed optimizer, and rank 0's parameters and optimizer state everywhere."""
        hvd = self.hvd
        compression = self.spec["gradient_compression"] or hvd.Compression.none
        self.optimizer = hvd.DistributedOptimizer(
            self.optimizer, named_parameters=self.model.named_parameters(),
            compression=compression)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)

    def read_data(self, read_columns):
        """The training columns and the validation columns (None without validation data)."""
        store, idx, columns = self.store, self.spec["dataset_idx"], self.features + self.labels
        train = read_columns(store, store.get_train_data_path(idx), columns)
        val = read_columns(store, store.get_val_data_path(idx), columns) \
            if self.spec["has_val"] else None
        return train, val

    def batches(self, columns, size, seed, limit):
        """This rank's batches of `columns` as (inputs, labels) on the device, at most `limit`
        of them when it is set; `seed` shuffles (None keeps the order)."""
        hvd, torch, spec = self.hvd, self.torch, self.spec
        order = self.shard_indices(len(columns[self.features[0]]), hvd.rank(), hvd.size(), seed)
        steps = -(-len(order) // size)
        if limit:
            steps = min(steps, limit)
        for s in range(steps):
            take = order[s * size:(s + 1) * size]
            part = {c: columns[c][take] for c in columns}
            xs = [t.to(self.device) for t in _tensors(torch, part, self.features,
                                                       spec["input_shapes"], torch.float32)]
            ys = [t.to(self.device)
                  for t in _labels(torch, part, self.labels, spec["label_shapes"])]
            yield xs, ys

    def loss(self, outputs, ys):
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        losses = self.loss_fn if isinstance(self.loss_fn, (list, tuple)) \
            else [self.loss_fn] * len(ys)
        return sum(f(o, _like(o, y)) for f, o, y in zip(losses, outputs, ys))

    def averaged(self, value, count, name):
        """The mean over every rank of a per-rank mean `value` of `count` samples."""
        t = self.hvd.allreduce(self.torch.tensor([value * count, float(count)]),
                               op=self.hvd.Sum, name=name)
        return float(t[0] / t[1]) if float(t[1]) > 0 else float("nan")

    def train_epoch(self, epoch, train):
        """One epoch over this rank's shard; the logs with the loss averaged over ranks."""
        spec = self.spec
        self.model.train()
        total, count = 0.0, 0
        shuffle_seed = ((self.seed or 0) * 1000003 + epoch) if spec["shuffle"] else None
        for xs, ys in self.batches(train, spec["batch_size"], shuffle_seed,
                                   spec["train_steps_per_epoch"]):
            self.optimizer.zero_grad()
            loss = self.loss(self.model(*xs), ys)
            loss.backward()
            self.optimizer.step()
            total += loss.item() * len(ys[0])
            count += len(ys[0])
        return {"epoch": epoch, "train_loss": self.averaged(
            total / max(count, 1), count, "krug.spark.train_loss.%d" % epoch)}

    def validate(self, epoch, val):
        """The validation loss and metrics over every rank's shard of `val`."""
        torch, spec = self.torch, self.spec
        self.model.eval()
        sums = self.np.zeros(1 + len(self.metrics))
        count = 0
        with torch.no_grad():
            for xs, ys in self.batches(val, spec["val_batch_size"] or spec["batch_size"], None,
                                       spec["validation_steps_per_epoch"]):
                out = self.model(*xs)
                first = out[0] if isinstance(out, (list, tuple)) else out
                sums[0] += float(self.loss(out, ys)) * len(ys[0])
                for m, fn in enumerate(self.metrics):
                    sums[1 + m] += float(fn(first, ys[0])) * len(ys[0])
                count += len(ys[0])
        total = self.hvd.allreduce(torch.tensor(list(sums) + [float(count)], dtype=torch.float64),
                                   op=self.hvd.Sum, name="krug.spark.val.%d" % epoch)
        n = max(float(total[-1]), 1.0)
        logs = {"val_loss": float(total[0]) / n}
        for m, fn in enumerate(self.metrics):
            logs["val_" + getattr(fn, "__name__", "metric%d" % m)] = float(total[1 + m]) / n
        return logs

    def end_epoch(self, epoch, logs, history):
        """The callbacks; on rank 0 the progress line and the checkpoint."""
        for cb in self.spec["callbacks"] or []:
            if hasattr(cb, "on_epoch_end"):
                cb.on_epoch_end(epoch, logs)
        if self.hvd.rank() != 0:
            return
        if self.spec["verbose"]:
            print("epoch %d: %s" % (epoch, ", ".join("%s=%.4f" % (k, v) for k, v in
                                                     logs.items() if k != "epoch")),
                  flush=True)
        if self.checkpoint:
            self.save_checkpoint(epoch, history)

    def save_checkpoint(self, epoch, history):
        buf = io.BytesIO()
        self.torch.save({"model": self.model.state_dict(),
                         "optimizer": self.optimizer.state_dict(),
                         "epoch": epoch, "history": history}, buf)
        self.store.write(self.checkpoint, buf.getvalue())
        self.store.write(posixpath.join(self.store.get_logs_path(self.run_id), "history.json"),
                         json.dumps(history).encode())

    def result(self, history):
        """Rank 0's (history, the trained weights saved by torch.save); None elsewhere."""
        if self.hvd.rank() != 0:
            return None
        buf = io.BytesIO()
        self.torch.save({k: v.cpu() for k, v in self.model.state_dict().items()}, buf)
        return history, buf.getvalue()
