"""The dispatcher: state machine, journal and gRPC server."""
