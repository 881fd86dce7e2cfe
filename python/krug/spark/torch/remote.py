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
    store, run_id = spec["store"], spec["run_id"]
    seed = spec["random_seed"]
    if seed is not None:
        torch.manual_seed(seed)
    from krug.spark.task import device_index

    # The GPU Spark assigned to the task (Horovod's rule), else the local rank's.
    device = torch.device("cuda", device_index(hvd.local_rank())) \
        if spec["use_gpu"] and torch.cuda.is_available() else torch.device("cpu")
    model = spec["model"].to(device)
    optimizer = spec["optimizer_cls"](model.parameters(), **spec["optimizer_defaults"])
    optimizer.load_state_dict(spec["optimizer_state"])
    start_epoch, history = 0, []
    checkpoint = store.get_checkpoint_path(run_id)
    if checkpoint and store.exists(checkpoint):
        # A run with this id was interrupted: go on from its last completed epoch.
        state = torch.load(io.BytesIO(store.read(checkpoint)), map_location=device,
                           weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, history = state["epoch"] + 1, state["history"]
    else:
        # Horovod's estimators scale the learning rate with the number of ranks (the batch is
        # that many times larger); a checkpoint holds the scaled rate already.
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * hvd.size()
    compression = spec["gradient_compression"] or hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    features, labels = spec["feature_cols"], spec["label_cols"]
    idx = spec["dataset_idx"]
    train = read_columns(store, store.get_train_data_path(idx), features + labels)
    val = read_columns(store, store.get_val_data_path(idx), features + labels) \
        if spec["has_val"] else None
    loss_fn, metrics = spec["loss"], spec["metrics"] or []
    batch = spec["batch_size"]
    val_batch = spec["val_batch_size"] or batch

    def batches(columns, rows, size, seed_, limit):
        n = len(columns[features[0]])
        order = shard_indices(n, hvd.rank(), hvd.size(), seed_)
        steps = -(-len(order) // size)
        if limit:
            steps = min(steps, limit)
        for s in range(steps):
            take = order[s * size:(s + 1) * size]
            part = {c: columns[c][take] for c in columns}
            xs = [t.to(device) for t in _tensors(torch, part, features, spec["input_shapes"],
                                                  torch.float32)]
            ys = [t.to(device) for t in _labels(torch, part, labels, spec["label_shapes"])]
            yield xs, ys

    def compute_loss(outputs, ys):
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        losses = loss_fn if isinstance(loss_fn, (list, tuple)) else [loss_fn] * len(ys)
        return sum(f(o, _like(o, y)) for f, o, y in zip(losses, outputs, ys))

    def averaged(value, count, name):
        t = hvd.allreduce(torch.tensor([value * count, float(count)]), op=hvd.Sum, name=name)
        return float(t[0] / t[1]) if float(t[1]) > 0 else float("nan")

    for epoch in range(start_epoch, spec["epochs"]):
        model.train()
        total, count = 0.0, 0
        shuffle_seed = ((seed or 0) * 1000003 + epoch) if spec["shuffle"] else None
        for xs, ys in batches(train, None, batch, shuffle_seed, spec["train_steps_per_epoch"]):
            optimizer.zero_grad()
            loss = compute_loss(model(*xs), ys)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(ys[0])
            count += len(ys[0])
        logs = {"epoch": epoch, "train_loss": averaged(total / max(count, 1), count,
                                                       "krug.spark.train_loss.%d" % epoch)}
        if val is not None:
            model.eval()
            sums = np.zeros(1 + len(metrics))
            vcount = 0
            with torch.no_grad():
                for xs, ys in batches(val, None, val_batch, None,
                                      spec["validation_steps_per_epoch"]):
                    out = model(*xs)
                    first = out[0] if isinstance(out, (list, tuple)) else out
                    sums[0] += float(compute_loss(out, ys)) * len(ys[0])
                    for m, fn in enumerate(metrics):
                        sums[1 + m] += float(fn(first, ys[0])) * len(ys[0])
                    vcount += len(ys[0])
            total_t = hvd.allreduce(torch.tensor(list(sums) + [float(vcount)],
                                                 dtype=torch.float64),
                                    op=hvd.Sum, name="krug.spark.val.%d" % epoch)
            n = max(float(total_t[-1]), 1.0)
            logs["val_loss"] = float(total_t[0]) / n
            for m, fn in enumerate(metrics):
                logs["val_" + getattr(fn, "__name__", "metric%d" % m)] = float(total_t[1 + m]) / n
        history.append(logs)
        for cb in spec["callbacks"] or []:
            if hasattr(cb, "on_epoch_end"):
                cb.on_epoch_end(epoch, logs)
        if hvd.rank() == 0:
            if spec["verbose"]:
                print("epoch %d: %s" % (epoch, ", ".join("%s=%.4f" % (k, v) for k, v in
                                                         logs.items() if k != "epoch")),
                      flush=True)
            if checkpoint:
                buf = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch, "history": history}, buf)
                store.write(checkpoint, buf.getvalue())
                store.write(posixpath.join(store.get_logs_path(run_id), "history.json"),
                            json.dumps(history).encode())
    if hvd.rank() != 0:
        return None
    buf = io.BytesIO()
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, buf)
    return history, buf.getvalue()
