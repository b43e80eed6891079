"""A MirroredStrategy custom training loop whose input pipelines read from dataservice.

    python examples/mirrored_custom_loop.py [--replicas 2] [--epochs 5] [--service grpc://host:port]

distribute_datasets_from_function calls the dataset function once per input
pipeline; each pipeline reads a shared job (dataservice.input_context_options)
and batches per replica (InputContext.get_per_replica_batch_size).
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--service", help="grpc://host:port of a running dispatcher (default: start one here)")
    parser.add_argument("--workers", type=int, default=2, help="in-process workers when --service is not given")
    args = parser.parse_args()
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * args.replicas
    )

    import dataservice
    from dataservice.demo import sample_data
    from dataservice.local_cluster import service_or_local_cluster

    train_files, test_files = sample_data.write_digits(tempfile.mkdtemp(prefix="digits-"))
    strategy = tf.distribute.MirroredStrategy([f"CPU:{i}" for i in range(args.replicas)])
    with service_or_local_cluster(args.service, args.workers) as target, strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input([64]), tf.keras.layers.Dense(128, activation="relu"), tf.keras.layers.Dense(10)]
        )
        optimizer = tf.keras.optimizers.Adam(3e-3)
        optimizer.build(model.trainable_variables)  # its slots exist before the first traced step
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        accuracy = tf.keras.metrics.SparseCategoricalAccuracy()

        @tf.function
        def train_step(batch):
            def step(x, y):
                with tf.GradientTape() as tape:
                    logits = model(x, training=True)
                    loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=args.global_batch)
                optimizer.apply_gradients(
                    zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
                )
                accuracy.update_state(y, logits)
                return loss

            losses = strategy.run(step, args=batch)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        for epoch in range(args.epochs):

            def dataset_fn(context: tf.distribute.InputContext, epoch=epoch) -> tf.data.Dataset:
                batch = context.get_per_replica_batch_size(args.global_batch)
                return sample_data.digits_dataset(train_files, batch, shuffle_buffer=512).apply(
                    dataservice.distribute(
                        "distributed_epoch",
                        target,
                        **dataservice.input_context_options(context, f"mirrored-epoch-{epoch}"),
                    )
                )

            accuracy.reset_state()
            losses = [float(train_step(batch)) for batch in strategy.distribute_datasets_from_function(dataset_fn)]
            print(f"epoch {epoch}: loss {sum(losses) / len(losses):.3f} train accuracy {float(accuracy.result()):.3f}")
        test = sample_data.digits_dataset(test_files, 64, drop_remainder=False)
        correct = total = 0
        for x, y in test:
            correct += int(tf.reduce_sum(tf.cast(tf.argmax(model(x), axis=1) == y, tf.int32)))
            total += int(y.shape[0])
        print(f"test accuracy {correct / total:.3f}")


if __name__ == "__main__":
    main()
