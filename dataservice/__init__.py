"""dataservice: a tf.data-service-style input-processing cluster.

A drop-in for tf.data.experimental.service: `import dataservice as service`.

The public names are loaded on first use (PEP 562), so that importing the
package, or running one of its programs (`data-server`, the demo), does not
import TensorFlow before the program has set TensorFlow's logging up, and a
trainer that reads with NumpyReader (or imports `dataservice.errors`) never
imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module that defines it.
_PUBLIC = {
    "CrossTrainerCache": "dataservice.client.read_options",
    "distribute": "dataservice.client.api",
    "from_dataset_id": "dataservice.client.api",
    "register_dataset": "dataservice.client.api",
    "distributed_save": "dataservice.client.distributed_save",
    "DispatcherConfig": "dataservice.config",
    "WorkerConfig": "dataservice.config",
    "DispatchServer": "dataservice.dispatcher.dispatch_server",
    "ShardingPolicy": "dataservice.modes",
    "DistributedIterator": "dataservice.training.distributed_iterator",
    "NumpyReader": "dataservice.reader",
    "distributed_iterator": "dataservice.training.distributed_iterator",
    "dtensor_batches": "dataservice.training.dtensor_input",
    "pack_batch": "dataservice.training.dtensor_input",
    "input_context_options": "dataservice.training.input_contexts",
    "InputImpact": "dataservice.training.input_impact",
    "estimate_input_impact": "dataservice.training.input_impact",
    "WorkerServer": "dataservice.worker.worker_server",
}

__all__ = [
    "CrossTrainerCache",
    "DispatchServer",
    "DispatcherConfig",
    "DistributedIterator",
    "InputImpact",
    "NumpyReader",
    "ShardingPolicy",
    "WorkerConfig",
    "WorkerServer",
    "distribute",
    "distributed_iterator",
    "distributed_save",
    "dtensor_batches",
    "estimate_input_impact",
    "from_dataset_id",
    "input_context_options",
    "pack_batch",
    "register_dataset",
]


assert set(__all__) == set(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'dataservice' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and editors read
    from dataservice.client.api import distribute, from_dataset_id, register_dataset
    from dataservice.client.distributed_save import distributed_save
    from dataservice.client.read_options import CrossTrainerCache
    from dataservice.config import DispatcherConfig, WorkerConfig
    from dataservice.dispatcher.dispatch_server import DispatchServer
    from dataservice.modes import ShardingPolicy
    from dataservice.reader import NumpyReader
    from dataservice.training.distributed_iterator import DistributedIterator, distributed_iterator
    from dataservice.training.dtensor_input import dtensor_batches, pack_batch
    from dataservice.training.input_contexts import input_context_options
    from dataservice.training.input_impact import InputImpact, estimate_input_impact
    from dataservice.worker.worker_server import WorkerServer
