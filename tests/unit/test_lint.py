"""ruff's lint and format check pass on the whole repository (the rules are in pyproject.toml)."""

import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    ruff = shutil.which("ruff") or pytest.fail("ruff is not installed: pip install -e '.[test]'")
    result = subprocess.run([ruff, *command, REPO_ROOT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (
        f"ruff {' '.join(command)} failed ({sys.executable}):\n{result.stdout}{result.stderr}"
    )
