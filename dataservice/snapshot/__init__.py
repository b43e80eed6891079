"""distributed_save: snapshots in TensorFlow's distributed-snapshot layout, which
tf.data.Dataset.load reads without dataservice (layout.py: the directory; chunk_file.py:
the chunk files)."""
