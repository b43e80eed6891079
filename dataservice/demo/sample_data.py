"""Real data that ships offline, for the demo, the examples and the learning tests.

scikit-learn bundles the UCI handwritten digits (1,797 8x8 grayscale images,
10 classes) inside its wheel, so no download is needed. They are written as
TFRecord shards, the way training data usually sits on disk, and read with
list_files + interleave + parse + batch, a pipeline that distributed_epoch
splits by file.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

NUM_FEATURES = 64
NUM_CLASSES = 10
_FEATURES = {
    "pixels": tf.io.FixedLenFeature([NUM_FEATURES], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def write_digits(directory: str, num_shards: int = 8, test_fraction: float = 0.2, seed: int = 0) -> tuple[str, str]:
    """Writes the digits as `num_shards` train and `num_shards` test TFRecord files;
    returns the (train, test) file patterns. Pixels are scaled to [0, 1]."""
    from sklearn.datasets import load_digits  # the data sits in scikit-learn's wheel

    if num_shards < 1 or not 0 < test_fraction < 1:
        raise ValueError("num_shards must be positive and test_fraction in (0, 1)")
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    pixels = (digits.data[order] / 16.0).astype(np.float32)
    labels = digits.target[order].astype(np.int64)
    test_count = int(len(labels) * test_fraction)
    os.makedirs(directory, exist_ok=True)
    for split, rows in (("test", slice(0, test_count)), ("train", slice(test_count, None))):
        split_pixels, split_labels = pixels[rows], labels[rows]
        for shard in range(num_shards):
            path = os.path.join(directory, f"digits-{split}-{shard:05d}-of-{num_shards:05d}.tfrecord")
            with tf.io.TFRecordWriter(path) as writer:
                for x, y in zip(split_pixels[shard::num_shards], split_labels[shard::num_shards]):
                    example = tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[y])),
                            }
                        )
                    )
                    writer.write(example.SerializeToString())
    return (os.path.join(directory, "digits-train-*.tfrecord"), os.path.join(directory, "digits-test-*.tfrecord"))


def digits_dataset(
    pattern: str, batch_size: int, shuffle_buffer: int = 0, drop_remainder: bool = True, seed: int = 0
) -> tf.data.Dataset:
    """Batches of (pixels [batch, 64] float32, label [batch] int64) from the shards of `pattern`."""
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
    examples = records.map(lambda r: tf.io.parse_single_example(r, _FEATURES), num_parallel_calls=tf.data.AUTOTUNE)
    if shuffle_buffer:
        examples = examples.shuffle(shuffle_buffer, seed=seed)
    return examples.map(lambda e: (e["pixels"], e["label"])).batch(batch_size, drop_remainder=drop_remainder)
