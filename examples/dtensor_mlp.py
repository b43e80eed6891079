"""DTensor data-parallel training of the tutorial's MLP, every batch read from dataservice.

    python examples/dtensor_mlp.py [--epochs 5] [--devices 8] [--service grpc://host:port]

The global batch is split along the mesh's "batch" dimension: one call,
dataservice.dtensor_batches, replaces the tutorial's repack_batch.
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from dataservice.demo import mlp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--service", help="grpc://host:port of a running dispatcher (default: start one here)")
    parser.add_argument("--workers", type=int, default=2, help="in-process workers when --service is not given")
    args = parser.parse_args()
    mesh = mlp.virtual_cpu_mesh(args.devices)  # before any TensorFlow op

    import dataservice
    from dataservice.demo import sample_data
    from dataservice.local_cluster import service_or_local_cluster

    train_files, test_files = sample_data.write_digits(tempfile.mkdtemp(prefix="digits-"))
    with service_or_local_cluster(args.service, args.workers) as target:
        to_service = dataservice.distribute("distributed_epoch", target)
        train = sample_data.digits_dataset(train_files, args.batch, shuffle_buffer=512).apply(to_service)
        test = sample_data.digits_dataset(test_files, args.batch).apply(to_service)
        model = mlp.MLP([64, 256, 128, 10], mesh)
        optimizer = mlp.Adam(model.trainable_variables, learning_rate=3e-3)
        for epoch in range(args.epochs):
            results = [mlp.train_step(model, optimizer, x, y) for x, y in dataservice.dtensor_batches(train, mesh)]
            tests = [mlp.test_step(model, x, y) for x, y in dataservice.dtensor_batches(test, mesh)]
            mean = lambda values: sum(float(v) for v in values) / len(values)  # noqa: E731
            print(
                f"epoch {epoch}: train loss {mean([r[0] for r in results]):.3f} "
                f"accuracy {mean([r[1] for r in results]):.3f}, test accuracy {mean([t[1] for t in tests]):.3f}"
            )


if __name__ == "__main__":
    main()
