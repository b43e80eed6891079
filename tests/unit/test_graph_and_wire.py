"""Pipeline fingerprints and the element codec."""

import socket
import threading

import numpy as np
import pytest
import tensorflow as tf

from dataservice.pipeline import graph as graph_lib
from dataservice.transfer import compression, tcp, wire
from dataservice.transfer.wire import ElementCodec
from dataservice.v1 import common_pb2, worker_pb2


def _fingerprint(ds):
    return graph_lib.fingerprint(graph_lib.parse_graph(graph_lib.serialize_dataset(ds)))


def test_fingerprint_is_stable_across_rebuilds():
    make = lambda: tf.data.Dataset.range(100).shuffle(10).map(lambda x: x + 1).batch(4)  # noqa: E731
    assert _fingerprint(make()) == _fingerprint(make())


def test_with_a_global_seed_each_shuffle_is_another_pipeline():
    # TensorFlow derives each op's seed from the global seed and a counter: the shuffles of two
    # builds have different seeds, so they shuffle differently and must not share a dataset id.
    make = lambda: tf.data.Dataset.range(100).shuffle(10)  # noqa: E731
    tf.random.set_seed(5)
    try:
        assert _fingerprint(make()) != _fingerprint(make())
    finally:
        tf.random.set_seed(None)


def test_fingerprint_tells_pipelines_apart():
    base = tf.data.Dataset.range(100)
    prints = {
        _fingerprint(base.map(lambda x: x + 1)),
        _fingerprint(base.map(lambda x: x + 2)),
        _fingerprint(base.map(lambda x: x * 1)),
        _fingerprint(tf.data.Dataset.range(101).map(lambda x: x + 1)),
    }
    assert len(prints) == 4


def test_element_spec_round_trips():
    spec = {
        "a": tf.RaggedTensorSpec([None, None], tf.int32),
        "b": (tf.SparseTensorSpec([4], tf.float32),),
        "c": tf.TensorSpec([2, None], tf.string),
    }
    assert graph_lib.decode_element_spec(graph_lib.encode_element_spec(spec)) == spec


def test_datasets_as_elements_are_refused():
    ds = tf.data.Dataset.range(4).window(2)
    with pytest.raises(graph_lib.InvalidDatasetError, match="cannot be sent"):
        graph_lib.check_element_spec(ds.element_spec)


def _send_over_tcp(header, buffers):
    """The header and buffers sent as a worker's TCP transfer does, over a real socket pair, and
    what the receiving end reads back."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        parts = wire.stream_message(header, buffers)
        sender = threading.Thread(target=tcp.send_parts, args=(ours, parts))
        sender.start()
        received = tcp.recv_response(theirs)
        sender.join()
    # The prefix's sizes account for every byte sent.
    header_size, body_size = wire.STREAM_PREFIX.unpack(parts[0])
    assert wire.STREAM_PREFIX.size + header_size + body_size == sum(len(memoryview(p).cast("B")) for p in parts)
    return received


def _roundtrip(spec, elements, compression_mode=common_pb2.COMPRESSION_NONE, transfer="grpc"):
    """Encodes the elements into a data message and decodes them from it, as a worker and a client do."""
    codec = ElementCodec(spec)
    components = [codec.to_components(e) for e in elements]
    chunks, buffers = codec.encode(components, compression_mode)
    header = worker_pb2.StreamElementsResponse(chunks=chunks)
    if transfer == "grpc":
        header, received = wire.unframe(wire.frame(header, buffers), worker_pb2.StreamElementsResponse)
    else:
        header, received = _send_over_tcp(header, buffers)
    decoded = [codec.decode(chunk, received) for chunk in header.chunks]
    assert received.unread == 0
    return codec, list(header.chunks), decoded


@pytest.mark.parametrize(
    "dtype", [tf.float32, tf.float64, tf.int8, tf.uint16, tf.int64, tf.bool, tf.bfloat16, tf.complex64, tf.half]
)
@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_fixed_shape_elements_are_stacked(dtype, transfer):
    elements = [tf.cast(tf.reshape(tf.range(6) + i, [2, 3]), dtype) for i in range(5)]
    codec, chunks, decoded = _roundtrip(tf.TensorSpec([2, 3], dtype), elements, transfer=transfer)
    assert codec.stackable and len(chunks) == 1 and chunks[0].num_elements == 5
    (stacked,) = decoded[0]
    assert stacked.shape == (5, 2, 3)
    np.testing.assert_array_equal(stacked, np.stack([e.numpy() for e in elements]))


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_strings_round_trip_stacked_and_alone(transfer):
    elements = [tf.constant([b"", b"a\x00b", "ü".encode()]), tf.constant([b"x" * 1000, b"y", b"z"])]
    codec, chunks, decoded = _roundtrip(tf.TensorSpec([3], tf.string), elements, transfer=transfer)
    assert decoded[0][0].tolist() == [e.numpy().tolist() for e in elements]
    codec, chunks, decoded = _roundtrip(tf.TensorSpec([], tf.string), [tf.constant(b"only")], transfer=transfer)
    assert decoded[0][0].tolist() == [b"only"]


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_varying_shapes_travel_one_element_a_chunk(transfer):
    elements = [tf.range(i) for i in range(4)]
    codec, chunks, decoded = _roundtrip(tf.TensorSpec([None], tf.int32), elements, transfer=transfer)
    assert not codec.stackable and len(chunks) == 4
    assert [d[0].tolist() for d in decoded] == [list(range(i)) for i in range(4)]


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_ragged_travels_as_components(transfer):
    element = tf.ragged.constant([[1, 2], [], [3]])
    spec = tf.RaggedTensorSpec([3, None], tf.int32, ragged_rank=1)
    codec, chunks, decoded = _roundtrip(spec, [element], transfer=transfer)
    values, splits = decoded[0]
    assert values.tolist() == [1, 2, 3] and splits.tolist() == [0, 2, 2, 3]


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_frames_carry_buffers_aligned_and_decode_to_arrays_tensorflow_adopts(transfer):
    spec = (tf.TensorSpec([3], tf.int8), tf.TensorSpec([2], tf.float64), tf.TensorSpec([], tf.string))
    elements = [
        (tf.constant([1, 2, 3], tf.int8), tf.constant([0.5, i], tf.float64), tf.constant(b"s" * i)) for i in range(3)
    ]
    codec, chunks, decoded = _roundtrip(spec, elements, transfer=transfer)
    small, floats, strings = decoded[0]
    # Aligned as TensorFlow needs to take the memory over without copying it.
    assert all(a.ctypes.data % wire.TF_ALIGNMENT == 0 for a in (small, floats))
    if transfer == "tcp":
        # Received into aligned memory: the arrays are views of it, not copies.
        assert not small.flags.owndata and not floats.flags.owndata
    np.testing.assert_array_equal(floats, [[0.5, 0], [0.5, 1], [0.5, 2]])
    assert small.tolist() == [[1, 2, 3]] * 3 and strings.tolist() == [b"", b"s", b"ss"]


def test_worker_components_are_the_tensors_memory_and_keep_it_alive():
    spec = (tf.TensorSpec([4096], tf.float32), tf.TensorSpec([], tf.bfloat16), tf.TensorSpec([], tf.string))
    codec = ElementCodec(spec)
    big = tf.fill([4096], 2.5)
    components = codec.tensors_to_components([big, tf.constant(1.5, tf.bfloat16), tf.constant(b"s")])
    # A view, not the copy numpy() makes.
    assert np.shares_memory(components[0], np.asarray(memoryview(big)))
    del big
    [tf.fill([4096], 9.0) for _ in range(20)]  # fresh tensors that would reuse freed memory
    np.testing.assert_array_equal(components[0], np.full([4096], 2.5, np.float32))
    assert float(components[1]) == 1.5 and components[2].dtype == object and components[2].item() == b"s"


def test_tf_aligned_copies_only_unaligned_arrays():
    raw = np.arange(1024, dtype=np.uint8)
    start = -raw.ctypes.data % wire.TF_ALIGNMENT
    aligned_view = raw[start : start + 512].view(np.float64)
    assert wire.tf_aligned(aligned_view) is aligned_view
    unaligned = raw[start + 8 : start + 8 + 512].view(np.float64).reshape(8, 8)
    copy = wire.tf_aligned(unaligned)
    assert copy is not unaligned and copy.ctypes.data % wire.TF_ALIGNMENT == 0
    assert copy.shape == (8, 8) and copy.dtype == np.float64
    np.testing.assert_array_equal(copy, unaligned)


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
@pytest.mark.parametrize(
    "mode, codec", [(common_pb2.COMPRESSION_AUTO, common_pb2.COMPRESSION_LZ4), (common_pb2.COMPRESSION_SNAPPY,) * 2]
)
def test_compressed_buffers_round_trip_through_a_frame(transfer, mode, codec):
    elements = [tf.zeros([4096], tf.float32), tf.ones([4096], tf.float32)]
    _, chunks, decoded = _roundtrip(tf.TensorSpec([4096], tf.float32), elements, mode, transfer=transfer)
    tensor = chunks[0].components[0]
    assert tensor.compression == codec and tensor.size < tensor.uncompressed_size // 10
    np.testing.assert_array_equal(decoded[0][0], np.stack([np.zeros(4096), np.ones(4096)]))


def test_snappy_is_forced_on_every_tensor_and_checked_on_the_way_back():
    # Even noise, which AUTO sends raw, and a tensor of a few bytes.
    noise = np.random.default_rng(0).random(1 << 16, np.float32)
    codec = ElementCodec(tf.TensorSpec([1 << 16], tf.float32))
    (chunk,), (buffer,) = codec.encode([[noise]], common_pb2.COMPRESSION_SNAPPY)
    assert chunk.components[0].compression == common_pb2.COMPRESSION_SNAPPY
    np.testing.assert_array_equal(codec.decode(chunk, wire.FrameBuffers(bytes(buffer), 0, 1))[0][0], noise)
    small = ElementCodec(tf.TensorSpec([], tf.int64))
    (chunk,), _ = small.encode([[np.int64(7)]], common_pb2.COMPRESSION_SNAPPY)
    assert chunk.components[0].compression == common_pb2.COMPRESSION_SNAPPY
    codec_id, payload = compression.compress(noise.tobytes(), common_pb2.COMPRESSION_SNAPPY)
    with pytest.raises(ValueError, match="decompressed to"):
        compression.decompress(codec_id, payload, noise.nbytes + 1)


def test_a_truncated_frame_is_an_error_not_garbage():
    codec = ElementCodec(tf.TensorSpec([256], tf.int64))
    chunks, buffers = codec.encode([[np.arange(256)]])
    data = wire.frame(worker_pb2.StreamElementsResponse(chunks=chunks), buffers)
    header, buffers = wire.unframe(data[:-8], worker_pb2.StreamElementsResponse)
    with pytest.raises(ValueError, match="ends inside a buffer"):
        codec.decode(header.chunks[0], buffers)
    with pytest.raises(ValueError, match="too short"):
        wire.unframe(b"\x01", worker_pb2.StreamElementsResponse)
    with pytest.raises(ValueError, match="claims"):
        wire.unframe(data[:6], worker_pb2.StreamElementsResponse)
