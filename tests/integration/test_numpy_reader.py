"""NumpyReader: trainers that read the service without TensorFlow.

Every read runs in a fresh Python process where importing TensorFlow fails
(None in sys.modules), and each script checks at its end that no TensorFlow
module was loaded. This process registers the pipelines (it has TensorFlow)
and compares what the readers got with local tf.data's as_numpy_iterator()."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO_ROOT, in_process_cluster, nested_pipeline

import dataservice
from dataservice.client.numpy_elements import RaggedComponents, SparseComponents
from dataservice.rpc import auth

pytestmark = pytest.mark.timeout(180)

_NO_TENSORFLOW = """
import json, sys
sys.modules["tensorflow"] = None  # importing tensorflow (or any of its modules) now fails
import numpy as np
from dataservice.reader import NumpyReader, RaggedComponents, SparseComponents
from dataservice import errors

{PLAIN}

def emit(**values):
    print(json.dumps(values), flush=True)
"""

_CHECK_NO_TENSORFLOW = """
loaded = sorted(name for name, module in sys.modules.items() if name.split(".")[0] == "tensorflow" and module)
assert not loaded, f"tensorflow was imported: {loaded}"
"""


def _prelude() -> str:
    return _NO_TENSORFLOW.replace("{PLAIN}", inspect.getsource(plain))


def run_without_tensorflow(script: str, timeout_s: float = 120, env: dict | None = None) -> list[dict]:
    """Runs `script` (after _NO_TENSORFLOW) in a fresh process; its emit() lines, parsed."""
    source = _prelude() + textwrap.dedent(script) + _CHECK_NO_TENSORFLOW
    result = subprocess.run(
        [sys.executable, "-c", source],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
    assert result.returncode == 0, f"the reader failed:\n{result.stderr[-4000:]}"
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def plain(value):
    """An element as JSON: arrays as lists, bytes as latin-1, ragged as lists, sparse as dense.
    The same function serves the readers (its source goes into their scripts) and this
    process, for local tf.data's as_numpy_iterator(), which gives ragged tensors as object
    arrays of their rows and sparse ones as dense arrays."""
    if isinstance(value, RaggedComponents):
        return plain(value.to_list())
    if isinstance(value, SparseComponents):
        return plain(value.to_dense())
    if isinstance(value, dict):
        return {k: plain(v) for k, v in sorted(value.items())}
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, bytes | np.bytes_):
        return bytes(value).decode("latin-1")
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value] if value.ndim else plain(value.item())
    if isinstance(value, np.generic):
        return plain(value.item())
    return value


def canonical(elements: list) -> list[str]:
    return sorted(json.dumps(e, sort_keys=True) for e in elements)


@pytest.fixture(scope="module")
def np_cluster():
    """Two workers in this process; the readers are other processes, so they read over the
    same-host transports and TCP, as a trainer process on the workers' host does."""
    c = in_process_cluster(2)
    yield c
    c.stop()


def test_elements_match_local_tf_data_in_both_modes(np_cluster):
    dataset = nested_pipeline(24)
    expected = [plain(e) for e in dataset.as_numpy_iterator()]
    dataset_id = dataservice.register_dataset(np_cluster.target, dataset).numpy().decode()
    out = run_without_tensorflow(
        f"""
        for mode in ("parallel_epochs", "distributed_epoch"):
            reader = NumpyReader({np_cluster.target!r}, {dataset_id!r}, mode)
            emit(mode=mode, elements=[plain(e) for e in reader], spec_types=sorted(
                type(v).__name__ for v in next(iter(reader)).values()))
            reader.close()
        """
    )
    by_mode = {line["mode"]: line for line in out}
    # parallel_epochs: each of the 2 workers makes the whole dataset; distributed_epoch: once.
    assert canonical(by_mode["parallel_epochs"]["elements"]) == canonical(expected * 2)
    assert canonical(by_mode["distributed_epoch"]["elements"]) == canonical(expected)
    assert by_mode["distributed_epoch"]["spec_types"] == sorted(
        ["int64", "bytes", "ndarray", "RaggedComponents", "SparseComponents", "Pair", "tuple", "ndarray"]
    )


def test_a_named_job_is_shared_and_found_by_its_name_alone(np_cluster):
    dataset_id = dataservice.register_dataset(np_cluster.target, tf.data.Dataset.range(200)).numpy().decode()
    out = run_without_tensorflow(
        f"""
        first = NumpyReader({np_cluster.target!r}, {dataset_id!r}, job_name="shared", max_outstanding_requests=4)
        first_pass = iter(first)
        got_first = [int(next(first_pass))]
        # The job exists now: a reader that names only the job finds its dataset.
        second = NumpyReader({np_cluster.target!r}, job_name="shared", max_outstanding_requests=4)
        import threading
        got_second = []
        thread = threading.Thread(target=lambda: got_second.extend(int(e) for e in second))
        thread.start()
        got_first.extend(int(e) for e in first_pass)
        thread.join(60)
        emit(first=got_first, second=got_second, dataset=second.dataset_id)
        try:
            NumpyReader({np_cluster.target!r}, job_name="no-such-job")
        except errors.NotFoundError as e:
            emit(not_found=e.message)
        try:
            NumpyReader({np_cluster.target!r}, "no-such-dataset")
        except errors.NotFoundError as e:
            emit(unknown_dataset=e.message)
        """
    )
    reads, not_found, unknown = out
    assert reads["dataset"] == dataset_id
    # A shared job hands each element (of each worker's pass) to one of its readers.
    assert sorted(reads["first"] + reads["second"]) == sorted(list(range(200)) * 2)
    assert reads["first"] and reads["second"]
    assert "no job named 'no-such-job'" in not_found["not_found"]
    assert "Dataset id no-such-dataset not found: it is not registered" in unknown["unknown_dataset"]


def test_coordinated_reads_give_each_consumer_its_rounds(np_cluster):
    dataset_id = dataservice.register_dataset(np_cluster.target, tf.data.Dataset.range(1000).repeat()).numpy()
    out = run_without_tensorflow(
        f"""
        import threading
        got = {{}}
        def consume(index):
            reader = NumpyReader({np_cluster.target!r}, {dataset_id.decode()!r}, job_name="rounds",
                                 consumer_index=index, num_consumers=2)
            elements = iter(reader)
            got[index] = [int(next(elements)) for _ in range(30)]
            reader.close()
        threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        emit(got=got)
        try:
            NumpyReader({np_cluster.target!r}, {dataset_id.decode()!r}, job_name="x", consumer_index=0,
                        num_consumers=2).state_dict()
        except errors.FailedPreconditionError as e:
            emit(unsaveable=e.message)
        """
    )
    got = out[0]["got"]
    assert sorted(got) == ["0", "1"] and all(len(v) == 30 for v in got.values())
    assert all(0 <= e < 1000 for v in got.values() for e in v)
    assert "cannot be saved" in out[1]["unsaveable"]


def test_a_trainer_killed_mid_epoch_resumes_from_its_saved_state_exactly_once(np_cluster, tmp_path):
    n = 3000
    dataset_id = dataservice.register_dataset(np_cluster.target, tf.data.Dataset.range(n)).numpy().decode()
    state_file = tmp_path / "state.json"
    # The first trainer saves its state (as JSON: plain values) with the elements it took, then
    # waits to be killed with SIGKILL, never closing anything.
    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _prelude()
            + textwrap.dedent(
                f"""
                import os, time
                reader = NumpyReader({np_cluster.target!r}, {dataset_id!r}, "distributed_epoch",
                                     max_outstanding_requests=64)
                elements = iter(reader)
                taken = [int(next(elements)) for _ in range(700)]
                with open({str(state_file) + ".tmp"!r}, "w") as f:
                    json.dump({{"state": reader.state_dict(), "taken": taken}}, f)
                os.rename({str(state_file) + ".tmp"!r}, {str(state_file)!r})
                time.sleep(600)
                """
            ),
        ],
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not state_file.exists():
            assert first.poll() is None, f"the first trainer died: {first.stderr.read().decode()[-3000:]}"
            assert time.monotonic() < deadline, "the first trainer saved no state"
            time.sleep(0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        first.stderr.close()
    saved = json.loads(state_file.read_text())
    json.loads(json.dumps(saved["state"]))  # plain values only
    out = run_without_tensorflow(
        f"""
        saved = json.load(open({str(state_file)!r}))
        reader = NumpyReader({np_cluster.target!r}, {dataset_id!r}, "distributed_epoch", state=saved["state"])
        emit(rest=[int(e) for e in reader], after=reader.state_dict())
        """
    )
    rest = out[0]["rest"]
    assert len(saved["taken"]) == 700
    assert sorted(saved["taken"] + rest) == list(range(n)), "an element was lost or read twice"
    # After the pass, the state names the next repetition with nothing taken of it.
    assert out[0]["after"]["tasks"] == [] and out[0]["after"]["repetition"] >= 1


def test_tls_and_the_auth_token(secure_cluster):
    dataset_id = dataservice.register_dataset(secure_cluster.target, tf.data.Dataset.range(50)).numpy().decode()
    # This process's environment holds the CA and the client token (the fixture's); the reader inherits it.
    out = run_without_tensorflow(
        f"""
        emit(read=sorted(int(e) for e in NumpyReader({secure_cluster.target!r}, {dataset_id!r})))
        """
    )
    without_token = {k: v for k, v in os.environ.items() if k not in (auth.TOKEN_ENV, auth.TOKEN_FILE_ENV)}
    refused = run_without_tensorflow(
        f"""
        try:
            NumpyReader({secure_cluster.target!r}, {dataset_id!r}, dispatcher_timeout_ms=3000)
        except errors.UnauthenticatedError as e:
            emit(refused=e.message)
        """,
        env=without_token,
    )
    assert out[0]["read"] == list(range(50))
    assert "requires an auth token" in refused[0]["refused"]


def test_data_server_register_stores_a_pipeline_a_reader_without_tensorflow_reads(np_cluster, tmp_path):
    (tmp_path / "my_pipelines.py").write_text(
        "import tensorflow as tf\n\ndef squares():\n    return tf.data.Dataset.range(10).map(lambda x: x * x)\n"
    )

    def register(*flags: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "dataservice.cli", "register", f"--dispatcher_address={np_cluster.target}"]
        environment = {**os.environ, "PYTHONPATH": REPO_ROOT}
        return subprocess.run(
            [*command, *flags], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=environment
        )

    registered = register(
        "--pipeline=my_pipelines:squares", "--dataset_id=squares", "--processing_mode=distributed_epoch"
    )
    assert registered.returncode == 0, registered.stderr[-3000:]
    assert registered.stdout.strip() == "squares"
    out = run_without_tensorflow(
        f"""
        reader = NumpyReader({np_cluster.target!r}, "squares", "distributed_epoch")
        emit(read=sorted(int(e) for e in reader), cardinality=reader.cardinality)
        """
    )
    assert out[0] == {"read": [i * i for i in range(10)], "cardinality": 10}
    bad = register("--pipeline=my_pipelines:nothing")
    assert bad.returncode == 2 and "cannot load my_pipelines:nothing" in bad.stderr


def test_jax_batches_are_arrays_sharded_over_an_8_device_mesh(np_cluster):
    batched = tf.data.Dataset.range(64).map(lambda i: {"x": tf.fill([3], tf.cast(i, tf.float32)), "y": i}).batch(16)
    dataset_id = dataservice.register_dataset(np_cluster.target, batched).numpy().decode()
    out = run_without_tensorflow(
        f"""
        import jax
        from jax.sharding import Mesh
        from dataservice.frameworks.jax_input import jax_batches
        mesh = Mesh(np.array(jax.devices()), ("batch",))
        reader = NumpyReader({np_cluster.target!r}, {dataset_id!r})  # each worker's pass: whole batches
        for batch in jax_batches(reader, mesh):
            x, y = batch["x"], batch["y"]
            emit(devices=len(jax.devices()), shape=list(x.shape), spec=list(x.sharding.spec),
                 shard_shapes=sorted({{tuple(s.data.shape) for s in x.addressable_shards}}),
                 shard_devices=len({{s.device for s in x.addressable_shards}}),
                 y=np.asarray(y).tolist(), x_matches=bool((np.asarray(x)[:, 0] == np.asarray(y)).all()))
        """,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    )
    assert len(out) == 8  # 4 batches from each of the 2 workers
    for batch in out:
        assert batch["devices"] == 8 and batch["shape"] == [16, 3]
        assert batch["spec"] == ["batch"]
        assert batch["shard_shapes"] == [[2, 3]] and batch["shard_devices"] == 8
        assert batch["x_matches"]
    assert sorted(y for batch in out for y in batch["y"]) == sorted(list(range(64)) * 2)


def test_torch_dataloader_workers_share_one_job_and_read_each_element_once(np_cluster):
    # Batched on the service's workers: numbers, a 2-vector and strings in each batch.
    batches = (
        tf.data.Dataset.range(600)
        .map(lambda i: {"x": tf.fill([2], tf.cast(i, tf.float32)), "i": i, "name": tf.strings.as_string(i)})
        .batch(10)
    )
    dataset_id = dataservice.register_dataset(np_cluster.target, batches).numpy().decode()
    out = run_without_tensorflow(
        f"""
        import torch
        from dataservice.frameworks.torch_input import ServiceIterableDataset

        def epoch_of(loader, **labels):
            seen, kinds, names_ok, pinned = [], set(), True, set()
            for batch in loader:
                kinds.add((type(batch["x"]).__name__, str(batch["x"].dtype), batch["x"].shape[1],
                           str(batch["i"].dtype)))
                names_ok &= [int(n) for n in batch["name"]] == batch["i"].tolist()
                names_ok &= bool((batch["x"][:, 1] == batch["i"].to(torch.float32)).all())
                pinned.add(batch["x"].is_pinned())
                seen += batch["i"].tolist()
            emit(**labels, seen=seen, kinds=sorted(map(list, kinds)), names_ok=names_ok, pinned=sorted(pinned))

        accelerator = torch.accelerator.is_available()
        # Workers made anew each epoch; set_epoch names the job's repetition they read.
        dataset = ServiceIterableDataset({np_cluster.target!r}, {dataset_id!r}, "distributed_epoch")
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, pin_memory=accelerator)
        for epoch in range(2):
            dataset.set_epoch(epoch)
            epoch_of(loader, workers="new", epoch=epoch, accelerator=accelerator)
        # Persistent workers, no set_epoch: each pass reads the next repetition.
        dataset = ServiceIterableDataset({np_cluster.target!r}, {dataset_id!r}, "distributed_epoch")
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
        for epoch in range(2):
            epoch_of(loader, workers="persistent", epoch=epoch, accelerator=accelerator)
        # Without set_epoch, a new copy reads the repetition an earlier epoch read: nothing is left.
        dataset = ServiceIterableDataset({np_cluster.target!r}, {dataset_id!r}, "distributed_epoch")
        def count():
            return sum(len(b["i"]) for b in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1))
        emit(first=count(), again=count())
        """,
        timeout_s=150,
    )
    epochs = [line for line in out if "workers" in line]
    assert [(line["workers"], line["epoch"]) for line in epochs] == [
        ("new", 0),
        ("new", 1),
        ("persistent", 0),
        ("persistent", 1),
    ]
    for line in epochs:
        assert sorted(line["seen"]) == list(range(600)), "an element was read twice or lost"
        # (distributed_epoch batches each worker's splits: some batches are short.)
        assert line["kinds"] == [["Tensor", "torch.float32", 2, "torch.int64"]]
        assert line["names_ok"]
        # Pinned where an accelerator can use pinned memory; the CPU has none to pin for.
        assert line["pinned"] == [line["accelerator"] and line["workers"] == "new"]
    assert out[-1] == {"first": 600, "again": 0}


def test_a_numpy_readers_state_survives_torch_save_and_load(np_cluster, tmp_path):
    dataset_id = dataservice.register_dataset(np_cluster.target, tf.data.Dataset.range(400)).numpy().decode()
    out = run_without_tensorflow(
        f"""
        import torch
        reader = NumpyReader({np_cluster.target!r}, {dataset_id!r}, "distributed_epoch", max_outstanding_requests=8)
        elements = iter(reader)
        taken = [int(next(elements)) for _ in range(150)]
        torch.save(reader.state_dict(), {str(tmp_path / "reader.pt")!r})
        reader.close()
        # weights_only (torch.load's default): plain values load without trusting pickles.
        state = torch.load({str(tmp_path / "reader.pt")!r}, weights_only=True)
        resumed = NumpyReader({np_cluster.target!r}, {dataset_id!r}, "distributed_epoch", state=state)
        emit(taken=taken, rest=[int(e) for e in resumed])
        """
    )
    assert sorted(out[0]["taken"] + out[0]["rest"]) == list(range(400)), "an element was lost or read twice"
