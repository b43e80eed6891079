"""Config fields that None means "the default" for: __post_init__ puts the default in their place,
and servers read them through config.resolved() as the values they are."""

import dataclasses

import pytest

from dataservice.config import (
    DEFAULT_DISPATCHER_TIMEOUT_MS,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DispatcherConfig,
    WorkerConfig,
    resolved,
)


def test_a_workers_defaults_are_resolved_values():
    config = WorkerConfig(dispatcher_address="grpc://localhost:5050")
    assert resolved(config.heartbeat_interval_ms) == DEFAULT_HEARTBEAT_INTERVAL_MS
    assert resolved(config.dispatcher_timeout_ms) == DEFAULT_DISPATCHER_TIMEOUT_MS
    assert resolved(config.worker_address) == "localhost:%port%"
    assert resolved(config.data_transfer_address) == "localhost:%dts_port%"
    assert resolved(config.memory_budget_bytes) > 0 and resolved(config.cross_trainer_cache_size_bytes) > 0
    assert resolved(config.worker_tags) == ()


def test_a_dispatchers_timeouts_are_resolved_values():
    config = DispatcherConfig()
    for name in ("worker_timeout_ms", "client_timeout_ms", "job_gc_check_interval_ms", "job_gc_timeout_ms"):
        assert isinstance(resolved(getattr(config, name)), int), name


def test_a_field_read_before_resolution_is_an_error_not_a_none():
    unresolved = WorkerConfig.__new__(WorkerConfig)  # made without __post_init__
    object.__setattr__(unresolved, "heartbeat_interval_ms", None)
    with pytest.raises(ValueError, match="before the config resolved it"):
        resolved(unresolved.heartbeat_interval_ms)
    assert dataclasses.is_dataclass(unresolved)
