"""The demo's MLP trained in JAX, data-parallel over a mesh, fed by the service without TensorFlow.

    python -m dataservice.demo.jax_mlp [--workers 2] [--epochs 8] [--batch 64] [--devices 8]
                                       [--feed service|local]

The same model and data as the DTensor demo (python -m dataservice.demo): the
digits' 64-256-128-10 MLP, Adam at 3e-3, every global batch sharded over the
"batch" axis of a mesh of virtual CPU devices. The pipeline (list_files +
interleave + parse + shuffle + batch) is registered by a process of its own
(register_digits.py) and runs on the workers in distributed_epoch; this
process reads it with NumpyReader and never imports TensorFlow (it says so
at the end). `--feed local` runs the same pipeline with local tf.data
(as_numpy_iterator(), importing TensorFlow here) to compare epoch times.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

NUM_FEATURES = 64
NUM_CLASSES = 10


def _set_devices(count: int) -> None:
    """Virtual CPU devices for the mesh: XLA reads the flag when JAX first starts its backend."""
    flag = f"--xla_force_host_platform_device_count={count}"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()


def init_params(sizes: list[int], seed: int = 22) -> list[dict[str, Any]]:
    """Xavier-uniform weights and zero biases, as the DTensor demo's DenseLayer."""
    import jax
    import jax.numpy as jnp

    params = []
    key = jax.random.PRNGKey(seed)
    for a, b in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        limit = (6.0 / (a + b)) ** 0.5
        params.append({"w": jax.random.uniform(sub, (a, b), jnp.float32, -limit, limit), "b": jnp.zeros(b)})
    return params


def make_steps(learning_rate: float = 3e-3, beta_1: float = 0.9, beta_2: float = 0.999, eps: float = 1e-7):
    """(train_step, test_step), jitted: Adam as the DTensor demo's hand-written one."""
    import jax
    import jax.numpy as jnp

    def logits_of(params, x):
        for i, layer in enumerate(params):
            x = x @ layer["w"] + layer["b"]
            if i < len(params) - 1:
                x = jax.nn.relu(x)
        return x

    def loss_and_accuracy(params, x, y):
        logits = logits_of(params, x)
        loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))
        return loss, jnp.mean(jnp.argmax(logits, axis=1) == y)

    @jax.jit
    def train_step(state, x, y):
        params, v, s, t = state
        (loss, acc), grads = jax.value_and_grad(loss_and_accuracy, has_aux=True)(params, x, y)
        v = jax.tree.map(lambda v, g: beta_1 * v + (1 - beta_1) * g, v, grads)
        s = jax.tree.map(lambda s, g: beta_2 * s + (1 - beta_2) * g * g, s, grads)
        params = jax.tree.map(
            lambda p, v, s: p - learning_rate * (v / (1 - beta_1**t)) / (jnp.sqrt(s / (1 - beta_2**t)) + eps),
            params,
            v,
            s,
        )
        return (params, v, s, t + 1), loss, acc

    return train_step, jax.jit(loss_and_accuracy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="global batch size (a multiple of --devices)")
    parser.add_argument("--devices", type=int, default=8, help="virtual CPU devices in the mesh")
    parser.add_argument("--feed", choices=["service", "local"], default="service")
    args = parser.parse_args(argv)
    if min(args.workers, args.epochs, args.batch, args.devices) < 1:
        parser.error("--workers, --epochs, --batch and --devices must be positive")
    if args.batch % args.devices:
        parser.error(f"--batch {args.batch} must be a multiple of --devices {args.devices}")
    _set_devices(args.devices)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    from dataservice.demo.register_digits import register_in_a_process
    from dataservice.frameworks.jax_input import jax_batches
    from dataservice.local_cluster import LocalCluster
    from dataservice.reader import NumpyReader

    if len(jax.devices()) < args.devices:
        raise SystemExit(f"JAX has {len(jax.devices())} devices, fewer than --devices {args.devices}")
    mesh = Mesh(np.array(jax.devices()[: args.devices]), ("batch",))
    data_dir = tempfile.mkdtemp(prefix="dataservice-digits-")
    params = init_params([NUM_FEATURES, 256, 128, NUM_CLASSES])
    zeros = jax.tree.map(jnp.zeros_like, params)
    state = (params, zeros, zeros, 1.0)
    train_step, test_step = make_steps()
    with LocalCluster(num_workers=args.workers) as cluster:
        ids = register_in_a_process(cluster.target, data_dir, args.batch)
        if args.feed == "service":
            train: Any = NumpyReader(cluster.target, ids["train"], "distributed_epoch")
            test: Any = NumpyReader(cluster.target, ids["test"], "distributed_epoch")
        else:
            train, test = _local_feeds(data_dir, args.batch)
        print(
            f"training a 64-256-128-10 MLP in JAX on a {args.devices}-device mesh, global batch {args.batch}, "
            f"fed by {'the service (NumpyReader)' if args.feed == 'service' else 'local tf.data'}",
            flush=True,
        )
        for epoch in range(1, args.epochs + 1):
            start = time.monotonic()
            losses, accuracies, examples = [], [], 0
            for x, y in jax_batches(train, mesh):
                state, loss, acc = train_step(state, x, y)
                losses.append(loss)
                accuracies.append(acc)
                examples += args.batch
            train_loss = float(jnp.mean(jnp.stack(losses)))
            train_acc = float(jnp.mean(jnp.stack(accuracies)))
            seconds = time.monotonic() - start
            results = [test_step(state[0], x, y) for x, y in jax_batches(test, mesh)]
            test_loss = float(np.mean([float(loss) for loss, _ in results]))
            test_acc = float(np.mean([float(acc) for _, acc in results]))
            print(
                f"epoch {epoch}: train loss {train_loss:.3f} accuracy {train_acc:.3f} | test loss "
                f"{test_loss:.3f} accuracy {test_acc:.3f} | {examples} examples in {seconds:.2f} s "
                f"({examples / seconds:.0f} examples/s)",
                flush=True,
            )
    print(f"final test accuracy {test_acc:.3f}")
    print(f"tensorflow imported by the trainer: {'yes' if 'tensorflow' in sys.modules else 'no'}")
    return 0


def _local_feeds(data_dir: str, batch: int) -> tuple[Any, Any]:
    """The same pipelines run by local tf.data in this process (the comparison)."""
    from dataservice.quiet import quiet_tensorflow

    quiet_tensorflow()
    from dataservice.demo import sample_data

    train_files = os.path.join(data_dir, "digits-train-*.tfrecord")
    test_files = os.path.join(data_dir, "digits-test-*.tfrecord")

    class Feed:
        def __init__(self, pattern: str, shuffle: int):
            self.dataset = sample_data.digits_dataset(pattern, batch, shuffle_buffer=shuffle)

        def __iter__(self):
            return self.dataset.as_numpy_iterator()

    return Feed(train_files, 512), Feed(test_files, 0)


if __name__ == "__main__":
    sys.exit(main())
