"""The example configs and Kubernetes manifests in deploy/ are accepted by data-server."""

import glob
import os

import pytest
import yaml
from conftest import REPO_ROOT

from dataservice import cli
from dataservice.monitoring.health import LIVENESS_SERVICE

DEPLOY = os.path.join(REPO_ROOT, "deploy")


def _config(args):
    return cli.build_config(cli._parser().parse_args(args))


@pytest.mark.parametrize("role", ["dispatcher", "worker"])
def test_example_configs_load(role):
    config = _config([f"--role={role}", f"--config={os.path.join(DEPLOY, 'config', role + '.yaml')}"])
    assert config.port in (5050, 5051)


def _container_args():
    for path in sorted(glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc and doc.get("kind") in ("StatefulSet", "Deployment"):
                    for container in doc["spec"]["template"]["spec"]["containers"]:
                        yield os.path.basename(path), container["args"]


@pytest.mark.parametrize("name, args", list(_container_args()))
def test_manifest_args_are_valid_flags(name, args):
    config = _config([a.replace("$(POD_IP)", "10.0.0.7") for a in args])
    assert config.port in (5050, 5051)


def test_dockerfile_runs_data_server():
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = f.read()
    assert 'ENTRYPOINT ["data-server"]' in text and "pip install" in text


def _documents():
    for path in sorted(glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml"))):
        with open(path) as f:
            yield from (doc for doc in yaml.safe_load_all(f) if doc)


def _containers():
    for doc in _documents():
        if doc["kind"] in ("StatefulSet", "Deployment"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield doc, container


@pytest.mark.parametrize("doc, container", list(_containers()), ids=lambda v: v.get("name", "") if "name" in v else "")
def test_probes_use_grpc_health_and_metrics_are_scraped(doc, container):
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = _config([a.replace("$(POD_IP)", "10.0.0.7") for a in container["args"]])
    assert container["readinessProbe"]["grpc"] == {"port": config.port}
    assert container["livenessProbe"]["grpc"] == {"port": config.port, "service": LIVENESS_SERVICE}
    assert ports["monitoring"] == config.monitoring_port
    annotations = doc["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == config.monitoring_port


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
    from prometheus_client import generate_latest
    from test_dispatcher_core import FakeClock, RecordingNotifier, heartbeat, make_core, register, start_iteration

    from dataservice.monitoring import metrics

    core = make_core(FakeClock(), RecordingNotifier())
    heartbeat(core, "w1:1")
    start_iteration(core, register(core, tf.data.Dataset.range(5)), job_name="train")
    text = generate_latest(metrics.new_registry(metrics.DispatcherCollector(core.status))).decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
