"""Shared fixtures: in-process clusters and `data-server` processes on loopback ports."""

from __future__ import annotations

import collections
import dataclasses
import gc
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

# Eight logical CPUs for the tf.distribute and DTensor tests: TensorFlow allows
# this only before it initializes its devices, so it happens at import.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 8
)

from dataservice.local_cluster import LocalCluster, ServerProcess  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_process_cluster(num_workers: int = 1, **dispatcher_options) -> LocalCluster:
    """A dispatcher (with `dispatcher_options`, DispatcherConfig fields) and workers in this process;
    the workers heartbeat every 200 ms so that tests see changes quickly."""
    return LocalCluster(
        num_workers,
        processes=False,
        dispatcher_options=dispatcher_options,
        worker_options={"heartbeat_interval_ms": 200},
    )


def stop_tensorflow_servers(servers: list, wait_s: float = 10.0) -> None:
    """Stops TensorFlow's in-process servers (the comparison's), in order, waiting at most `wait_s`
    in all. TensorFlow's worker stop waits for the reads of its iterators in flight, which an
    iterator in a reference cycle or an infinite read can hold for minutes (a module's teardown
    took 140 s in CI); past the wait they go on stopping on a daemon thread, and end with the test
    process at the latest. The wait is not a bound where the stop holds the GIL meanwhile, as
    TensorFlow's worker stop was seen to (conformance.tensorflow_servers runs them apart instead)."""
    gc.collect()  # iterators in reference cycles end their reads only when collected

    def stop_all() -> None:
        for server in servers:
            server._stop()

    stopping = threading.Thread(target=stop_all, name="stop-tensorflow-servers", daemon=True)
    stopping.start()
    stopping.join(wait_s)


def pytest_addoption(parser):
    parser.addoption(
        "--chaos-seconds",
        type=float,
        default=60.0,
        help="how long the chaos test partitions, freezes and kills servers on test hosts (CI: 60)",
    )
    parser.addoption(
        "--bench-all", action="store_true", help="the quick bench smoke test runs every workload (CI: not 3, 4, 15)"
    )
    parser.addoption("--chaos-seed", type=int, default=None, help="replay a chaos run (its seed is printed)")
    parser.addoption("--fuzz-rounds", type=int, default=1, help="how many times the fuzz test's inputs (CI: 1)")
    parser.addoption(
        "--soak-seconds", type=float, default=30.0, help="how long the soak test's clients run jobs (CI: 30)"
    )
    parser.addoption(
        "--partition-seconds",
        type=float,
        default=30.0,
        help="how long the partition tests keep a host partitioned or frozen (CI: 30)",
    )
    parser.addoption(
        "--tensorflow-conformance",
        action="store_true",
        help="also run the conformance scenarios on TensorFlow's own service, eager and graph (CI: not)",
    )


def _on_tensorflows_service(item: pytest.Item) -> bool:
    """A conformance scenario's run on TensorFlow's service (its `run` parameter is
    ("tensorflow", mode), or its service parameter "tensorflow")."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or not item.nodeid.startswith("tests/integration/test_conformance"):
        return False
    return any(
        value == "tensorflow" or (isinstance(value, tuple) and value[:1] == ("tensorflow",))
        for value in callspec.params.values()
    )


def pytest_collection_modifyitems(config, items):
    """The conformance scenarios (test_conformance*.py) run on our service in eager and graph
    mode in every run; their runs on TensorFlow's service, its reference results that show
    where the two differ (about 140 s in eager mode, 110 s more in graph mode), only with
    --tensorflow-conformance. Deselected, so the summary counts them."""
    if config.getoption("--tensorflow-conformance"):
        return
    dropped = [item for item in items if _on_tensorflows_service(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        drop = set(dropped)
        items[:] = [item for item in items if item not in drop]


@pytest.fixture
def report_figures(request):
    """report_figures(text): a figure the test measured (elements lost, a stall, memory), listed in the
    run's summary: the tests run in pytest-xdist's worker processes, whose output is not shown."""

    def report(text: str) -> None:
        request.node.user_properties.append(("figures", text.strip("\n")))

    return report


def pytest_terminal_summary(terminalreporter) -> None:
    """The figures tests reported (the `report_figures` fixture), each under its test's id."""
    lines = [
        f"{report.nodeid}: {value}"
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == "figures"
    ]
    if lines:
        terminalreporter.section("figures measured")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def no_global_tf_seed():
    """Each test starts without TensorFlow's global seed: with one set (a test may call
    keras.utils.set_random_seed), every shuffle() built gets a new op seed, so the same
    pipeline built twice is two pipelines."""
    tf.random.set_seed(None)
    yield


@pytest.fixture
def cluster():
    c = in_process_cluster(1)
    yield c
    c.stop()


@pytest.fixture
def cluster2():
    c = in_process_cluster(2)
    yield c
    c.stop()


@pytest.fixture
def processes():
    """Starts `data-server` processes and kills whatever a test leaves running."""
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        p = ServerProcess(*args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def run_with_grappler_log(code: str, *args: str, timeout_s: float = 120) -> str:
    """Runs `code` in a fresh Python process with TensorFlow's Grappler log on ("Starting
    optimization for grappler item: NAME" per optimization) and returns its output, the log's
    lines among the code's own prints (one stream); fails if the process does."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="meta_optimizer=1")
    run = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    return run.stdout


def wait_for_workers(address: str, count: int, timeout_s: float = 60.0, tls=None) -> None:
    """Blocks until `count` workers are registered with the dispatcher at `address` (over TLS with
    `tls`, rpc.tls.TlsFiles)."""
    from dataservice.rpc.dispatcher_client import DispatcherClient

    deadline = time.monotonic() + timeout_s
    with DispatcherClient(address, timeout_s=5, tls=tls) as dispatcher:
        while time.monotonic() < deadline:
            if len(dispatcher.get_workers()) >= count:
                return
            time.sleep(0.1)
    raise TimeoutError(f"fewer than {count} workers registered at {address}")


def connect_from(source_host: str, address: str, timeout_s: float = 10.0) -> socket.socket:
    """A TCP connection to the port of `address` ('host:port') on IPv4 loopback, from
    `source_host`: to the server another loopback address (127.0.0.2) is another peer
    (rpc/peers.py)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.bind((source_host, 0))
        sock.connect(("127.0.0.1", int(address.rpartition(":")[2])))
    except BaseException:
        sock.close()
        raise
    return sock


def wait_until(condition, what: str, timeout_s: float = 30.0, poll_s: float = 0.05) -> None:
    """Blocks until `condition()` holds; fails the test, saying `what` did not happen, after
    `timeout_s` (a test asserts the state it waited for instead of sleeping and assuming it)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"within {timeout_s:.0f} s: {what}")
        time.sleep(poll_s)


def to_list(dataset: tf.data.Dataset, limit: int | None = None) -> list:
    out = []
    for element in dataset.as_numpy_iterator():
        out.append(element)
        if limit is not None and len(out) >= limit:
            break
    return out


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, host: str = "localhost") -> Samples:
    """The /metrics samples of the server whose monitoring port is `port` (on `host`)."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


@dataclasses.dataclass
class SecureCluster:
    """`data-server` processes as a production cluster runs them: TLS, a client token, a worker
    token of the servers' own, distributed_save confined to `snapshots_dir`, a worker
    sandboxed to both, and monitoring ports over HTTPS that need a token of their own. This
    process is its client (the CA and the client token in its environment)."""

    target: str
    dispatcher: ServerProcess
    worker: ServerProcess
    certs: Any
    token: str
    token_file: str
    worker_token: str
    data_dir: str
    snapshots_dir: str
    monitoring_token: str


@pytest.fixture(scope="module")
def secure_cluster(_secure_servers):
    """The SecureCluster, with this process as its client: the CA and the client token in its
    environment while the module's tests run. Its servers are the session's (each start took
    about 9 s, once for each of eight modules): tests see what earlier modules left (datasets,
    jobs), as tests of one module always did."""
    from dataservice.rpc import auth, tls

    cluster = _secure_servers
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv(tls.CA_ENV, cluster.certs.ca_file)
        environment.setenv(auth.TOKEN_ENV, cluster.token)
        yield cluster
    assert cluster.dispatcher.proc.poll() is None and cluster.worker.proc.poll() is None, "a secure server died"


@pytest.fixture(scope="session")
def _secure_servers(tmp_path_factory):
    """The servers of the SecureCluster, started once per session."""
    from dataservice.bench.certificates import make_certificates
    from dataservice.rpc import auth, tls

    base = tmp_path_factory.mktemp("secure")
    certs = make_certificates(str(base / "certs"))
    token = "t0ken-" + os.urandom(8).hex()
    token_file = base / "token"
    token_file.write_text(token)
    worker_token = "w0rker-" + os.urandom(8).hex()
    worker_token_file = base / "worker-token"
    worker_token_file.write_text(worker_token)
    monitoring_token = "m0nitor-" + os.urandom(8).hex()
    monitoring_token_file = base / "monitoring-token"
    monitoring_token_file.write_text(monitoring_token)
    data_dir = base / "data"
    data_dir.mkdir()
    snapshots_dir = base / "snapshots"
    snapshots_dir.mkdir()
    common = [
        "--protocol=grpc+tls",
        f"--tls_cert_file={certs.server_cert_file}",
        f"--tls_key_file={certs.server_key_file}",
        f"--auth_token_file={token_file}",
        f"--worker_token_file={worker_token_file}",
        "--monitoring_port=0",
        "--monitoring_tls",
        f"--monitoring_token_file={monitoring_token_file}",
    ]
    server_env = {**os.environ, tls.CA_ENV: certs.ca_file}
    started: list[ServerProcess] = []
    try:
        dispatcher = ServerProcess(
            "--role=dispatcher",
            "--port=0",
            f"--work_dir={base / 'work'}",
            "--fault_tolerant_mode",
            f"--snapshot_roots={snapshots_dir}",
            *common,
            env=server_env,
        )
        started.append(dispatcher)
        worker = ServerProcess(
            "--role=worker",
            "--port=0",
            f"--dispatcher_address={dispatcher.address}",
            f"--data_roots={data_dir},{snapshots_dir}",
            "--heartbeat_interval_ms=200",
            *common,
            env=server_env,
        )
        started.append(worker)
        with pytest.MonkeyPatch.context() as environment:
            environment.setenv(auth.TOKEN_ENV, token)
            wait_for_workers(dispatcher.address, 1, tls=tls.TlsFiles(ca_file=certs.ca_file))
        yield SecureCluster(
            f"grpc+tls://{dispatcher.address}",
            dispatcher,
            worker,
            certs,
            token,
            str(token_file),
            worker_token,
            str(data_dir),
            str(snapshots_dir),
            monitoring_token,
        )
    finally:
        for server in started:
            server.kill()


Pair = collections.namedtuple("Pair", "left right")


def nested_pipeline(n: int) -> tf.data.Dataset:
    """Elements of every kind a reader rebuilds: a dict of a scalar, a string, a vector of
    strings, a ragged tensor, a sparse one, a named tuple of a fixed and a variable shape,
    a tuple of booleans and halves, and an image-like tensor of varying size."""

    def element(i):
        return {
            "id": i,
            "name": tf.strings.as_string(i),
            "words": tf.strings.split(tf.strings.reduce_join(tf.fill([i % 3 + 1], "ab "))),
            "ragged": tf.RaggedTensor.from_row_lengths(tf.range(i % 4 * 2), [i % 4, i % 4]),
            "sparse": tf.sparse.SparseTensor([[0, i % 5]], [tf.cast(i, tf.float32)], [2, 5]),
            "pair": Pair(tf.fill([3], tf.cast(i, tf.int32)), tf.zeros([i % 3, 2], tf.float64)),
            "flags": (i % 2 == 0, tf.cast(i, tf.float16)),
            "image": tf.cast(tf.fill([i % 4 + 1, 2, 3], i), tf.uint8),
        }

    return tf.data.Dataset.range(n).map(element)
