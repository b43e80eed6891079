"""The example configs and Kubernetes manifests in deploy/ are accepted by data-server."""

import glob
import os

import pytest
import yaml
from conftest import REPO_ROOT

from dataservice import cli

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
