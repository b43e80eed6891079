"""The dispatcher: a transport-free core (core.py) over a pure state machine (state.py) and its
journal, with a thin gRPC servicer and the server that binds, recovers and collects garbage."""
