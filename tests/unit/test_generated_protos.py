"""The committed dataservice/v1 modules are what proto/generate.py makes from proto/."""

import filecmp
import os
import subprocess
import sys

from conftest import REPO_ROOT


def test_generated_modules_are_current(tmp_path):
    # protoc runs in its own process: loaded beside TensorFlow's protobuf it crashes.
    subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "proto", "generate.py"), str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    generated_dir = tmp_path / "dataservice" / "v1"
    committed_dir = os.path.join(REPO_ROOT, "dataservice", "v1")
    names = sorted(n for n in os.listdir(generated_dir) if n.endswith((".py", ".pyi")))
    committed = sorted(n for n in os.listdir(committed_dir) if n.endswith((".py", ".pyi")))
    assert names == committed, "run: python proto/generate.py"
    stale = [n for n in names if not filecmp.cmp(generated_dir / n, os.path.join(committed_dir, n), shallow=False)]
    assert not stale, f"stale generated modules {stale}: run python proto/generate.py"
