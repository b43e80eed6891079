"""The example configs and Kubernetes manifests in deploy/: accepted by data-server, valid for
Kubernetes (kubernetes-validate --strict), secured (non-root, read-only root filesystem, TLS and
token from Secrets, a NetworkPolicy), probed and scraped, and autoscaled on a metric the
dispatcher exports."""

import glob
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO_ROOT

from dataservice import cli

DEPLOY = os.path.join(REPO_ROOT, "deploy")
MANIFESTS = sorted(glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml")))


def _config(args):
    return cli.build_config(cli._parser().parse_args(args))


@pytest.mark.parametrize("role", ["dispatcher", "worker"])
def test_example_configs_load(role):
    config = _config([f"--role={role}", f"--config={os.path.join(DEPLOY, 'config', role + '.yaml')}"])
    assert config.port in (5050, 5051)


def test_manifests_pass_kubernetes_validate_strict():
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", *MANIFESTS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _documents():
    for path in MANIFESTS:
        with open(path) as f:
            yield from (doc for doc in yaml.safe_load_all(f) if doc)


def _containers():
    for doc in _documents():
        if doc["kind"] in ("StatefulSet", "Deployment"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield doc, container


CONTAINERS = list(_containers())
IDS = [container["name"] for _, container in CONTAINERS]


@pytest.fixture(scope="module")
def secret_files(tmp_path_factory):
    """The Secrets' files as the pods see them, made here: certificates and a token."""
    from dataservice.bench.certificates import make_certificates

    directory = tmp_path_factory.mktemp("secrets")
    certs = make_certificates(str(directory))
    token = directory / "token"
    token.write_text("token-for-the-test")
    worker_token = directory / "worker-token"
    worker_token.write_text("servers-token-for-the-test")
    return {
        "/etc/dataservice/tls/tls.crt": certs.server_cert_file,
        "/etc/dataservice/tls/tls.key": certs.server_key_file,
        "/etc/dataservice/tls/ca.crt": certs.ca_file,
        "/etc/dataservice/token/token": str(token),
        "/etc/dataservice/worker-token/token": str(worker_token),
    }


def _args(container, secret_files):
    args = []
    for arg in container["args"]:
        arg = arg.replace("$(POD_IP)", "10.0.0.7").replace("$(POD_NAME)", "dataservice-worker-abc")
        for mounted, local in secret_files.items():
            arg = arg.replace(mounted, local)
        args.append(arg)
    return args


@pytest.mark.parametrize("doc, container", CONTAINERS, ids=IDS)
def test_manifest_args_are_valid_flags(doc, container, secret_files):
    config = _config(_args(container, secret_files))
    assert config.port in (5050, 5051)
    assert config.protocol == "grpc+tls" and config.auth_token_file and config.monitoring_port == 8080
    # Separate credentials for clients and for the servers; workers sandboxed to their data.
    assert config.worker_token_file and config.worker_token_file != config.auth_token_file
    if config.port == 5051:
        assert config.data_roots == ("/data",)


@pytest.mark.parametrize("doc, container", CONTAINERS, ids=IDS)
def test_pods_run_non_root_read_only_with_secrets_mounted(doc, container):
    pod = doc["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert set(secrets.values()) == {"dataservice-tls", "dataservice-auth-token", "dataservice-worker-token"}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for arg in container["args"]:
        if arg.startswith(("--tls_", "--auth_token_file", "--worker_token_file")):
            path = arg.split("=", 1)[1]
            mount = os.path.dirname(path)
            assert mounts.get(mount) in secrets, f"{arg} is not under a Secret's mount"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert os.path.dirname(env["DATASERVICE_TLS_CA_FILE"]) in mounts


@pytest.mark.parametrize("doc, container", CONTAINERS, ids=IDS)
def test_probes_and_metrics_on_the_monitoring_port(doc, container, secret_files):
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = _config(_args(container, secret_files))
    assert ports["monitoring"] == config.monitoring_port
    # Kubernetes' gRPC probes speak no TLS: the servers answer the same states over HTTP.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "monitoring"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "monitoring"}
    annotations = doc["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == config.monitoring_port


def test_network_policy_admits_trainers_to_every_served_port():
    docs = list(_documents())
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app": "dataservice"}
    rules = policy["spec"]["ingress"]
    trainer_rule = next(
        r for r in rules if {"podSelector": {"matchLabels": {"dataservice-client": "true"}}} in r["from"]
    )
    allowed = {p["port"] for p in trainer_rule["ports"]}
    served = {p["containerPort"] for _, c in CONTAINERS for p in c["ports"] if p["name"] != "monitoring"}
    assert allowed == served
    monitoring = {p["port"] for r in rules if r is not trainer_rule for p in r["ports"]}
    assert monitoring == {8080}


def test_dockerfile_runs_data_server_as_non_root():
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = f.read()
    assert 'ENTRYPOINT ["data-server"]' in text and "pip install" in text
    assert "USER dataservice" in text


def test_autoscaler_scales_the_workers_on_a_metric_the_dispatcher_exports():
    docs = list(_documents())
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    (workers,) = [d for d in docs if d["kind"] == "Deployment"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == workers["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    (adapter,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]
    assert rule["name"]["as"] == metric["external"]["metric"]["name"]
    # The series the rule reads is one the dispatcher exports for a job with an active iteration.
    exported = _exported_metric_names()
    assert rule["seriesQuery"].strip("'") in exported
    assert rule["seriesQuery"].strip("'") in rule["metricsQuery"]


def _exported_metric_names():
    import tensorflow as tf
    from dispatcher_helpers import FakeClock, RecordingNotifier, heartbeat, make_core, register, start_iteration
    from prometheus_client import generate_latest

    from dataservice.monitoring import metrics

    core = make_core(FakeClock(), RecordingNotifier())
    heartbeat(core, "w1:1")
    start_iteration(core, register(core, tf.data.Dataset.range(5)), job_name="train")
    text = generate_latest(metrics.new_registry(metrics.DispatcherCollector(core.status))).decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
