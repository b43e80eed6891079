"""The client: registers datasets, joins iterations and reads their elements from the workers
with credit-based flow control."""
