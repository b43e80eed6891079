"""TLS on every connection: gRPC channels and servers, and the TCP data transfer.

A cluster is TLS or not as a whole: servers configured with protocol "grpc+tls"
(tls_cert_file and tls_key_file) serve gRPC and the TCP data transfer over TLS;
clients address them as "grpc+tls://host:port" and then reach their workers over
TLS too. A server's tls_ca_file makes it require and verify client certificates
(mutual TLS). Certificates are verified against a CA (tls_ca_file, or
DATASERVICE_TLS_CA_FILE, else the system's roots) and the host name the address
names. Client processes take the CA and, for mutual TLS, their certificate and
key from DATASERVICE_TLS_CA_FILE, DATASERVICE_TLS_CERT_FILE and
DATASERVICE_TLS_KEY_FILE; a server uses its own certificate as client
certificate when it calls another server.

When a connection cannot be made, diagnose() looks at the server with Python's
ssl module to say why in words: it serves TLS to a plaintext client, it does not
serve TLS, its certificate is signed by a CA the client does not trust, or it
requires a client certificate that the client did not present.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import ssl

import grpc

from dataservice.rpc import secret_files

PLAINTEXT = "grpc"
TLS = "grpc+tls"
PROTOCOLS = (PLAINTEXT, TLS)
CA_ENV = "DATASERVICE_TLS_CA_FILE"
CERT_ENV = "DATASERVICE_TLS_CERT_FILE"
KEY_ENV = "DATASERVICE_TLS_KEY_FILE"
_DIAGNOSE_TIMEOUT_S = 3.0


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        return secret_files.read(path)
    except OSError as e:
        raise ValueError(f"cannot read the {what} file {path}: {e.strerror or e}") from None


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """The PEM files of one end: the CA it trusts (None: the system's roots), and its own
    certificate and key (a server's; a client's under mutual TLS)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def from_environment(cls) -> TlsFiles:
        """A client process's files: DATASERVICE_TLS_CA_FILE, _CERT_FILE and _KEY_FILE."""
        return cls(os.environ.get(CA_ENV) or None, os.environ.get(CERT_ENV) or None, os.environ.get(KEY_ENV) or None)

    def check(self) -> None:
        """Raises ValueError if a file cannot be read, or a certificate comes without its key."""
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a TLS certificate needs its key and a key its certificate (tls_cert_file, tls_key_file)")
        _read(self.ca_file, "TLS CA")
        _read(self.cert_file, "TLS certificate")
        _read(self.key_file, "TLS key")

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "TLS CA"),
            private_key=_read(self.key_file, "TLS key"),
            certificate_chain=_read(self.cert_file, "TLS certificate"),
        )

    def client_context(self) -> ssl.SSLContext:
        """For the client end of a TCP data stream."""
        with secret_files.as_path(self.ca_file) as ca_file:
            context = ssl.create_default_context(cafile=ca_file)
        if self.cert_file:
            with secret_files.as_path(self.cert_file) as cert, secret_files.as_path(self.key_file) as key:
                context.load_cert_chain(cert, key)
        return context


@dataclasses.dataclass(frozen=True)
class ServerTls:
    """A server's TLS: its certificate and key, and (mutual TLS) the CA its clients' certificates
    must be signed by. As a client of another server it presents the same certificate."""

    cert_file: str
    key_file: str
    ca_file: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(_read(self.key_file, "TLS key"), _read(self.cert_file, "TLS certificate"))],
            root_certificates=_read(self.ca_file, "TLS CA"),
            require_client_auth=self.ca_file is not None,
        )

    def server_context(self) -> ssl.SSLContext:
        """For the server end of the TCP data transfer."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with secret_files.as_path(self.cert_file) as cert, secret_files.as_path(self.key_file) as key:
            context.load_cert_chain(cert, key)
        if self.ca_file:
            with secret_files.as_path(self.ca_file) as ca_file:
                context.load_verify_locations(ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def monitoring_context(self) -> ssl.SSLContext:
        """For the monitoring port: the server's certificate, and no client certificate asked for
        even under mutual TLS (Prometheus may present one, kubelet's probes cannot)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with secret_files.as_path(self.cert_file) as cert, secret_files.as_path(self.key_file) as key:
            context.load_cert_chain(cert, key)
        return context

    def as_client(self) -> TlsFiles:
        """What this server presents and trusts when it calls another server: its own CA, else
        the process's DATASERVICE_TLS_CA_FILE, else the system's roots."""
        return TlsFiles(self.ca_file or os.environ.get(CA_ENV) or None, self.cert_file, self.key_file)


def diagnose(address: str, files: TlsFiles | None) -> str | None:
    """Why a connection to `address` fails, in words, or None if a TLS handshake shows nothing
    wrong (the server may simply be down). `files`: the client's TLS files, None for plaintext."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        raw = socket.create_connection((host, int(port)), timeout=_DIAGNOSE_TIMEOUT_S)
    except (OSError, ValueError):
        return None
    with raw:
        if files is None:
            probe = ssl.create_default_context()
            probe.check_hostname = False
            probe.verify_mode = ssl.CERT_NONE
            try:
                with probe.wrap_socket(raw, server_hostname=host):
                    pass
            except (ssl.SSLError, OSError):
                return None
            return f"it serves TLS and this client speaks plaintext: address it as {TLS}://{address}"
        try:
            context = files.client_context()
        except (OSError, ssl.SSLError) as e:
            return f"this client's TLS files cannot be used ({e})"
        try:
            tls_sock = context.wrap_socket(raw, server_hostname=host)
        except ssl.SSLCertVerificationError as e:
            ca = files.ca_file or "the system's roots"
            return (
                f"its certificate does not verify against the CA this client trusts ({ca}): {e.verify_message}; "
                f"set {CA_ENV} to the CA that signed the servers' certificates"
            )
        except ssl.SSLError as e:
            reason = (e.reason or str(e)).upper()
            if "CERTIFICATE_REQUIRED" in reason or "HANDSHAKE_FAILURE" in reason or "BAD_CERTIFICATE" in reason:
                return _certificate_refused(files, e.reason)
            if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason or "PACKET_LENGTH" in reason:
                return f"it does not serve TLS: address it as {PLAINTEXT}://{address}"
            return f"the TLS handshake failed: {e.reason or e}"
        except OSError:
            return None
        with tls_sock:
            # Under TLS 1.3 the server judges the client's certificate after the client's side
            # of the handshake is done: a refusal shows as an alert or a close on the first read.
            try:
                tls_sock.settimeout(_DIAGNOSE_TIMEOUT_S)
                tls_sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                answered = tls_sock.recv(1)
            except (ssl.SSLEOFError, ConnectionResetError, BrokenPipeError) as e:
                return _certificate_refused(files, str(e))
            except ssl.SSLError as e:
                return _certificate_refused(files, e.reason or str(e))
            except OSError:
                return None
            if not answered:
                return _certificate_refused(files, "the connection was closed")
    return None
    return None


def _certificate_refused(files: TlsFiles, detail: str | None) -> str:
    if not files.cert_file:
        return f"it requires a client certificate (mutual TLS) and this client has none: set {CERT_ENV} and {KEY_ENV}"
    return f"it refused this client's certificate {files.cert_file} ({detail})"
