"""The PyTorch adapter's parts that need no cluster: tensors over the received buffers, and
arguments refused in the process that builds the DataLoader (frameworks/torch_input.py)."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch

from dataservice.client.numpy_elements import RaggedComponents, SparseComponents
from dataservice.frameworks.torch_input import ServiceIterableDataset, to_torch

Pair = collections.namedtuple("Pair", ["left", "right"])


def test_arrays_become_tensors_over_the_same_memory_without_a_warning():
    received = np.arange(12, dtype=np.float32).reshape(3, 4)
    received.setflags(write=False)  # as a view of a received message is
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = to_torch(received)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32 and tuple(tensor.shape) == (3, 4)
    assert np.shares_memory(tensor.numpy(), received)


def test_structures_keep_their_shape_and_strings_stay_bytes():
    element = {
        "pair": Pair(np.int64(3), np.array([1.5, 2.5])),
        "names": np.array([b"a", b"bc"], dtype=object),
        "ragged": RaggedComponents(np.arange(3), (np.array([0, 1, 3]),)),
        "sparse": SparseComponents(np.array([[0, 1]]), np.array([7]), np.array([2, 2])),
        "list": [np.zeros(2, np.uint8)],
        "scalar_string": b"x",
    }
    out = to_torch(element)
    assert isinstance(out["pair"], Pair) and out["pair"].left.item() == 3 and out["pair"].left.dim() == 0
    assert out["pair"].right.tolist() == [1.5, 2.5]
    assert out["names"].tolist() == [b"a", b"bc"]
    assert isinstance(out["ragged"], RaggedComponents) and out["ragged"].flat_values.tolist() == [0, 1, 2]
    assert out["ragged"].nested_row_splits[0].tolist() == [0, 1, 3]
    assert isinstance(out["sparse"], SparseComponents) and out["sparse"].values.tolist() == [7]
    assert out["list"][0].dtype == torch.uint8 and out["scalar_string"] == b"x"


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({}, ValueError, "needs a dataset_id, or the job_name"),
        ({"dataset_id": "1", "processing_mode": "sometimes"}, ValueError, "processing_mode"),
        ({"dataset_id": "1", "consumer_index": 0, "num_consumers": 2}, ValueError, "coordinated rounds"),
        ({"dataset_id": "1", "repetition": 2}, ValueError, "set_epoch"),
        ({"dataset_id": "1", "max_outstanding_requests": 0}, ValueError, "max_outstanding_requests"),
        ({"dataset_id": "1", "batch_size": 8}, TypeError, "batch_size"),
    ],
)
def test_arguments_are_refused_before_any_worker_starts(kwargs, error, message):
    with pytest.raises(error, match=message):
        ServiceIterableDataset("grpc://localhost:1", **kwargs)


def test_set_epoch_takes_only_a_non_negative_integer_and_names_the_next_pass():
    dataset = ServiceIterableDataset("grpc://localhost:1", "1", "distributed_epoch")
    assert dataset.job_name.startswith("torch-")
    assert ServiceIterableDataset("grpc://localhost:1", "1").job_name != dataset.job_name
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="non-negative integer"):
            dataset.set_epoch(bad)
    dataset.set_epoch(3)
    assert dataset.epoch == 3
