"""The dispatcher imports no TensorFlow to start and serve: only dataset admission and starting
a distributed_save need it, imported when first used or on a thread once the server is up
(dispatcher/core.py's docstring)."""

import subprocess
import sys

from conftest import REPO_ROOT

PURE_DISPATCHER_MODULES = [
    "dataservice.dispatcher.context",
    "dataservice.dispatcher.state",
    "dataservice.dispatcher.split_handout",
    "dataservice.dispatcher.rounds",
    "dataservice.dispatcher.liveness",
    "dataservice.dispatcher.resume",
    "dataservice.dispatcher.task_changes",
    "dataservice.dispatcher.load",
    "dataservice.dispatcher.journal",
    "dataservice.dispatcher.snapshots",
    "dataservice.dispatcher.status_report",
    "dataservice.dispatcher.core",
    "dataservice.dispatcher.dispatch_server",
]


def test_the_dispatchers_deciding_parts_import_no_tensorflow():
    # In a fresh interpreter where importing tensorflow fails (None in sys.modules).
    script = "import sys\nsys.modules['tensorflow'] = None\n" + "".join(
        f"import {module}\n" for module in PURE_DISPATCHER_MODULES
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"a module imported tensorflow:\n{result.stderr}"
