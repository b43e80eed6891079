"""Generated protobuf and gRPC modules (proto/generate.py writes them)."""
