"""The monitoring port of a secured cluster of `data-server` processes (monitoring_tls and
monitoring_token_file): metrics, the status page and its data need the monitoring token (as a
Bearer token or a Basic password) over HTTPS; the probes stay open and say nothing else; the
clients' token does not open them; plaintext HTTP gets no page."""

from __future__ import annotations

import base64
import http.client
import ssl

import pytest


def _get(port: int, path: str, cafile: str, authorization: str | None = None) -> tuple[int, bytes, dict]:
    context = ssl.create_default_context(cafile=cafile)
    connection = http.client.HTTPSConnection("localhost", port, context=context, timeout=10)
    try:
        connection.request("GET", path, headers={"Authorization": authorization} if authorization else {})
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def _ports(secure_cluster) -> dict[str, int]:
    return {"dispatcher": secure_cluster.dispatcher.monitoring_port, "worker": secure_cluster.worker.monitoring_port}


@pytest.mark.parametrize("role", ["dispatcher", "worker"])
def test_pages_need_the_monitoring_token(secure_cluster, role):
    port, ca = _ports(secure_cluster)[role], secure_cluster.certs.ca_file
    paths = ["/metrics"] + (["/status.json", "/"] if role == "dispatcher" else [])
    basic = "Basic " + base64.b64encode(f"prometheus:{secure_cluster.monitoring_token}".encode()).decode()
    for path in paths:
        for refused in (None, "Bearer wrong", f"Bearer {secure_cluster.token}", "Basic !!!", "Digest x"):
            code, body, headers = _get(port, path, ca, refused)
            assert code == 401 and "Basic" in headers["WWW-Authenticate"], (path, refused)
            assert b"dataservice_" not in body and b"work_dir" not in body
        for accepted in (f"Bearer {secure_cluster.monitoring_token}", basic):
            code, body, _ = _get(port, path, ca, accepted)
            assert code == 200, (path, body[:200])
    code, body, _ = _get(port, "/metrics", ca, f"Bearer {secure_cluster.monitoring_token}")
    assert b"dataservice_" in body


@pytest.mark.parametrize("role", ["dispatcher", "worker"])
def test_probes_stay_open_and_say_nothing_else(secure_cluster, role):
    port = _ports(secure_cluster)[role]
    for path in ("/healthz", "/readyz"):
        code, body, _ = _get(port, path, secure_cluster.certs.ca_file)
        assert (code, body) == (200, b"ok\n")


@pytest.mark.parametrize("role", ["dispatcher", "worker"])
def test_plaintext_http_gets_no_page(secure_cluster, role):
    connection = http.client.HTTPConnection("localhost", _ports(secure_cluster)[role], timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            connection.request("GET", "/metrics")
            connection.getresponse().read()
    finally:
        connection.close()
