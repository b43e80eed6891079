"""dataservice: a tf.data-service-style input-processing cluster.

A drop-in for tf.data.experimental.service: `import dataservice as service`.
"""

from dataservice.client.api import CrossTrainerCache, distribute, from_dataset_id, register_dataset
from dataservice.client.distributed_save import distributed_save
from dataservice.config import DispatcherConfig, WorkerConfig
from dataservice.dispatcher.dispatch_server import DispatchServer
from dataservice.modes import ShardingPolicy
from dataservice.training.distributed_iterator import DistributedIterator, distributed_iterator
from dataservice.training.dtensor_input import dtensor_batches, pack_batch
from dataservice.training.input_contexts import input_context_options
from dataservice.training.input_impact import InputImpact, estimate_input_impact
from dataservice.worker.worker_server import WorkerServer

__all__ = [
    "CrossTrainerCache",
    "DispatchServer",
    "DistributedIterator",
    "InputImpact",
    "DispatcherConfig",
    "ShardingPolicy",
    "WorkerConfig",
    "WorkerServer",
    "distribute",
    "distributed_save",
    "distributed_iterator",
    "dtensor_batches",
    "estimate_input_impact",
    "from_dataset_id",
    "input_context_options",
    "pack_batch",
    "register_dataset",
]
