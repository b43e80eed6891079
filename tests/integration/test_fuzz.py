"""Fuzzing the servers (bounded): every dispatcher and worker RPC and the TCP data port get
thousands of malformed inputs — random bytes, truncated and oversized messages, valid protos
with hostile values (negative and huge numbers, unknown enum values, long strings, the ids of
other clients' iterations and tasks). Afterwards the servers still serve a normal client end to
end, and their memory stayed bounded. `--fuzz-rounds N` multiplies the inputs."""

from __future__ import annotations

import math
import random
import socket
import struct
import time
from collections.abc import Iterator

import grpc
import psutil
import pytest
import tensorflow as tf
from conftest import wait_for_workers
from google.protobuf import descriptor as descriptor_lib
from google.protobuf import message_factory
from google.protobuf.message import Message

import dataservice
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.transfer import tcp
from dataservice.v1 import dispatcher_pb2, worker_pb2

# Inputs per method in one round (CI: one round).
PER_METHOD = 80
TCP_CONNECTIONS = 150
# What a server may grow by over the run (RSS), in MiB.
RSS_GROWTH_LIMIT_MIB = 300

_INTS = [0, 1, 2, 3, -1, -(2**31), 2**31 - 1, -(2**63), 2**63 - 1]
_STRINGS = ["", "1", "localhost:1", "x" * 5000, "\x00\xff", "grpc://::1:0", "ünïcødé", "%port%"]


def _value(field: descriptor_lib.FieldDescriptor, rng: random.Random, depth: int):
    kind = field.type
    if kind == field.TYPE_MESSAGE:
        return hostile(message_factory.GetMessageClass(field.message_type), rng, depth + 1)
    if kind == field.TYPE_ENUM:
        return rng.choice([0, 1, 2, 7, 99, -5, 2**31 - 1])  # open enums: unknown values are kept
    if kind in (field.TYPE_INT64, field.TYPE_SINT64, field.TYPE_SFIXED64):
        return rng.choice(_INTS) if rng.random() < 0.7 else rng.randrange(-(2**63), 2**63)
    if kind in (field.TYPE_INT32, field.TYPE_SINT32, field.TYPE_SFIXED32):
        return rng.choice([0, 1, -1, -(2**31), 2**31 - 1])
    if kind in (field.TYPE_UINT64, field.TYPE_FIXED64):
        return rng.choice([0, 1, 2**64 - 1, rng.randrange(2**64)])
    if kind in (field.TYPE_UINT32, field.TYPE_FIXED32):
        return rng.choice([0, 1, 2**32 - 1])
    if kind in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
        return rng.choice([0.0, -1.0, math.inf, -math.inf, math.nan, 1e308, 5e-324])
    if kind == field.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == field.TYPE_STRING:
        return rng.choice(_STRINGS)
    if kind == field.TYPE_BYTES:
        return rng.randbytes(rng.choice([0, 1, 16, 4096]))
    raise AssertionError(f"field type {kind}")


def hostile(cls, rng: random.Random, depth: int = 0) -> Message:
    """A valid message of `cls` whose fields hold hostile values (about half of them set)."""
    message = cls()
    if depth > 2:
        return message
    for field in cls.DESCRIPTOR.fields:
        if rng.random() < 0.5:
            continue
        if field.is_repeated:
            count = rng.choice([0, 1, 3, 200 if field.type != field.TYPE_MESSAGE else 5])
            values = [_value(field, rng, depth) for _ in range(count)]
            getattr(message, field.name).extend(values)
        elif field.type == field.TYPE_MESSAGE:
            getattr(message, field.name).CopyFrom(_value(field, rng, depth))
        else:
            setattr(message, field.name, _value(field, rng, depth))
    return message


def payloads(cls, rng: random.Random, count: int) -> Iterator[bytes]:
    """Serialized requests: hostile valid ones, random bytes, truncated and oversized ones."""
    for i in range(count):
        mode = i % 4
        if mode in (0, 1):
            yield hostile(cls, rng).SerializeToString()
        elif mode == 2:
            yield rng.randbytes(rng.choice([1, 7, 100, 3000]))
        else:
            data = hostile(cls, rng).SerializeToString()
            yield data[: rng.randrange(len(data))] if data else b"\x0a\xff\xff\xff\x0f"
    yield b"\x0a" + b"\xff" * 9 + b"\x01"  # a length varint far past the message's end
    yield bytes(6 * 1024 * 1024)  # over a worker's message limit (and nothing a dispatcher parses)


def _call_unary(channel: grpc.Channel, method: str, data: bytes) -> None:
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        call(data, timeout=0.25)
    except grpc.RpcError as e:
        assert e.code() != grpc.StatusCode.INTERNAL or "failed:" in (e.details() or ""), e.details()


def _call_stream(channel: grpc.Channel, method: str, requests: list[bytes]) -> None:
    call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)
    try:
        for _ in call(iter(requests), timeout=0.25):
            pass
    except grpc.RpcError:
        pass


def _fuzz_grpc(address: str, descriptor, rng: random.Random, rounds: int) -> int:
    sent = 0
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 2**31 - 1)]) as channel:
        for method in descriptor.methods:
            path = f"/{descriptor.full_name}/{method.name}"
            cls = message_factory.GetMessageClass(method.input_type)
            for data in payloads(cls, rng, PER_METHOD * rounds):
                if method.client_streaming:
                    _call_stream(channel, path, [data, hostile(cls, rng).SerializeToString()])
                else:
                    _call_unary(channel, path, data)
                sent += 1
    return sent


def _fuzz_tcp(address: str, rng: random.Random, rounds: int) -> int:
    host, port = tcp.split_host_port(address)
    for i in range(TCP_CONNECTIONS * rounds):
        mode = i % 5
        if mode == 0:
            data = rng.randbytes(rng.choice([1, 3, 64, 5000]))
        elif mode == 1:  # a size prefix far over the limit (up to the largest a u32 holds)
            data = struct.pack("<I", rng.choice([2**31, 2**32 - 1, tcp.MAX_REQUEST_BYTES + 1])) + b"xx"
        elif mode == 2:  # a valid request with hostile values
            body = hostile(worker_pb2.StreamElementsRequest, rng).SerializeToString()
            data = struct.pack("<I", len(body)) + body
        elif mode == 3:  # truncated
            body = hostile(worker_pb2.StreamElementsRequest, rng).SerializeToString()
            data = (struct.pack("<I", len(body) + 10) + body)[: rng.randrange(1, 5 + len(body))]
        else:  # the largest prefix a 64-bit reader would take as 2^63, cut to our 32-bit prefix
            data = struct.pack("<Q", 2**63)
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.settimeout(2)
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
            except OSError:
                pass
    return TCP_CONNECTIONS * rounds


def _rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


@pytest.mark.timeout(600)
def test_servers_survive_fuzzing_and_serve_afterwards(processes, request):
    rounds = request.config.getoption("--fuzz-rounds")
    rng = random.Random(20261204)
    dispatcher = processes(
        "--role=dispatcher", "--port=0", "--worker_timeout_ms=2000", "--client_timeout_ms=2000", "--no-monitoring"
    )
    worker = processes(
        "--role=worker", "--port=0", f"--dispatcher_address={dispatcher.address}", "--heartbeat_interval_ms=200"
    )
    wait_for_workers(dispatcher.address, 1)
    target = f"grpc://{dispatcher.address}"
    # Real jobs, iterations and tasks, whose small ids the hostile values hit.
    assert sorted(tf.data.Dataset.range(10).apply(dataservice.distribute("parallel_epochs", target))) == list(range(10))
    before = {"dispatcher": _rss_mib(dispatcher.proc.pid), "worker": _rss_mib(worker.proc.pid)}
    started = time.monotonic()
    sent = _fuzz_grpc(dispatcher.address, dispatcher_pb2.DESCRIPTOR.services_by_name["DispatcherService"], rng, rounds)
    sent += _fuzz_grpc(worker.address, worker_pb2.DESCRIPTOR.services_by_name["WorkerService"], rng, rounds)
    with DispatcherClient(dispatcher.address, 10) as client:
        (info,) = [w for w in client.get_workers() if w.address == worker.address]
    sent += _fuzz_tcp(tcp.transfer_address(info.transfer_address), rng, rounds)
    print(f"fuzz: {sent} malformed inputs in {time.monotonic() - started:.1f} s")
    assert sent >= 1000
    assert dispatcher.proc.poll() is None and worker.proc.poll() is None, "a server died"
    # Fake workers the fuzzed heartbeats registered are given up after worker_timeout_ms, and
    # the fuzzed clients after client_timeout_ms: then a normal client reads as before.
    time.sleep(3)
    dataset = tf.data.Dataset.range(200).map(lambda x: x * 3)
    for mode in ("parallel_epochs", "distributed_epoch"):
        read = sorted(dataset.apply(dataservice.distribute(mode, target, dispatcher_timeout_ms=60_000)))
        assert read == [x * 3 for x in range(200)], mode
    after = {"dispatcher": _rss_mib(dispatcher.proc.pid), "worker": _rss_mib(worker.proc.pid)}
    print(f"fuzz: RSS before {before}, after {after} (MiB)")
    for server in before:
        assert after[server] - before[server] < RSS_GROWTH_LIMIT_MIB, (server, before, after)
