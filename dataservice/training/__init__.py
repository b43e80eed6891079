"""Where a service dataset meets training: tf.distribute input contexts, DTensor batches,
and an estimate of whether the service would help. The names are exported by
`dataservice/__init__.py`."""
