"""TLS on every connection: client to dispatcher, worker to dispatcher, dispatcher to worker,
client to worker over gRPC and over the TCP data transfer; mutual TLS; and the failures
(plaintext against TLS, TLS against plaintext, an unknown CA, a missing client certificate),
each within the client's timeout with an error that says which. Certificates are made here."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tensorflow as tf

import dataservice
from dataservice.bench.certificates import make_certificates
from dataservice.local_cluster import LocalCluster
from dataservice.rpc import tls
from dataservice.rpc.dispatcher_client import DispatcherClient
from dataservice.transfer import tcp
from dataservice.v1 import worker_pb2


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory):
    return make_certificates(str(tmp_path_factory.mktemp("other")), name="other")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in (tls.CA_ENV, tls.CERT_ENV, tls.KEY_ENV):
        monkeypatch.delenv(name, raising=False)


def tls_options(certs, mutual: bool = False) -> dict:
    options = {"protocol": "grpc+tls", "tls_cert_file": certs.server_cert_file, "tls_key_file": certs.server_key_file}
    if mutual:
        options["tls_ca_file"] = certs.ca_file
    return options


def tls_cluster(certs, mutual: bool = False, num_workers: int = 1) -> LocalCluster:
    """A TLS cluster in this process. Its servers trust the CA through DATASERVICE_TLS_CA_FILE
    while they start (under mutual TLS through their tls_ca_file), which is set back after,
    so that each test sets up its client's environment itself."""
    options = tls_options(certs, mutual)
    worker_options = {**options, "heartbeat_interval_ms": 200, "dispatcher_timeout_ms": 20_000}
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv(tls.CA_ENV, certs.ca_file)
        return LocalCluster(num_workers, processes=False, dispatcher_options=options, worker_options=worker_options)


@pytest.mark.parametrize("transfer", ["tcp", "grpc"])
def test_a_tls_cluster_serves_clients_that_trust_its_ca(certs, monkeypatch, transfer):
    monkeypatch.setenv(tls.CA_ENV, certs.ca_file)
    with tls_cluster(certs, num_workers=2) as cluster:
        assert cluster.target.startswith("grpc+tls://")
        dataset = tf.data.Dataset.range(200).apply(
            dataservice.distribute("distributed_epoch", cluster.target, data_transfer_protocol=transfer)
        )
        assert sorted(dataset.as_numpy_iterator()) == list(range(200))
        # The TCP data port speaks TLS only: a plaintext request gets no stream back.
        transfer_address = tcp.transfer_address(cluster.workers[0].transfer_address)
        plain = tcp.connect(transfer_address, 5)
        try:
            plain.settimeout(5)
            tcp.send_request(plain, worker_pb2.StreamElementsRequest(task_id=1, credits=1))
            with pytest.raises((ConnectionError, OSError)):
                tcp.recv_response(plain)
        finally:
            plain.close()


def test_a_plaintext_client_is_told_to_use_tls(certs):
    with tls_cluster(certs) as cluster:
        with pytest.raises(tf.errors.UnavailableError) as raised:
            dataservice.register_dataset(
                f"grpc://{cluster.address}", tf.data.Dataset.range(3), dispatcher_timeout_ms=2000
            )
    assert "it serves TLS and this client speaks plaintext" in raised.value.message
    assert f"grpc+tls://{cluster.address}" in raised.value.message


def test_an_unknown_ca_is_named(certs, other_certs, monkeypatch):
    monkeypatch.setenv(tls.CA_ENV, other_certs.ca_file)
    with tls_cluster(certs) as cluster:
        with pytest.raises(tf.errors.UnavailableError) as raised:
            dataservice.register_dataset(cluster.target, tf.data.Dataset.range(3), dispatcher_timeout_ms=2000)
    assert "does not verify against the CA this client trusts" in raised.value.message
    assert other_certs.ca_file in raised.value.message and tls.CA_ENV in raised.value.message


def test_a_tls_client_against_a_plaintext_server_is_told(certs, monkeypatch, cluster):
    monkeypatch.setenv(tls.CA_ENV, certs.ca_file)
    with pytest.raises(tf.errors.UnavailableError, match="it does not serve TLS: address it as grpc://"):
        dataservice.register_dataset(
            f"grpc+tls://{cluster.address}", tf.data.Dataset.range(3), dispatcher_timeout_ms=2000
        )


def test_mutual_tls_requires_a_client_certificate(certs, monkeypatch):
    monkeypatch.setenv(tls.CA_ENV, certs.ca_file)
    with tls_cluster(certs, mutual=True, num_workers=2) as cluster:
        with pytest.raises(tf.errors.UnavailableError) as raised:
            dataservice.register_dataset(cluster.target, tf.data.Dataset.range(3), dispatcher_timeout_ms=2000)
        assert "requires a client certificate (mutual TLS)" in raised.value.message
        assert tls.CERT_ENV in raised.value.message
        monkeypatch.setenv(tls.CERT_ENV, certs.client_cert_file)
        monkeypatch.setenv(tls.KEY_ENV, certs.client_key_file)
        for transfer in ("tcp", "grpc"):
            dataset = tf.data.Dataset.range(100).apply(
                dataservice.distribute("parallel_epochs", cluster.target, data_transfer_protocol=transfer)
            )
            assert sorted(dataset.as_numpy_iterator()) == sorted(list(range(100)) * 2)


def test_mutual_tls_on_the_tcp_port_refuses_a_client_without_certificate(certs, monkeypatch):
    monkeypatch.setenv(tls.CA_ENV, certs.ca_file)
    monkeypatch.setenv(tls.CERT_ENV, certs.client_cert_file)
    monkeypatch.setenv(tls.KEY_ENV, certs.client_key_file)
    with tls_cluster(certs, mutual=True) as cluster:
        iterator = iter(tf.data.Dataset.range(10**6).apply(dataservice.distribute("parallel_epochs", cluster.target)))
        next(iterator)
        address = tcp.transfer_address(cluster.workers[0].transfer_address)
        without = tls.TlsFiles(ca_file=certs.ca_file)
        with pytest.raises((OSError, ConnectionError)):
            sock = tcp.connect(address, 5, without)
            try:
                sock.settimeout(5)
                tcp.send_request(sock, worker_pb2.StreamElementsRequest(task_id=1, credits=1))
                tcp.recv_response(sock)
            finally:
                sock.close()
        assert tls.diagnose(address, without).startswith("it requires a client certificate")
        del iterator


def test_tls_processes_and_data_server_status(certs, processes, monkeypatch):
    # The processes trust the CA through the environment they inherit (no mutual TLS).
    monkeypatch.setenv(tls.CA_ENV, certs.ca_file)
    flags = [f"--{k}={v}" for k, v in tls_options(certs).items()]
    dispatcher = processes("--role=dispatcher", "--port=0", *flags)
    worker = processes("--role=worker", "--port=0", f"--dispatcher_address=grpc+tls://{dispatcher.address}", *flags)
    with DispatcherClient(dispatcher.address, 30, tls=tls.TlsFiles.from_environment()) as client:
        assert [w.address for w in client.get_workers()] == [worker.address]
    dataset = tf.data.Dataset.range(50).apply(
        dataservice.distribute("parallel_epochs", f"grpc+tls://{dispatcher.address}")
    )
    assert sorted(dataset.as_numpy_iterator()) == list(range(50))
    status = [sys.executable, "-m", "dataservice.cli", "status"]
    out = subprocess.run(
        [*status, f"--dispatcher_address=grpc+tls://{dispatcher.address}"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert worker.address in out.stdout
    plaintext = subprocess.run(
        [*status, f"--dispatcher_address={dispatcher.address}", "--timeout_s=2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plaintext.returncode == 1 and "serves TLS" in plaintext.stderr


def test_tls_config_errors(certs, tmp_path):
    with pytest.raises(ValueError, match="needs tls_cert_file and tls_key_file"):
        dataservice.DispatcherConfig(protocol="grpc+tls")
    with pytest.raises(ValueError, match="need protocol='grpc\\+tls'"):
        dataservice.DispatcherConfig(tls_cert_file=certs.server_cert_file, tls_key_file=certs.server_key_file)
    with pytest.raises(ValueError, match="cannot read the TLS key file"):
        dataservice.WorkerConfig(
            dispatcher_address="localhost:1",
            protocol="grpc+tls",
            tls_cert_file=certs.server_cert_file,
            tls_key_file=str(tmp_path / "missing.key"),
        )
    with pytest.raises(ValueError, match="protocol must be one of"):
        dataservice.distribute("parallel_epochs", "https://localhost:1")
