"""`data-server`: run a dispatcher or a worker as its own process.

    data-server --role=dispatcher --port=5050 --work_dir=/data/ds --fault_tolerant_mode
    data-server --role=worker --dispatcher_address=dispatcher:5050 --port=5051
    data-server --role=worker --config worker.yaml --port=6000   # flags override the file
    data-server status --dispatcher_address=dispatcher:5050        # what the dispatcher knows, as tables
    data-server journal verify --work_dir=/data/ds                 # would a dispatcher start on this journal
    data-server journal dump --work_dir=/data/ds                   # its updates, one JSON object a line

A YAML config file holds a mapping whose keys are the field names of
DispatcherConfig or WorkerConfig. On start the server prints one line,
"dataservice <role> listening on port <N>, monitoring on port <M>", so that a
caller that bound port 0 learns the ports (M: the status page and /metrics;
--monitoring_port picks it, by default a free one; --no-monitoring turns it
off). SIGTERM or SIGINT stops it gracefully with exit status 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import os
import shutil
import signal
import sys
import threading
from typing import Any

import yaml

from dataservice import modes
from dataservice.config import DispatcherConfig, WorkerConfig
from dataservice.dispatcher import journal_tool
from dataservice.monitoring import logs, status_tables
from dataservice.quiet import python_stderr_apart, quiet_tensorflow, quiet_tensorflow_in_background
from dataservice.rpc import auth, secret_files, tls
from dataservice.rpc.addresses import parse_service
from dataservice.status import ServiceError
from dataservice.transfer import allocator
from dataservice.worker import sandbox, tensorflow_settings

# TensorFlow, and the servers that use it, are imported only once a worker's file sandbox is in place
# (worker/sandbox.py): TensorFlow starts threads on import, which the sandbox would not cover.

_CONFIGS = {"dispatcher": DispatcherConfig, "worker": WorkerConfig}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="data-server", description="Run a dataservice dispatcher or worker.")
    parser.add_argument("--role", required=True, choices=sorted(_CONFIGS), help="which server to run")
    parser.add_argument("--config", help="YAML file of config fields (flags override it)")
    parser.add_argument("--port", type=int, help="port to bind (0: a free port)")
    parser.add_argument("--work_dir", help="dispatcher: where datasets and the journal are kept")
    parser.add_argument(
        "--fault_tolerant_mode",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dispatcher: journal state to work_dir so a restart loses nothing",
    )
    parser.add_argument("--worker_addresses", help="dispatcher: comma-separated fixed worker list (static sharding)")
    parser.add_argument("--worker_timeout_ms", type=int, help="dispatcher: when a silent worker counts as gone")
    parser.add_argument("--job_gc_check_interval_ms", type=int, help="dispatcher: how often to collect jobs")
    parser.add_argument("--job_gc_timeout_ms", type=int, help="dispatcher: how long an unread job is kept")
    parser.add_argument(
        "--iteration_retention_ms", type=int, help="dispatcher: how long a finished iteration is kept (-1: for good)"
    )
    parser.add_argument("--client_timeout_ms", type=int, help="dispatcher: when a silent client is released")
    parser.add_argument("--dispatcher_address", help="worker: host:port of the dispatcher")
    parser.add_argument("--worker_address", help="worker: address clients reach it at (%%port%% = bound port)")
    parser.add_argument("--heartbeat_interval_ms", type=int, help="worker: heartbeat period")
    parser.add_argument("--dispatcher_timeout_ms", type=int, help="worker: how long to retry the dispatcher")
    parser.add_argument(
        "--data_transfer_protocol",
        choices=["tcp", "grpc"],
        help="worker: how clients read elements (default tcp, next to gRPC)",
    )
    parser.add_argument(
        "--data_transfer_address",
        help="worker: address clients reach the TCP transfer at (%%dts_port%% = its bound port)",
    )
    parser.add_argument("--data_transfer_port", type=int, help="worker: port of the TCP transfer (0: a free port)")
    parser.add_argument(
        "--worker_tags",
        type=lambda value: [tag for tag in value.split(",") if tag],
        help="worker: comma-separated tags (COLOCATED: read only by clients on its host)",
    )
    parser.add_argument(
        "--snapshot_roots",
        type=lambda value: [root for root in value.split(",") if root],
        help="dispatcher: comma-separated directories distributed_save may write under (default: anywhere)",
    )
    parser.add_argument(
        "--data_roots",
        type=lambda value: [root for root in value.split(",") if root],
        help="worker: comma-separated directories its pipelines may read files under, enforced by the kernel "
        "(Landlock); without it, reads are unrestricted",
    )
    parser.add_argument(
        "--cross_trainer_cache_size_bytes",
        type=int,
        help="worker: the window of elements trainers share per task (cross_trainer_cache; default 10 GiB)",
    )
    parser.add_argument(
        "--memory_budget_bytes",
        type=int,
        help="worker: what task buffers, cache windows and unacknowledged messages may hold together "
        "(default: half the memory the worker may use)",
    )
    parser.add_argument("--protocol", choices=["grpc", "grpc+tls"], help="grpc+tls: serve (and call) over TLS")
    parser.add_argument("--tls_cert_file", help="grpc+tls: the server's PEM certificate")
    parser.add_argument("--tls_key_file", help="grpc+tls: the server's PEM key")
    parser.add_argument("--tls_ca_file", help="grpc+tls: require client certificates signed by this CA (mutual TLS)")
    parser.add_argument("--max_graph_bytes", type=int, help="dispatcher: the largest dataset graph it registers")
    parser.add_argument(
        "--graph_memory_bytes", type=int, help="dispatcher: memory for dataset graphs (a cache with a work_dir)"
    )
    parser.add_argument(
        "--worker_max_concurrent_snapshots",
        type=int,
        help="dispatcher: how many distributed_save snapshots a worker writes at once (0: all)",
    )
    parser.add_argument("--auth_token_file", help="file holding the token every RPC must carry (rpc/auth.py)")
    parser.add_argument(
        "--worker_token_file",
        help="file holding the token the cluster's servers use with each other (not the clients' token)",
    )
    parser.add_argument(
        "--allow_unsafe_ops",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run datasets whose graphs write files or act outside producing elements (off by default)",
    )
    parser.add_argument(
        "--monitoring_port",
        type=int,
        help="HTTP port of /metrics and (dispatcher) the status page; 0, the default: a free port",
    )
    parser.add_argument(
        "--monitoring", action=argparse.BooleanOptionalAction, default=True, help="serve the monitoring port"
    )
    parser.add_argument(
        "--monitoring_token_file", help="file holding the token the monitoring pages need (not /healthz, /readyz)"
    )
    parser.add_argument(
        "--monitoring_tls",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the monitoring port over HTTPS with the server's certificate",
    )
    parser.add_argument("--log_level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument(
        "--log_format", default="text", choices=list(logs.FORMATS), help="json: one JSON object per log line"
    )
    return parser


def _status_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="data-server status", description="Print what a dispatcher knows: workers, jobs, clients, datasets."
    )
    parser.add_argument(
        "--dispatcher_address", required=True, help="host:port of the dispatcher (grpc+tls://host:port: over TLS)"
    )
    parser.add_argument("--json", action="store_true", help="print the status document as JSON")
    parser.add_argument("--timeout_s", type=float, default=10.0, help="how long to try to reach the dispatcher")
    return parser


def status_main(argv: list[str]) -> int:
    """`data-server status`: the dispatcher's status document as tables (or JSON)."""
    args = _status_parser().parse_args(argv)
    try:
        target = parse_service(args.dispatcher_address)
    except ValueError as e:
        print(f"data-server status: {e}", file=sys.stderr)
        return 2
    from dataservice.rpc.dispatcher_client import DispatcherClient

    client = DispatcherClient(target.address, args.timeout_s, tls=target.tls)
    try:
        doc = client.get_status()
    except ServiceError as e:
        print(f"data-server status: {e.message}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(json.dumps(doc, indent=2) if args.json else status_tables.render(doc))
    return 0


def build_config(args: argparse.Namespace) -> Any:
    """The role's config from the YAML file (if any) overridden by the flags given.

    Raises ValueError naming the problem: an unreadable file, a key that is not
    a field of the role's config, a flag that belongs to the other role, or a
    value the config rejects.
    """
    cls = _CONFIGS[args.role]
    fields = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config) as f:
                loaded = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"cannot read config file {args.config}: {e}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"config file {args.config} must hold a mapping of {cls.__name__} fields")
        unknown = sorted(set(loaded) - fields)
        if unknown:
            raise ValueError(
                f"config file {args.config}: {', '.join(unknown)} not fields of {cls.__name__} "
                f"(fields: {', '.join(sorted(fields))})"
            )
        values.update(loaded)
    local = ("role", "config", "log_level", "log_format", "monitoring")
    flags = {k: v for k, v in vars(args).items() if k not in local and v is not None}
    foreign = sorted(set(flags) - fields)
    if foreign:
        raise ValueError(f"--{', --'.join(foreign)} cannot be used with --role={args.role}")
    if isinstance(flags.get("worker_addresses"), str):
        flags["worker_addresses"] = [a for a in flags["worker_addresses"].split(",") if a]
    values.update(flags)
    # A standalone server serves its monitoring port unless told not to (in-process ones do not).
    if not args.monitoring:
        values["monitoring_port"] = None
    elif values.get("monitoring_port") is None:
        values["monitoring_port"] = 0
    if args.role == "worker" and "dispatcher_address" not in values:
        raise ValueError("--role=worker needs --dispatcher_address (or dispatcher_address in --config)")
    try:
        return cls(**values)
    except TypeError as e:
        raise ValueError(str(e)) from None


# Set by a process that starts data-server as its child (local_cluster.ServerProcess): the read
# end of a pipe whose write end only that process holds. The kernel closes the write end when the
# parent dies, however it dies (SIGKILL included), and the server then stops rather than run on,
# orphaned.
PARENT_PIPE_ENV = "DATASERVICE_PARENT_PIPE_FD"
# Also set by such a parent: a directory it made for this server (a temporary work_dir). The
# parent removes it when it stops the server; if the parent dies first, the server removes it
# once it has stopped, so that nothing is left behind either way.
OWNED_DIR_ENV = "DATASERVICE_OWNED_DIR"
# A stop that hangs must not leave the process behind.
_ORPHAN_EXIT_S = 30.0


def _stop_when_parent_exits(stop: threading.Event, orphaned: threading.Event) -> None:
    fd = os.environ.pop(PARENT_PIPE_ENV, None)
    if fd is None:
        return

    def watch() -> None:
        try:
            while os.read(int(fd), 1):
                pass
        except (OSError, ValueError):
            pass
        logging.getLogger(__name__).warning("the process that started this server is gone: stopping")
        orphaned.set()
        stop.set()
        exit_anyway = threading.Timer(_ORPHAN_EXIT_S, os._exit, args=(1,))
        exit_anyway.daemon = True
        exit_anyway.start()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _enter_sandbox(config: WorkerConfig) -> None:
    """Reads the worker's credential files into memory, then restricts the process's reads to
    config.data_roots, while it is still the only thread."""
    secret_files.preload(
        [
            config.auth_token_file,
            config.worker_token_file,
            config.monitoring_token_file,
            config.tls_cert_file,
            config.tls_key_file,
            config.tls_ca_file,
            *(os.environ.get(name) for name in (auth.TOKEN_FILE_ENV, tls.CA_ENV, tls.CERT_ENV, tls.KEY_ENV)),
        ]
    )
    sandbox.restrict_reads(list(config.data_roots))


def _register_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="data-server register",
        description=(
            "Register a tf.data pipeline with a dispatcher and print its dataset id: trainers read it by id, "
            "with TensorFlow (from_dataset_id) or without (dataservice.reader.NumpyReader)."
        ),
    )
    parser.add_argument(
        "--dispatcher_address", required=True, help="host:port of the dispatcher (grpc+tls://host:port: over TLS)"
    )
    parser.add_argument(
        "--pipeline",
        required=True,
        help="module:function, a function of no arguments that returns the tf.data.Dataset "
        "(the module is imported from the current directory or the Python path)",
    )
    parser.add_argument(
        "--dataset_id", default="", help="the id to register it under (default: one the dispatcher picks)"
    )
    parser.add_argument("--compression", default="AUTO", choices=["AUTO", "SNAPPY", "NONE"], help="compression")
    parser.add_argument(
        "--processing_mode",
        default="parallel_epochs",
        help="how it will be read; distributed_epoch checks here that its sources can be split",
    )
    parser.add_argument("--timeout_s", type=float, default=30.0, help="how long to try to reach the dispatcher")
    return parser


def register_main(argv: list[str]) -> int:
    """`data-server register`: registers a pipeline from a module's function, prints its id."""
    args = _register_parser().parse_args(argv)
    module_name, _, function_name = args.pipeline.partition(":")
    if not module_name or not function_name:
        print(f"data-server register: --pipeline must be module:function, got {args.pipeline!r}", file=sys.stderr)
        return 2
    try:
        target = parse_service(args.dispatcher_address)
        mode = modes.parse_processing_mode(args.processing_mode)
    except ValueError as e:
        print(f"data-server register: {e}", file=sys.stderr)
        return 2
    quiet_tensorflow()
    import importlib

    import tensorflow as tf

    from dataservice.client.api import register_pipeline

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        dataset = getattr(importlib.import_module(module_name), function_name)()
    except (ImportError, AttributeError) as e:
        print(f"data-server register: cannot load {args.pipeline}: {e}", file=sys.stderr)
        return 2
    if not isinstance(dataset, tf.data.Dataset):
        print(f"data-server register: {args.pipeline}() returned {type(dataset).__name__}, not a tf.data.Dataset")
        return 2
    try:
        dataset_id = register_pipeline(
            target,
            dataset,
            args.compression,
            args.dataset_id,
            args.timeout_s,
            splittable=mode == modes.ShardingPolicy.DYNAMIC,
        )
    except (ServiceError, ValueError, TypeError) as e:
        print(f"data-server register: {getattr(e, 'message', e)}", file=sys.stderr)
        return 1
    print(dataset_id)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["status"]:
        return status_main(argv[1:])
    if argv[:1] == ["register"]:
        return register_main(argv[1:])
    if argv[:1] == ["journal"]:
        return journal_tool.main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        config = build_config(args)
    except ValueError as e:
        parser.error(str(e))
    if args.role == "dispatcher":
        # The dispatcher serves before TensorFlow is imported (dispatch_server.py), its own logs
        # showing meanwhile (quiet.py).
        python_stderr_apart()
    logs.configure(args.log_level, args.log_format)
    if args.role == "worker":
        allocator.cap_arenas()
        allocator.keep_freed_memory()
        if tensorflow_settings.leave_out_onednn_rewrites():
            logging.getLogger(__name__).info(
                "TensorFlow's oneDNN graph rewrites are off for pipelines (%s=1 keeps them)",
                tensorflow_settings.ONEDNN_ENV,
            )
        if config.data_roots:
            try:
                _enter_sandbox(config)
            except (sandbox.SandboxError, OSError) as e:
                print(f"data-server: cannot start the worker: {e}", file=sys.stderr)
                return 1
    # A server runs no JAX, but TensorFlow imports it at start-up wherever it is installed (its
    # lite converter's optional JAX support): half a second of every server's start on 2 cores.
    sys.modules.setdefault("jax", None)  # type: ignore[arg-type]
    # Nor Keras, which TensorFlow imports eagerly (for its optimizers' SavedModel registrations;
    # with it scikit-learn, matplotlib and SciPy where they are installed): almost half of a
    # server's start. Pipelines run as graphs of TensorFlow ops, with no Keras code.
    sys.modules.setdefault("keras", None)  # type: ignore[arg-type]
    start_errors: tuple[type[Exception], ...] = (ServiceError, RuntimeError)
    tensorflow_import: threading.Thread | None = None
    if args.role == "dispatcher":
        tensorflow_import = quiet_tensorflow_in_background()
        from dataservice.dispatcher.dispatch_server import DispatchServer
    else:
        quiet_tensorflow()
        import tensorflow as tf

        if args.role == "worker" and tensorflow_settings.leave_out_tfg_function_pass():
            logging.getLogger(__name__).info("Grappler's TFG hook is left out of the pipelines' functions")

        from dataservice.worker.worker_server import WorkerServer

        start_errors += (tf.errors.OpError,)

    stop, orphaned = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    _stop_when_parent_exits(stop, orphaned)
    owned_dir = os.environ.pop(OWNED_DIR_ENV, None)

    try:
        server = DispatchServer(config) if args.role == "dispatcher" else WorkerServer(config)
    except start_errors as e:
        print(f"data-server: cannot start the {args.role}: {getattr(e, 'message', e)}", file=sys.stderr)
        return 1
    # What start-up made (TensorFlow's modules, a recovered state) lives as long as the process:
    # frozen, a full garbage collection no longer scans it, which otherwise paused every thread
    # (request handlers included) for a large part of a second while a big snapshot was written.
    # (The dispatcher's TensorFlow is frozen once its import, on a thread, is done.)
    gc.freeze()
    line = f"dataservice {args.role} listening on port {server.port}"
    if server.monitoring_port is not None:
        line += f", monitoring on port {server.monitoring_port}"
    print(line, flush=True)
    while not stop.wait(0.5):
        if tensorflow_import is not None and not tensorflow_import.is_alive():
            gc.freeze()
            tensorflow_import = None
    server.stop()
    logging.getLogger(__name__).info("%s stopped", args.role)
    if orphaned.is_set() and owned_dir:
        shutil.rmtree(owned_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
