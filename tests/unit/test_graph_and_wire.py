"""Pipeline fingerprints and the element codec."""

import socket
import threading

import numpy as np
import pytest
import tensorflow as tf

from dataservice.pipeline import graph as graph_lib
from dataservice.transfer import compression, tcp, wire
from dataservice.transfer.chunk import element_at, element_columns
from dataservice.transfer.element_codec import ElementCodec
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


def test_copies_of_a_finalized_pipeline_keep_its_runtime_options_and_ask_for_no_rewrites():
    options = tf.data.Options()
    options.experimental_warm_start = True
    options.autotune.ram_budget = 1 << 30
    options.autotune.min_parallelism = 2
    options.deterministic = False
    options.threading.private_threadpool_size = 3
    options.experimental_optimization.map_parallelization = True
    more = tf.data.Options()
    more.experimental_symbolic_checkpoint = True
    dataset = tf.data.Dataset.range(8).map(lambda x: x + 1).with_options(options).with_options(more)
    template = graph_lib.finalized_template(dataset)
    assert "OptionsDataset" not in [node.op for node in template.graph.node], "applied, and left out"
    ops = [node.op for node in template.graph.node]
    assert "PrivateThreadPoolDataset" in ops and "ParallelMapDatasetV2" in ops, "finalized as the options say"
    copy = template.dataset(template.graph.SerializeToString())
    kept = copy.options()
    assert kept.experimental_warm_start is True and kept.experimental_symbolic_checkpoint is True
    assert (kept.autotune.ram_budget, kept.autotune.min_parallelism) == (1 << 30, 2)
    assert kept.experimental_optimization.apply_default_optimizations is False
    assert kept.experimental_optimization.map_parallelization is None
    assert kept.deterministic is None and kept.threading.private_threadpool_size is None, "already in the graph"
    assert sorted(int(x) for x in copy) == list(range(1, 9))
    plain = graph_lib.template(dataset)
    assert plain.options is None and "MapDataset" in [node.op for node in plain.graph.node]


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
    """Encodes the elements (each produced as a chunk of its own, as a worker taking large or
    varying elements one a call does) into one data message and decodes it, as a worker and a
    client do. Returns the codec, the chunk headers and the decoded elements."""
    codec = ElementCodec(spec)
    chunks = [codec.element_chunk(tf.nest.flatten(e, expand_composites=True)) for e in elements]
    proto, buffers = codec.encode(chunks, compression.StreamCompressor(compression_mode))
    header = worker_pb2.StreamElementsResponse(chunks=[proto])
    if transfer == "grpc":
        header, received = wire.unframe(wire.frame(header, buffers), worker_pb2.StreamElementsResponse)
    else:
        header, received = _send_over_tcp(header, buffers)
    decoded = [codec.decode(chunk, received) for chunk in header.chunks]
    assert received.unread == 0
    elements = [element_at(chunk, i) for chunk in decoded for i in range(chunk.num_elements)]
    return codec, list(header.chunks), decoded, elements


@pytest.mark.parametrize(
    "dtype", [tf.float32, tf.float64, tf.int8, tf.uint16, tf.int64, tf.bool, tf.bfloat16, tf.complex64, tf.half]
)
@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_fixed_shape_elements_arrive_stacked(dtype, transfer):
    elements = [tf.cast(tf.reshape(tf.range(6) + i, [2, 3]), dtype) for i in range(5)]
    codec, chunks, decoded, _ = _roundtrip(tf.TensorSpec([2, 3], dtype), elements, transfer=transfer)
    assert codec.fixed_shapes and len(chunks) == 1 and chunks[0].num_elements == 5
    stacked = decoded[0].columns[0].values
    assert stacked.shape == (5, 2, 3)
    np.testing.assert_array_equal(stacked, np.stack([e.numpy() for e in elements]))


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_strings_round_trip(transfer):
    elements = [tf.constant([b"", b"a\x00b", "ü".encode()]), tf.constant([b"x" * 1000, b"y", b"z"])]
    _, _, decoded, out = _roundtrip(tf.TensorSpec([3], tf.string), elements, transfer=transfer)
    assert [o[0].tolist() for o in out] == [e.numpy().tolist() for e in elements]
    assert decoded[0].columns[0].lengths.tolist() == [0, 3, 2, 1000, 1, 1]
    _, _, _, out = _roundtrip(tf.TensorSpec([], tf.string), [tf.constant(b"only")], transfer=transfer)
    assert out[0][0] == b"only"


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_varying_shapes_travel_as_values_and_shapes(transfer):
    elements = [tf.reshape(tf.range(i * 2), [i, 2]) for i in range(4)]
    codec, chunks, decoded, out = _roundtrip(tf.TensorSpec([None, 2], tf.int32), elements, transfer=transfer)
    assert not codec.fixed_shapes and len(chunks) == 1 and chunks[0].num_elements == 4
    column = decoded[0].columns[0]
    assert column.values.tolist() == [0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5]
    assert column.shapes.tolist() == [[0, 2], [1, 2], [2, 2], [3, 2]]
    assert [o[0].tolist() for o in out] == [e.numpy().tolist() for e in elements]


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_unknown_rank_and_varying_strings(transfer):
    spec = (tf.TensorSpec(None, tf.float32), tf.TensorSpec([None], tf.string))
    elements = [(tf.zeros([2, 1, 3]), tf.constant([b"a", b"bc"])), (tf.constant(7.0), tf.constant([], tf.string))]
    _, _, _, out = _roundtrip(spec, elements, transfer=transfer)
    assert out[0][0].shape == (2, 1, 3) and out[1][0].shape == () and float(out[1][0]) == 7.0
    assert out[0][1].tolist() == [b"a", b"bc"] and out[1][1].tolist() == []


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_ragged_travels_as_components(transfer):
    element = tf.ragged.constant([[1, 2], [], [3]])
    spec = tf.RaggedTensorSpec([3, None], tf.int32, ragged_rank=1)
    _, _, _, out = _roundtrip(spec, [element], transfer=transfer)
    values, splits = out[0]
    assert values.tolist() == [1, 2, 3] and splits.tolist() == [0, 2, 2, 3]


@pytest.mark.parametrize("transfer", ["grpc", "tcp"])
def test_frames_carry_buffers_aligned_and_decode_to_arrays_tensorflow_adopts(transfer):
    spec = (tf.TensorSpec([3], tf.int8), tf.TensorSpec([2], tf.float64), tf.TensorSpec([], tf.string))
    elements = [
        (tf.constant([1, 2, 3], tf.int8), tf.constant([0.5, i], tf.float64), tf.constant(b"s" * i)) for i in range(3)
    ]
    _, _, decoded, out = _roundtrip(spec, elements, transfer=transfer)
    small, floats = decoded[0].columns[0].values, decoded[0].columns[1].values
    # Aligned as TensorFlow needs to take the memory over without copying it.
    assert all(a.ctypes.data % wire.TF_ALIGNMENT == 0 for a in (small, floats))
    if transfer == "tcp":
        # Received into aligned memory: the arrays are views of it, not copies.
        assert not small.flags.owndata and not floats.flags.owndata
    np.testing.assert_array_equal(floats, [[0.5, 0], [0.5, 1], [0.5, 2]])
    assert small.tolist() == [[1, 2, 3]] * 3 and [o[2] for o in out] == [b"", b"s", b"ss"]


def test_large_elements_are_sent_from_their_own_memory():
    """Elements produced one a call travel as parts of one buffer: no stacking copy on the worker."""
    codec = ElementCodec(tf.TensorSpec([4096], tf.float32))
    tensors = [tf.fill([4096], float(i)) for i in range(3)]
    chunks = [codec.element_chunk([t]) for t in tensors]
    _, buffers = codec.encode(chunks)
    (values,) = buffers
    assert isinstance(values, wire.Contiguous) and len(values) == 3
    assert all(np.shares_memory(part, np.asarray(memoryview(t))) for part, t in zip(values, tensors))


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
    _, chunks, _, out = _roundtrip(tf.TensorSpec([4096], tf.float32), elements, mode, transfer=transfer)
    tensor = chunks[0].components[0]
    assert tensor.compression == codec and tensor.size < tensor.uncompressed_size // 10
    np.testing.assert_array_equal(np.stack([o[0] for o in out]), np.stack([np.zeros(4096), np.ones(4096)]))


def test_auto_compression_is_decided_once_per_stream_and_component():
    """A stream samples a component's first sizable buffer: zeros are compressed from then on, and a
    component whose first buffer was noise goes raw for the rest of the stream, zeros included."""
    noise = np.random.default_rng(0).random(1 << 14, np.float32)
    zeros = np.zeros(1 << 14, np.float32)
    compressor = compression.StreamCompressor(common_pb2.COMPRESSION_AUTO)
    assert compressor.compress(0, [zeros.view(np.uint8)])[0] == common_pb2.COMPRESSION_LZ4
    assert compressor.compress(1, [noise.view(np.uint8)])[0] == common_pb2.COMPRESSION_NONE
    assert compressor.compress(1, [zeros.view(np.uint8)])[0] == common_pb2.COMPRESSION_NONE
    # Too small to be worth a call, whatever was decided.
    assert compressor.compress(0, [zeros[:16].view(np.uint8)])[0] == common_pb2.COMPRESSION_NONE


def test_snappy_is_forced_on_every_tensor_and_checked_on_the_way_back():
    # Even noise, which AUTO sends raw, and a tensor of a few bytes.
    noise = np.random.default_rng(0).random(1 << 16, np.float32)
    snappy = compression.StreamCompressor(common_pb2.COMPRESSION_SNAPPY)
    codec = ElementCodec(tf.TensorSpec([1 << 16], tf.float32))
    chunk, (buffer,) = codec.encode([element_columns(codec.kinds, [noise])], snappy)
    assert chunk.components[0].compression == common_pb2.COMPRESSION_SNAPPY
    decoded = codec.decode(chunk, wire.FrameBuffers(bytes(buffer), 0, 1))
    np.testing.assert_array_equal(decoded.columns[0].values[0], noise)
    small = ElementCodec(tf.TensorSpec([], tf.int64))
    chunk, _ = small.encode([element_columns(small.kinds, [np.int64(7)])], snappy)
    assert chunk.components[0].compression == common_pb2.COMPRESSION_SNAPPY
    codec_id, payload = compression.compress(noise.tobytes(), common_pb2.COMPRESSION_SNAPPY)
    with pytest.raises(ValueError, match="decompressed to"):
        compression.decompress(codec_id, payload, noise.nbytes + 1)


def test_a_truncated_frame_is_an_error_not_garbage():
    codec = ElementCodec(tf.TensorSpec([256], tf.int64))
    chunk, buffers = codec.encode([element_columns(codec.kinds, [np.arange(256)])])
    data = wire.frame(worker_pb2.StreamElementsResponse(chunks=[chunk]), buffers)
    header, buffers = wire.unframe(data[:-8], worker_pb2.StreamElementsResponse)
    with pytest.raises(ValueError, match="ends inside a buffer"):
        codec.decode(header.chunks[0], buffers)
    with pytest.raises(ValueError, match="too short"):
        wire.unframe(b"\x01", worker_pb2.StreamElementsResponse)
    with pytest.raises(ValueError, match="claims"):
        wire.unframe(data[:6], worker_pb2.StreamElementsResponse)


def test_a_header_that_lies_about_sizes_is_refused():
    """A chunk whose header does not match its buffers (a buggy or hostile peer) is a ValueError,
    never an array that reads past its buffer."""
    codec = ElementCodec(tf.TensorSpec([None], tf.int64))
    chunk, buffers = codec.encode([element_columns(codec.kinds, [np.arange(5)])])
    data = wire.frame(worker_pb2.StreamElementsResponse(chunks=[chunk]), buffers)
    header, received = wire.unframe(data, worker_pb2.StreamElementsResponse)
    lying = header.chunks[0]
    lying.num_elements = 2  # the shapes buffer holds one element's shape
    with pytest.raises(ValueError):
        codec.decode(lying, received)
