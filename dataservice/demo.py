"""The demo: a local cluster (a dispatcher and two worker processes) streaming a real pipeline.

    python -m dataservice.demo [--workers 2] [--elements 20000] [--batch 64]

The pipeline makes synthetic 32x32 RGB images with labels, augments them
(random flips, brightness, crops) and batches them: the kind of
preprocessing that starves an accelerator when the host does it alone. Every
worker runs the whole pipeline (parallel_epochs), so the client receives
workers x elements images. Prints the throughput as it goes and a summary.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import dataservice  # noqa: E402
from dataservice.local_cluster import LocalCluster  # noqa: E402


def image_pipeline(num_elements: int, batch_size: int) -> tf.data.Dataset:
    def make_example(i):
        seed = tf.stack([i, tf.constant(7, tf.int64)])
        image = tf.random.stateless_uniform([36, 36, 3], seed=seed)
        label = tf.cast(i % 10, tf.int32)
        return image, label

    def augment(image, label):
        image = tf.image.random_flip_left_right(image)
        image = tf.image.random_brightness(image, 0.2)
        image = tf.image.random_crop(image, [32, 32, 3])
        return tf.clip_by_value(image, 0.0, 1.0), label

    return (tf.data.Dataset.range(num_elements)
            .map(make_example, num_parallel_calls=tf.data.AUTOTUNE)
            .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--elements", type=int, default=20000, help="images per worker (one epoch)")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    if args.workers < 1 or args.elements < 1 or args.batch < 1:
        parser.error("--workers, --elements and --batch must be positive")

    print(f"starting a dispatcher and {args.workers} worker processes ...", flush=True)
    started = time.monotonic()
    with LocalCluster(num_workers=args.workers) as cluster:
        print(f"cluster up in {time.monotonic() - started:.1f} s: dispatcher at {cluster.target}, "
              f"workers at {', '.join(w.address for w in cluster.workers)}", flush=True)
        dataset = image_pipeline(args.elements, args.batch).apply(
            dataservice.distribute(processing_mode="parallel_epochs", service=cluster.target))
        print(f"element spec: {dataset.element_spec}", flush=True)
        images = batches = 0
        label_counts = [0] * 10
        start = last_report = time.monotonic()
        first_batch_s = None
        for image, label in dataset:
            if first_batch_s is None:
                first_batch_s = time.monotonic() - start
            batches += 1
            images += int(image.shape[0])
            for value in label.numpy():
                label_counts[value] += 1
            now = time.monotonic()
            if now - last_report >= 1.0:
                print(f"  {images:>8} images  {images / (now - start):>9.0f} images/s  "
                      f"{images * 32 * 32 * 3 * 4 / (now - start) / 1e6:>7.1f} MB/s", flush=True)
                last_report = now
        elapsed = time.monotonic() - start
    expected = args.workers * args.elements
    print(f"done: {images} images in {batches} batches, {elapsed:.2f} s, {images / elapsed:.0f} images/s "
          f"({images * 32 * 32 * 3 * 4 / elapsed / 1e6:.1f} MB/s); first batch after {first_batch_s:.2f} s")
    print(f"labels 0-9: {label_counts}")
    print(f"expected {expected} images ({args.workers} workers x {args.elements}): "
          f"{'OK' if images == expected else 'MISMATCH'}")
    print("cluster stopped")
    return 0 if images == expected else 1


if __name__ == "__main__":
    sys.exit(main())
