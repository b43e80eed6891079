"""distributed_save(), as tf.data.experimental.distributed_save: the service's workers write
a dataset to a directory that plain TensorFlow loads (tf.data.Dataset.load), with or
without dataservice installed.

The call registers the dataset and asks the dispatcher to start the save, then returns; the
save goes on in the cluster (the dispatcher journals its progress: a restarted dispatcher
resumes it, a lost worker's unfinished chunk is written again by another). Its end is the
directory's DONE file, or its ERROR file; `Dataset.load(path, wait=True)` reads while it runs.
"""

from __future__ import annotations

import os

import tensorflow as tf
from tensorflow.core.protobuf import snapshot_pb2

from dataservice.client.api import register_pipeline
from dataservice.client.read_options import timeout_s as _timeout_s
from dataservice.pipeline import graph as graph_lib
from dataservice.rpc import addresses
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.snapshot import chunk_file, layout
from dataservice.tf_errors import raising_tf_errors


@raising_tf_errors
def distributed_save(
    dataset: tf.data.Dataset,
    path: str,
    data_service_address: str,
    compression: str | None = "AUTO",
    *,
    dispatcher_timeout_ms: int | None = None,
) -> tf.Operation | None:
    """Starts writing `dataset` to the directory `path` (which must not exist) with the service at
    `data_service_address` ("host:port", or "grpc[+tls]://host:port"); returns at once.

    In a tf.Graph TensorFlow's distributed_save returns an op that starts the save when it runs;
    this one starts the save when called (as register_dataset registers when called) and returns
    an op that does nothing, so that code running the op works unchanged.

    compression: "AUTO" (snappy), "SNAPPY", "GZIP", or None. Needs a dispatcher in
    fault_tolerant_mode and a pipeline whose sources the dispatcher can split (as for
    distributed_epoch). Raises tf.errors.AlreadyExistsError when `path` exists or a save to it
    has started, tf.errors.InvalidArgumentError for a dispatcher not in fault_tolerant_mode.
    """
    if not isinstance(data_service_address, str):
        raise ValueError(
            f"`data_service_address` must be a string, but is a {type(data_service_address)} ({data_service_address})"
        )
    if not data_service_address:
        raise ValueError("`data_service_address` must not be empty")
    if compression not in layout.COMPRESSIONS:
        raise ValueError(f"compression must be 'AUTO', 'SNAPPY', 'GZIP' or None, got {compression!r}")
    if not isinstance(path, str) or not path:
        raise ValueError(f"path must be a non-empty string, got {path!r}")
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
    chunk_file.check_plain_tensors(dataset.element_spec)
    target = addresses.parse_service(data_service_address)
    timeout_s = _timeout_s(dispatcher_timeout_ms)
    dataset_id = register_pipeline(target, dataset, None, "", timeout_s, splittable=True)
    metadata = snapshot_pb2.DistributedSnapshotMetadata(
        element_spec=graph_lib.encode_element_spec(dataset.element_spec), compression=layout.COMPRESSIONS[compression]
    )
    with DispatcherClient(target.address, timeout_s, shared=True, tls=target.tls) as dispatcher:
        dispatcher.snapshot(dataset_id, os.path.abspath(path), metadata.SerializeToString())
    return None if tf.executing_eagerly() else tf.no_op(name="distributed_save")
