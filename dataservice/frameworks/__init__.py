"""Trainers in other frameworks reading the service without TensorFlow (reader.py's NumpyReader):
jax_input.py shards each global batch over a JAX mesh; each module imports only its framework."""
