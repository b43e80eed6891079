"""Benchmarks (`python -m dataservice.bench`): workloads through TensorFlow's own service and
ours side by side, reported as ratios."""
