"""Pipelines as the service handles them: graph serialization and fingerprints, the split
sources of distributed_epoch and the rebuilt pipelines, static sharding."""
