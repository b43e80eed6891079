"""Our programs' output without TensorFlow's log lines.

TensorFlow's C++ logs (oneDNN notices, CUDA stubs and a failed cuInit on a
machine without a GPU, CPU feature hints) go to stderr, in between what
`data-server` and the demo print. TF_CPP_MIN_LOG_LEVEL filters those logged
once TensorFlow runs, but not those its libraries log while they load. So a
program calls quiet_tensorflow() before anything imports TensorFlow (the
package's public names load lazily for that reason): it sets the level and
imports TensorFlow with the process's stderr pointed at /dev/null. Where
TF_CPP_MIN_LOG_LEVEL is set already (0 shows everything), it does neither.

The dispatcher serves before it has imported TensorFlow: `data-server
--role=dispatcher` moves Python's sys.stderr to a copy of the descriptor
(python_stderr_apart) and imports TensorFlow on a thread
(quiet_tensorflow_in_background), so that its own log lines still show
while TensorFlow's loading lines are discarded.
"""

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

# 3: none of TensorFlow's C++ INFO, WARNING or ERROR lines (errors that matter reach our own
# logs and messages as exceptions).
QUIET_LEVEL = "3"
_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"


@contextlib.contextmanager
def _stderr_discarded() -> Iterator[None]:
    """File descriptor 2 on /dev/null (where C++ writes), restored afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def quiet_tensorflow(importing: threading.Event | None = None) -> None:
    """Imports TensorFlow quietly (see the module docstring); sets `importing` once the import
    has begun (or is not needed), from when any other import of TensorFlow waits for this one."""
    if _LEVEL_ENV in os.environ or "tensorflow" in sys.modules:
        if importing is not None:
            importing.set()
        return
    os.environ[_LEVEL_ENV] = QUIET_LEVEL
    with _stderr_discarded():
        if importing is not None:
            importing.set()
        import tensorflow  # noqa: F401 - loaded here, its start-up lines discarded


def python_stderr_apart() -> None:
    """Points sys.stderr (Python's logs and tracebacks) at a copy of descriptor 2, so that it
    still shows while a thread has descriptor 2 itself on /dev/null (quiet_tensorflow)."""
    sys.stderr.flush()
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)


def quiet_tensorflow_in_background() -> threading.Thread:
    """quiet_tensorflow() on a thread of its own; returns once that import has begun, so that
    the process's other imports of TensorFlow wait for it rather than print its loading lines.
    Call python_stderr_apart() first, or Python's own output is discarded meanwhile."""
    importing = threading.Event()
    thread = threading.Thread(target=quiet_tensorflow, args=(importing,), name="import-tensorflow", daemon=True)
    thread.start()
    importing.wait()
    return thread
