"""ruff's lint and format check pass on the whole repository, and mypy on the packages
pyproject.toml names (the rules and the packages are there)."""

import importlib.util
import subprocess
import sys

import pytest
from conftest import REPO_ROOT


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    # Through this interpreter: a fresh pyenv or venv may not have the `ruff` command on PATH yet.
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, REPO_ROOT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"ruff {' '.join(command)} failed:\n{result.stdout}{result.stderr}"


def test_mypy():
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e '.[test]'")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert result.returncode == 0, f"mypy failed:\n{result.stdout}{result.stderr}"
