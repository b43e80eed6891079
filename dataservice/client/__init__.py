"""The client: registers datasets and reads iterations from the workers."""
