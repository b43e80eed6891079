"""Every argument of distribute(), register_dataset() and from_dataset_id(), every field of
TensorFlow's DispatcherConfig and WorkerConfig, the cross-trainer cache and distributed_save,
through TensorFlow's service and through ours: what a user sees (the elements, or the type of
the error) must be the same, except where KNOWN_DIFFERENCES says why it is not.

Each case is a call that builds what it needs and reads it (a config is built and its server
started and stopped), so an error counts whenever it comes: TensorFlow raises many of them at
the first element, ours before any RPC.
"""

import os
import time

import pytest
import tensorflow as tf
from conformance import tensorflow_servers
from conftest import in_process_cluster, stop_tensorflow_servers

import dataservice as service

pytestmark = pytest.mark.timeout(300)

TF = tf.data.experimental.service
SYSTEMS = {"tensorflow": TF, "dataservice": service}


def outcome(call):
    """("ok", value) or (the error's type name, None)."""
    try:
        return "ok", call()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e).__name__, None


# Elements read of each dataset: enough to see it works, few enough that no case waits for
# TensorFlow's client to learn that an iteration ended (up to a second or two).
READ = 4


def read_some(dataset):
    """The first READ elements, in order (one worker: each mode yields the source's order)."""
    return [int(e) for e in dataset.take(READ)]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """One worker each, so that what a case reads is the same elements in the same order through
    both services; fault-tolerant dispatchers (distributed_save needs one). TensorFlow's run in a
    process of their own (stopped in this one, a worker waits for the coordinated reads left in
    flight and holds the GIL meanwhile: a minute or two of CI), except for "tensorflow-local", a
    dispatcher and worker in this process for the cases that read from a worker here."""
    work = tmp_path_factory.mktemp("differential")
    # Heartbeats as often as ours (TensorFlow's default is 30 s): its workers learn of
    # distributed_save's streams on a heartbeat.
    tf_options = {"dispatcher": {"work_dir": str(work / "tf"), "fault_tolerant_mode": True}}
    with tensorflow_servers(1, **tf_options, worker={"heartbeat_interval_ms": 1000}) as tf_target:
        tf_dispatcher = TF.DispatchServer()
        tf_workers = [TF.WorkerServer(TF.WorkerConfig(dispatcher_address=tf_dispatcher.target.split("://")[1]))]
        ours = in_process_cluster(1, work_dir=str(work / "ours"), fault_tolerant_mode=True)
        try:
            yield {"tensorflow": tf_target, "tensorflow-local": tf_dispatcher.target, "dataservice": ours.target}
        finally:
            stop_tensorflow_servers([*tf_workers, tf_dispatcher])
            ours.stop()


def _reads_a_local_worker(kwargs: dict) -> bool:
    """Whether a distribute() case reads only from a worker in the client's process."""
    return kwargs.get("data_transfer_protocol") == "local" or kwargs.get("target_workers") == "LOCAL"


# Where we answer differently from TensorFlow on purpose: (case id) -> (TensorFlow's outcome,
# ours, why). The test checks these too, so a change on either side shows.
EARLY = "ours checks the argument before any RPC and raises ValueError naming it; TensorFlow fails at the first element"
LENIENT = "TensorFlow accepts the value without a check"
KNOWN_DIFFERENCES = {
    # TensorFlow takes any object whose trainer_id it can serialize; a string is not a CrossTrainerCache.
    "distribute:cross_trainer_cache='trainer'": ("AttributeError", "ValueError", "a clear message"),
    "distribute:consumer_index=2": ("FailedPreconditionError", "ValueError", EARLY),
    "distribute:max_outstanding_requests=-5": ("InvalidArgumentError", "ValueError", EARLY),
    "distribute:max_outstanding_requests=0": ("InvalidArgumentError", "ValueError", EARLY),
    "distribute:data_transfer_protocol='bogus'": ("NotFoundError", "ValueError", EARLY),
    "distribute:data_transfer_protocol=3": ("TypeError", "ValueError", "one type of error for every bad value"),
    "distribute:target_workers='bogus'": ("InvalidArgumentError", "ValueError", EARLY),
    # TensorFlow's check `consumer_index is None != num_consumers is None` is a chained comparison
    # that never holds, so a consumer_index alone is ignored; ours refuses it.
    "distribute:consumer_index=0": ("ok", "ValueError", LENIENT),
    "register_dataset:dataset_id=7": ("TypeError", "ok", "an integer id is taken as its string, as ids print"),
    "register_dataset:dataset=list": ("AttributeError", "TypeError", "a clear message"),
    "register_dataset:service='http://x:1'": ("NotFoundError", "ValueError", EARLY),
}

FINITE = lambda: tf.data.Dataset.range(12)  # noqa: E731
INFINITE = lambda: tf.data.Dataset.range(12).repeat()  # noqa: E731


def _distribute_cases():
    """(id, kwargs, infinite dataset?, elements to read)."""
    cases = []

    def add(name, value, infinite=False, **more):
        cases.append((f"distribute:{name}={value!r}", {name: value, **more}, infinite))

    for value in ("parallel_epochs", "distributed_epoch", "PARALLEL_EPOCHS", "bogus", 1, None):
        add("processing_mode", value)
    for value in (None, "job", "", 7):
        add("job_name", value)
    # Coordinated reads' argument errors (a valid coordinated read is compared in
    # test_shared_jobs.py: one with a single consumer waits on TensorFlow's round robin here).
    # (consumer_index=-1 aborts TensorFlow's process: a CHECK in its client; ours raises ValueError.)
    for index, count in ((2, 2),):
        add("consumer_index", index, infinite=True, num_consumers=count, job_name=f"coordinated{index}{count}")
    add("consumer_index", 0, infinite=True)  # without num_consumers
    add("num_consumers", 2, infinite=True)  # without consumer_index
    add("num_consumers", 1, infinite=True, consumer_index=0)  # without job_name
    for value in (None, 1, 16, -1, 0, -5):
        add("max_outstanding_requests", value)
    for value in (None, "grpc", "local", "bogus", 3):
        add("data_transfer_protocol", value)
    for value in ("AUTO", "ANY", "LOCAL", "any", "bogus", None):
        add("target_workers", value)
    for value in ("grpc://localhost:1://x", "", 5):
        add("service", value)
    add("cross_trainer_cache", "trainer", infinite=True, job_name="ctc_string")
    for infinite, job_name in ((True, "ctc"), (True, None), (False, "ctc_finite")):
        cases.append(
            (
                f"distribute:cross_trainer_cache(infinite={infinite}, job_name={job_name!r})",
                {"job_name": job_name, "cross_trainer_cache": "CrossTrainerCache"},
                infinite,
            )
        )
    return cases


@pytest.mark.parametrize("case_id, kwargs, infinite", _distribute_cases(), ids=lambda v: str(v)[:60])
def test_distribute_arguments(case_id, kwargs, infinite, clusters):
    def run(system):
        module = SYSTEMS[system]
        args = dict(kwargs)
        cluster = "tensorflow-local" if system == "tensorflow" and _reads_a_local_worker(kwargs) else system
        target = args.pop("service", clusters[cluster])
        args.setdefault("processing_mode", "parallel_epochs")
        if args.get("cross_trainer_cache") == "CrossTrainerCache":
            args["cross_trainer_cache"] = module.CrossTrainerCache(trainer_id="t1")
        if "job_name" in args and args["job_name"] not in (None, "", 7):
            args["job_name"] = f"{args['job_name']}_{system}_{time.monotonic_ns()}"
        source = INFINITE() if infinite else FINITE()
        return read_some(source.apply(module.distribute(service=target, **args)))

    compare(case_id, outcome(lambda: run("tensorflow")), outcome(lambda: run("dataservice")))


def compare(case_id, theirs, mine):
    if case_id in KNOWN_DIFFERENCES:
        their_type, our_type, _ = KNOWN_DIFFERENCES[case_id]
        assert (theirs[0], mine[0]) == (their_type, our_type), (theirs, mine)
        return
    assert mine[0] == theirs[0], (theirs, mine)
    assert mine[1] == theirs[1]
    if isinstance(mine[1], list):  # what a read gave: the source's first elements
        assert mine[1] == list(range(READ))


def _register_cases():
    return [
        ("register_dataset:compression=None", {"compression": None}),
        ("register_dataset:compression='LZ4'", {"compression": "LZ4"}),
        ("register_dataset:dataset_id='named'", {"dataset_id": "named"}),
        ("register_dataset:dataset_id=7", {"dataset_id": 7}),
        ("register_dataset:dataset_id=''", {"dataset_id": ""}),
        ("register_dataset:dataset=list", {"dataset": [1, 2]}),
        ("register_dataset:service=''", {"service": ""}),
        ("register_dataset:service='http://x:1'", {"service": "http://x:1"}),
    ]


@pytest.mark.parametrize("case_id, kwargs", _register_cases(), ids=lambda v: str(v)[:50])
def test_register_dataset_arguments(case_id, kwargs, clusters):
    def run(system):
        module = SYSTEMS[system]
        args = {"service": clusters[system], "dataset": FINITE(), **kwargs}
        dataset_id = module.register_dataset(**args)
        return dataset_id.dtype.name

    compare(case_id, outcome(lambda: run("tensorflow")), outcome(lambda: run("dataservice")))


def _from_dataset_id_cases():
    spec = tf.TensorSpec([], tf.int64)
    return [
        ("from_dataset_id:element_spec=None", {}),
        ("from_dataset_id:element_spec=spec", {"element_spec": spec}),
        ("from_dataset_id:dataset_id=unknown", {"dataset_id": "no-such-id", "element_spec": spec}),
        ("from_dataset_id:processing_mode='distributed_epoch'", {"processing_mode": "distributed_epoch"}),
        ("from_dataset_id:job_name='shared'", {"job_name": "shared"}),
        ("from_dataset_id:max_outstanding_requests=2", {"max_outstanding_requests": 2}),
        ("from_dataset_id:target_workers='ANY'", {"target_workers": "ANY"}),
        ("from_dataset_id:data_transfer_protocol='grpc'", {"data_transfer_protocol": "grpc"}),
    ]


@pytest.mark.parametrize("case_id, kwargs", _from_dataset_id_cases(), ids=lambda v: str(v)[:50])
def test_from_dataset_id_arguments(case_id, kwargs, clusters):
    def run(system):
        module, target = SYSTEMS[system], clusters[system]
        args = {"processing_mode": "parallel_epochs", "service": target, **kwargs}
        if "dataset_id" not in args:
            args["dataset_id"] = module.register_dataset(target, FINITE())
        if "job_name" in args:
            args["job_name"] = f"{args['job_name']}_{system}"
        return read_some(module.from_dataset_id(**args))

    compare(case_id, outcome(lambda: run("tensorflow")), outcome(lambda: run("dataservice")))


def _config_cases():
    cases = []
    for name, values in {
        "port": [0, -1, "x"],
        "protocol": ["grpc", None, "bogus"],
        "work_dir": [None, "WORK_DIR"],
        "fault_tolerant_mode": [False, True],
        "worker_addresses": [None, ["localhost:1"]],
        "job_gc_check_interval_ms": [None, 0, 1000, -2],
        "job_gc_timeout_ms": [None, 0, -1, 1000],
        "worker_timeout_ms": [None, 0, 1000],
        "worker_max_concurrent_snapshots": [0, 2],
    }.items():
        cases += [(f"DispatcherConfig:{name}={value!r}", "DispatcherConfig", {name: value}) for value in values]
    for name, values in {
        "worker_address": [None, "localhost:%port%"],
        "port": [0, -1],
        "protocol": ["grpc", None, "bogus"],
        "heartbeat_interval_ms": [None, 0, 500, -3],
        "dispatcher_timeout_ms": [None, 0, 5000],
        "data_transfer_protocol": [None, "grpc", "local"],
        "data_transfer_address": [None, "localhost:%dts_port%"],
    }.items():
        cases += [(f"WorkerConfig:{name}={value!r}", "WorkerConfig", {name: value}) for value in values]
    return cases


CONFIG_DIFFERENCES = {
    "DispatcherConfig:port=-1": ("RuntimeError", "ValueError", "checked when the config is built"),
    "DispatcherConfig:port='x'": ("TypeError", "ValueError", "checked when the config is built"),
    "DispatcherConfig:protocol='bogus'": ("crashed|RuntimeError", "ValueError", "TensorFlow's server segfaults"),
    "DispatcherConfig:job_gc_check_interval_ms=-2": ("ok", "ValueError", "a negative interval is refused"),
    "WorkerConfig:port=-1": ("RuntimeError", "ValueError", "checked when the config is built"),
    # TensorFlow's worker segfaults, or (run to run, as its threads start) fails with a RuntimeError.
    "WorkerConfig:protocol='bogus'": ("crashed|RuntimeError", "ValueError", "TensorFlow's server segfaults"),
    "WorkerConfig:heartbeat_interval_ms=-3": ("ok", "ValueError", "a negative interval is refused"),
}


_TF_CONFIGS = """
import json, sys, tempfile
import tensorflow as tf
S = tf.data.experimental.service
dispatcher = S.DispatchServer()
address = dispatcher.target.split("://")[1]
for line in sys.stdin:
    case_id, config, fields = json.loads(line)
    fields = {k: (tempfile.mkdtemp() if v == "WORK_DIR" else v) for k, v in fields.items()}
    try:
        if config == "DispatcherConfig":
            S.DispatchServer(S.DispatcherConfig(**fields))._stop()
        else:
            S.WorkerServer(S.WorkerConfig(dispatcher_address=address, **fields))._stop()
        result = "ok"
    except Exception as e:
        result = type(e).__name__
    print(json.dumps([case_id, result]), flush=True)
"""


@pytest.fixture(scope="module")
def tensorflow_config_outcomes():
    """Each case's outcome with TensorFlow's servers, in a process of their own (a server that
    TensorFlow fails to start can take its process down)."""
    import json
    import subprocess
    import sys

    remaining = list(_config_cases())
    outcomes = {}
    while remaining:
        result = subprocess.run(
            [sys.executable, "-c", _TF_CONFIGS],
            input="".join(json.dumps(case) + "\n" for case in remaining),
            capture_output=True,
            text=True,
            timeout=240,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        done = dict(json.loads(line) for line in result.stdout.splitlines() if line.startswith("["))
        outcomes.update(done)
        remaining = remaining[len(done) :]
        if remaining and result.returncode != 0:
            # The case after the last answered one took the process down.
            outcomes[remaining.pop(0)[0]] = "crashed"
    return outcomes


@pytest.mark.parametrize("case_id, config, fields", _config_cases(), ids=lambda v: str(v)[:50])
def test_config_fields(case_id, config, fields, clusters, tmp_path, tensorflow_config_outcomes):
    """Builds the config with the field, starts its server and stops it."""
    theirs = tensorflow_config_outcomes.get(case_id, "TensorFlow's process died")

    def run():
        values = {k: (str(tmp_path) if v == "WORK_DIR" else v) for k, v in fields.items()}
        if config == "DispatcherConfig":
            service.DispatchServer(service.DispatcherConfig(**values)).stop()
        else:
            address = clusters["dataservice"].split("://")[1]
            service.WorkerServer(service.WorkerConfig(dispatcher_address=address, **values)).stop()

    mine = outcome(run)[0]
    if case_id in CONFIG_DIFFERENCES:
        expected_theirs, expected_mine = CONFIG_DIFFERENCES[case_id][:2]
        assert theirs in expected_theirs.split("|") and mine == expected_mine, (theirs, mine)
    else:
        assert mine == theirs


def test_cross_trainer_cache_scenario(clusters):
    """Two trainers of one job read the same first elements; a third with the first one's id
    reads on from where that one stopped: the same in both services."""

    def run(system):
        module, target = SYSTEMS[system], clusters[system]
        job = f"ctc_scenario_{system}"

        def trainer(trainer_id):
            cache = module.CrossTrainerCache(trainer_id=trainer_id)
            ds = (
                tf.data.Dataset.range(10**9)
                .repeat()
                .apply(module.distribute("parallel_epochs", target, job_name=job, cross_trainer_cache=cache))
            )
            return [int(x) for x in ds.take(10)]

        first, second, again = trainer("a"), trainer("b"), trainer("a")
        # (the second trainer reads what the first did, the first one's id reads on past it)
        return bool(set(second) & set(first)), sorted(again) != sorted(first)

    assert run("dataservice") == run("tensorflow") == (True, True)


def test_distributed_save_then_load(clusters, tmp_path):
    """Each service saves the same dataset; TensorFlow loads both to the same elements."""
    dataset = tf.data.Dataset.range(500).map(lambda x: {"x": x, "s": tf.strings.as_string(x)})
    loaded = {}
    for system, module in (("tensorflow", tf.data.experimental), ("dataservice", service)):
        path = str(tmp_path / system)
        module.distributed_save(dataset, path, clusters[system].split("://")[1])
        loaded[system] = sorted(
            (int(e["x"]), bytes(e["s"])) for e in tf.data.Dataset.load(path, wait=True).as_numpy_iterator()
        )
    assert loaded["dataservice"] == loaded["tensorflow"] == [(x, str(x).encode()) for x in range(500)]
    errors = {
        system: outcome(
            lambda m=module, s=system: m.distributed_save(dataset, str(tmp_path / s), clusters[s].split("://")[1])
        )[0]
        for system, module in (("tensorflow", tf.data.experimental), ("dataservice", service))
    }
    assert errors["dataservice"] == errors["tensorflow"] == "AlreadyExistsError"
