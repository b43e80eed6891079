"""Keras model.fit on batches that dataservice workers prepare (distributed_epoch over TFRecord shards).

python examples/keras_fit.py [--epochs 8] [--service grpc://host:port]
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

import dataservice
from dataservice.demo import sample_data
from dataservice.local_cluster import service_or_local_cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--service", help="grpc://host:port of a running dispatcher (default: start one here)")
    parser.add_argument("--workers", type=int, default=2, help="in-process workers when --service is not given")
    args = parser.parse_args()
    train_files, test_files = sample_data.write_digits(tempfile.mkdtemp(prefix="digits-"))
    with service_or_local_cluster(args.service, args.workers) as target:
        train = sample_data.digits_dataset(train_files, 32, shuffle_buffer=512).apply(
            dataservice.distribute("distributed_epoch", target)
        )
        model = tf.keras.Sequential(
            [
                tf.keras.Input([sample_data.NUM_FEATURES]),
                tf.keras.layers.Dense(128, activation="relu"),
                tf.keras.layers.Dense(sample_data.NUM_CLASSES),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.Adam(3e-3),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        model.fit(train, epochs=args.epochs, verbose=2)
        _, accuracy = model.evaluate(sample_data.digits_dataset(test_files, 64, drop_remainder=False), verbose=0)
        print(f"test accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
