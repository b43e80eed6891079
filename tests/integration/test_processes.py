"""`data-server` processes: started with subprocess, stopped with SIGTERM, read over loopback."""

import collections
import os
import signal
import subprocess
import sys

import pytest
import tensorflow as tf
from conftest import REPO_ROOT, to_list, wait_for_workers

import dataservice as service
from dataservice import cli
from dataservice.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(240)


def test_dispatcher_and_workers_as_processes():
    cluster = LocalCluster(num_workers=2)
    try:
        wait_for_workers(cluster.address, 2)
        source = tf.data.Dataset.range(300).map(lambda x: {"x": x, "s": tf.strings.as_string(x)}).shuffle(50)
        ds = source.apply(service.distribute("parallel_epochs", cluster.target))
        counts = collections.Counter(int(e["x"]) for e in to_list(ds))
        assert counts == {i: 2 for i in range(300)}
        # A second epoch over the same dataset, through the same processes.
        assert len(to_list(ds)) == 600
    finally:
        workers, dispatcher = cluster.workers, cluster.dispatcher
        codes = [w.terminate() for w in workers] + [dispatcher.terminate()]
        cluster.stop()
    assert codes == [0, 0, 0], "SIGTERM must stop every server gracefully with status 0"


def test_worker_from_yaml_config_and_flag_override(processes, tmp_path):
    dispatcher = processes("--role=dispatcher", "--port=0")
    config = tmp_path / "worker.yaml"
    config.write_text(f"dispatcher_address: {dispatcher.address}\nheartbeat_interval_ms: 250\nport: 1\n")
    worker = processes("--role=worker", f"--config={config}", "--port=0")
    assert worker.port != 1, "--port must override the file's port"
    wait_for_workers(dispatcher.address, 1)
    ds = tf.data.Dataset.range(10).apply(service.distribute("parallel_epochs", "grpc://" + dispatcher.address))
    assert sorted(to_list(ds)) == list(range(10))
    assert worker.terminate() == 0 and dispatcher.terminate() == 0


def test_sigint_also_stops_gracefully(processes):
    dispatcher = processes("--role=dispatcher", "--port=0")
    dispatcher.proc.send_signal(signal.SIGINT)
    assert dispatcher.proc.wait(30) == 0


def _run_cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "dataservice.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--role=coordinator"], "invalid choice: 'coordinator'"),
        (["--role=dispatcher", "--bogus_flag=1"], "unrecognized arguments: --bogus_flag=1"),
        (["--role=dispatcher", "--port=x"], "--port: invalid int value"),
        (["--role=worker"], "needs --dispatcher_address"),
        (["--role=worker", "--dispatcher_address=localhost:1", "--work_dir=/tmp"], "--work_dir cannot be used"),
        (["--role=dispatcher", "--fault_tolerant_mode"], "needs a work_dir"),
        (["--role=dispatcher", "--config=/nonexistent.yaml"], "cannot read config file"),
    ],
)
def test_bad_command_lines_fail_with_a_message(args, message, capsys):
    """data-server's own parsing, in this process (a process of its own is
    test_unknown_yaml_key_is_named's): each bad line exits non-zero, naming the problem."""
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code != 0
    assert message in capsys.readouterr().err


def test_unknown_yaml_key_is_named(tmp_path):
    config = tmp_path / "d.yaml"
    config.write_text("port: 0\nwork_dirr: /tmp/x\n")
    result = _run_cli("--role=dispatcher", f"--config={config}")
    assert result.returncode != 0
    assert "work_dirr" in result.stderr and "not fields of DispatcherConfig" in result.stderr


def test_server_bin_entry_point_runs():
    result = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "server_bin", "data_server.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "--role" in result.stdout


_OWNER = """
import os, sys, time
from dataservice.local_cluster import LocalCluster
cluster = LocalCluster(1)
print(cluster.work_dir, cluster.dispatcher.proc.pid, *(w.proc.pid for w in cluster.workers), flush=True)
time.sleep(600)
"""


def test_server_processes_exit_when_their_owner_is_killed():
    """A LocalCluster's data-server processes stop when the process holding it dies, even by
    SIGKILL (no chance to stop them), rather than run on orphaned, and the temporary work_dir
    the cluster made is removed."""
    import psutil

    env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        work_dir, *pids = owner.stdout.readline().split()
        pids = [int(pid) for pid in pids]
        assert len(pids) == 2, "the owner did not start its cluster"
        assert os.path.isdir(work_dir)
        servers = [psutil.Process(pid) for pid in pids]
        assert all(s.is_running() and s.status() != psutil.STATUS_ZOMBIE for s in servers)
    finally:
        owner.kill()
        owner.wait(30)
    gone, alive = psutil.wait_procs(servers, timeout=45)
    for server in alive:
        server.kill()
    assert not alive, f"orphaned server processes: {[s.pid for s in alive]}"
    assert not os.path.exists(work_dir), "the cluster's temporary work_dir was left behind"


def test_a_dispatcher_serves_workers_before_it_has_imported_tensorflow():
    """What a dispatcher does on its own (workers' heartbeats, status) needs no TensorFlow, which
    takes seconds to import: shown in a process where importing it fails, where registering a
    dataset (which needs it) is an error that names it and the server serves on."""
    script = """
import sys
sys.modules["tensorflow"] = None  # importing tensorflow (or any of its modules) now fails
from dataservice.config import DispatcherConfig
from dataservice.dispatcher.dispatch_server import DispatchServer
from dataservice.errors import ServiceError
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.v1 import common_pb2
server = DispatchServer(DispatcherConfig(port=0))
with DispatcherClient(f"localhost:{server.port}", 10) as client:
    client.worker_heartbeat("localhost:1", "", [], 10)
    print("workers", len(client.get_status()["workers"]))
    try:
        client.register_dataset(b"x", common_pb2.DatasetMetadata())
    except ServiceError as e:
        print("register", type(e).__name__, "tensorflow" in str(e).lower())
    print("workers", len(client.get_status()["workers"]))
server.stop()
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:3] == ["workers 1", "register InternalError True", "workers 1"], result.stdout
