"""The DTensor data-parallel MLP of TensorFlow's DTensor tutorial, for the demo and the examples.

Weights are replicated over the mesh (UNSHARDED layouts), batches are sharded
along its "batch" dimension, and a hand-written Adam keeps its slots as
DVariables: each device trains the same model on its shard of the global
batch, as MirroredStrategy would. Layer sizes are the caller's (the tutorial's
784-700-500-10 suits MNIST; the bundled digits have 64 features).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from tensorflow.experimental import dtensor


def virtual_cpu_mesh(num_devices: int, dim: str = "batch") -> dtensor.Mesh:
    """A one-dimensional mesh over `num_devices` logical CPUs (configured on first use;
    TensorFlow allows that only before it initializes its devices)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured is None:
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
        except RuntimeError:
            pass  # devices already initialized: use what exists, or fail below
    available = len(tf.config.list_logical_devices("CPU"))
    if available < num_devices:
        raise RuntimeError(
            f"a mesh of {num_devices} CPUs needs that many logical CPU devices, but TensorFlow "
            f"already started with {available}: build the mesh before running any TensorFlow op"
        )
    devices = [f"CPU:{i}" for i in range(num_devices)]
    return dtensor.create_mesh([(dim, num_devices)], devices=devices)


class DenseLayer(tf.Module):
    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        weight_layout: dtensor.Layout,
        activation=tf.identity,
        seed: tuple[int, int] = (22, 23),
    ):
        super().__init__()
        self.activation = activation
        limit = tf.sqrt(6.0) / tf.sqrt(tf.cast(in_dim + out_dim, tf.float32))  # Xavier
        self.w = dtensor.DVariable(
            dtensor.call_with_layout(
                tf.function(tf.random.stateless_uniform),
                weight_layout,
                shape=(in_dim, out_dim),
                seed=seed,
                minval=-limit,
                maxval=limit,
            )
        )
        self.b = dtensor.DVariable(dtensor.call_with_layout(tf.zeros, weight_layout.delete([0]), shape=[out_dim]))

    def __call__(self, x):
        return self.activation(tf.add(tf.matmul(x, self.w), self.b))


class MLP(tf.Module):
    def __init__(self, sizes: Sequence[int], mesh: dtensor.Mesh):
        super().__init__()
        layout = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh)
        self.layers: list[DenseLayer] = [
            DenseLayer(a, b, layout, activation=tf.nn.relu if i < len(sizes) - 2 else tf.identity, seed=(22, 23 + i))
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))
        ]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Adam(tf.Module):
    def __init__(
        self, model_vars, learning_rate: float = 1e-3, beta_1: float = 0.9, beta_2: float = 0.999, ep: float = 1e-7
    ):
        super().__init__()
        self.model_vars = model_vars
        self.beta_1, self.beta_2, self.learning_rate, self.ep = beta_1, beta_2, learning_rate, ep
        mesh = model_vars[0].layout.mesh
        self.t = dtensor.DVariable(dtensor.call_with_layout(tf.ones, dtensor.Layout([], mesh), shape=[]))
        self.v_dvar = [
            dtensor.DVariable(dtensor.call_with_layout(tf.zeros, v.layout, shape=v.shape)) for v in model_vars
        ]
        self.s_dvar = [
            dtensor.DVariable(dtensor.call_with_layout(tf.zeros, v.layout, shape=v.shape)) for v in model_vars
        ]

    def apply_gradients(self, grads) -> None:
        for d_var, var, v, s in zip(grads, self.model_vars, self.v_dvar, self.s_dvar):
            v.assign(self.beta_1 * v + (1 - self.beta_1) * d_var)
            s.assign(self.beta_2 * s + (1 - self.beta_2) * tf.square(d_var))
            v_bc = v / (1 - self.beta_1**self.t)
            s_bc = s / (1 - self.beta_2**self.t)
            var.assign_sub(self.learning_rate * (v_bc / (tf.sqrt(s_bc) + self.ep)))
        self.t.assign_add(1.0)


def cross_entropy_loss(logits, labels):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def accuracy(logits, labels):
    return tf.reduce_mean(tf.cast(tf.equal(labels, tf.argmax(logits, axis=1)), tf.float32))


@tf.function
def train_step(model: MLP, optimizer: Adam, x, y):
    with tf.GradientTape() as tape:
        logits = model(x)
        loss = cross_entropy_loss(logits, y)
    optimizer.apply_gradients(tape.gradient(loss, model.trainable_variables))
    return loss, accuracy(logits, y)


@tf.function
def test_step(model: MLP, x, y):
    logits = model(x)
    return cross_entropy_loss(logits, y), accuracy(logits, y)
