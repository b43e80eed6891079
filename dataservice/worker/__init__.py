"""A worker: registers and heartbeats with the dispatcher, runs its tasks' pipelines into
bounded buffers, and streams their elements to clients over TCP or gRPC."""
