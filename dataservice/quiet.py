"""Our programs' output without TensorFlow's log lines.

TensorFlow's C++ logs (oneDNN notices, CUDA stubs and a failed cuInit on a
machine without a GPU, CPU feature hints) go to stderr, in between what
`data-server` and the demo print. TF_CPP_MIN_LOG_LEVEL filters those logged
once TensorFlow runs, but not those its libraries log while they load. So a
program calls quiet_tensorflow() before anything imports TensorFlow (the
package's public names load lazily for that reason): it sets the level and
imports TensorFlow with the process's stderr pointed at /dev/null. Where
TF_CPP_MIN_LOG_LEVEL is set already (0 shows everything), it does neither.
"""

import contextlib
import os
import sys
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


def quiet_tensorflow() -> None:
    if _LEVEL_ENV in os.environ or "tensorflow" in sys.modules:
        return
    os.environ[_LEVEL_ENV] = QUIET_LEVEL
    with _stderr_discarded():
        import tensorflow  # noqa: F401 - loaded here, its start-up lines discarded
