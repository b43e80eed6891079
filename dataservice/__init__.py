"""dataservice: a tf.data-service-style input-processing cluster.

A drop-in for tf.data.experimental.service: `import dataservice as service`.
"""

from dataservice.client.api import distribute, from_dataset_id, register_dataset
from dataservice.config import DispatcherConfig, WorkerConfig
from dataservice.dispatcher.server import DispatchServer
from dataservice.modes import ShardingPolicy
from dataservice.worker.server import WorkerServer

__all__ = [
    "DispatchServer",
    "DispatcherConfig",
    "ShardingPolicy",
    "WorkerConfig",
    "WorkerServer",
    "distribute",
    "from_dataset_id",
    "register_dataset",
]
