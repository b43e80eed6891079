"""The worker: runs task pipelines and streams their elements to clients."""
