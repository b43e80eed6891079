"""The demo: train an MLP data-parallel (DTensor) on data that a local dataservice cluster prepares.

    python -m dataservice.demo [--workers 2] [--epochs 8] [--batch 64] [--devices 8] [--output-dir demo_output]
                               [--linger SECONDS]

Starts a dispatcher (with a temporary work_dir) and worker processes, writes
the handwritten digits that ship inside scikit-learn as TFRecord shards, and
trains the DTensor tutorial's MLP (sized to the data: 64-256-128-10) on a mesh
of virtual CPU devices. Every batch comes from the service: list_files +
interleave + parse + shuffle + batch runs on the workers, whose files the
dispatcher splits between them (distributed_epoch), and each global batch is
sharded over the mesh's "batch" dimension. Prints per-epoch loss, accuracy and
throughput, saves loss and accuracy plots as PNG, and stops the cluster. It
prints the address of the dispatcher's status page first; with --linger the
cluster stays up that many seconds after training, to look at the page.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from dataservice.quiet import quiet_tensorflow

quiet_tensorflow()

import dataservice  # noqa: E402
from dataservice.demo import mlp  # noqa: E402  (imports TensorFlow; the mesh is made before any op runs)


def _plot(history: dict[str, list[float]], output_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for metric, title in (("loss", "Cross-entropy loss"), ("accuracy", "Accuracy")):
        fig, ax = plt.subplots(figsize=(6, 4))
        epochs = range(1, len(history[f"train_{metric}"]) + 1)
        ax.plot(epochs, history[f"train_{metric}"], marker="o", label=f"training {metric}")
        ax.plot(epochs, history[f"test_{metric}"], marker="o", label=f"test {metric}")
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.set_title(f"{title} vs epochs (digits through dataservice)")
        ax.legend()
        fig.tight_layout()
        path = os.path.join(output_dir, f"{metric}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="global batch size (a multiple of --devices)")
    parser.add_argument("--devices", type=int, default=8, help="virtual CPU devices in the DTensor mesh")
    parser.add_argument("--output-dir", default="demo_output", help="where the PNG plots go")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    parser.add_argument(
        "--linger", type=float, default=0.0, metavar="SECONDS", help="keep the cluster up this long after training"
    )
    args = parser.parse_args(argv)
    if min(args.workers, args.epochs, args.batch, args.devices) < 1:
        parser.error("--workers, --epochs, --batch and --devices must be positive")
    if args.linger < 0:
        parser.error("--linger must be >= 0 seconds")
    if args.batch % args.devices:
        parser.error(f"--batch {args.batch} must be a multiple of --devices {args.devices}")

    mesh = mlp.virtual_cpu_mesh(args.devices)
    from tqdm import tqdm

    from dataservice.demo import sample_data
    from dataservice.local_cluster import LocalCluster

    data_dir = tempfile.mkdtemp(prefix="dataservice-digits-")
    train_files, test_files = sample_data.write_digits(data_dir, num_shards=8)
    print(f"wrote the digits as TFRecord shards under {data_dir}", flush=True)
    print(f"starting a dispatcher and {args.workers} worker processes ...", flush=True)
    started = time.monotonic()
    history: dict[str, list[float]] = {k: [] for k in ("train_loss", "train_accuracy", "test_loss", "test_accuracy")}
    with LocalCluster(num_workers=args.workers) as cluster:
        print(
            f"cluster up in {time.monotonic() - started:.1f} s: dispatcher at {cluster.target} "
            f"(work_dir {cluster.work_dir}), workers at {', '.join(w.address for w in cluster.workers)}",
            flush=True,
        )
        print(f"status page: {cluster.status_page_url} (metrics at {cluster.status_page_url}metrics)", flush=True)
        to_service = dataservice.distribute("distributed_epoch", cluster.target)
        train = sample_data.digits_dataset(train_files, args.batch, shuffle_buffer=512).apply(to_service)
        test = sample_data.digits_dataset(test_files, args.batch).apply(to_service)
        model = mlp.MLP([sample_data.NUM_FEATURES, 256, 128, sample_data.NUM_CLASSES], mesh)
        optimizer = mlp.Adam(model.trainable_variables, learning_rate=3e-3)
        print(f"training a 64-256-128-10 MLP on a {args.devices}-device mesh, global batch {args.batch}", flush=True)
        for epoch in range(1, args.epochs + 1):
            start = time.monotonic()
            losses, accuracies, examples = [], [], 0
            bar = tqdm(desc=f"epoch {epoch}/{args.epochs}", unit=" batch", disable=args.no_progress, leave=False)
            for x, y in dataservice.dtensor_batches(train, mesh):
                loss, acc = mlp.train_step(model, optimizer, x, y)
                losses.append(float(loss))
                accuracies.append(float(acc))
                examples += args.batch
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.close()
            seconds = time.monotonic() - start
            test_results = [mlp.test_step(model, x, y) for x, y in dataservice.dtensor_batches(test, mesh)]
            history["train_loss"].append(sum(losses) / len(losses))
            history["train_accuracy"].append(sum(accuracies) / len(accuracies))
            history["test_loss"].append(sum(float(loss) for loss, _ in test_results) / len(test_results))
            history["test_accuracy"].append(sum(float(a) for _, a in test_results) / len(test_results))
            print(
                f"epoch {epoch}: train loss {history['train_loss'][-1]:.3f} accuracy "
                f"{history['train_accuracy'][-1]:.3f} | test loss {history['test_loss'][-1]:.3f} accuracy "
                f"{history['test_accuracy'][-1]:.3f} | {examples} examples in {seconds:.2f} s "
                f"({examples / seconds:.0f} examples/s)",
                flush=True,
            )
        if args.linger:
            print(f"the cluster stays up for {args.linger:.0f} s: {cluster.status_page_url}", flush=True)
            time.sleep(args.linger)
    print("cluster stopped", flush=True)
    os.makedirs(args.output_dir, exist_ok=True)
    paths = _plot(history, args.output_dir)
    print(f"plots: {', '.join(paths)}")
    print(f"final test accuracy {history['test_accuracy'][-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
