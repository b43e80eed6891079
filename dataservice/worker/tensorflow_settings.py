"""Settings a worker process gives TensorFlow before importing it.

TensorFlow built for x86 turns on its oneDNN graph rewrites by default
(TF_ENABLE_ONEDNN_OPTS). One of them, the layout pass, runs over every
function TensorFlow instantiates and asks the kernel registry about each node,
and tf.data instantiates a pipeline's functions afresh for every iterator. A
local training loop pays that once an epoch; a worker pays it for every task it
starts, on each worker, so in a job of short epochs it was the largest part of
a task's start (README, "Figures behind the defaults"). What the rewrites
speed up are large matrix products and convolutions, which input pipelines
seldom run. So `data-server --role=worker` turns them off unless the
environment already says otherwise: TF_ENABLE_ONEDNN_OPTS=1 keeps them (for a
pipeline that runs a model, say). Floating-point results of such ops may then
differ from a local run's in the last bits, as TensorFlow's own start-up notice
about oneDNN warns.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"


def leave_out_onednn_rewrites(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Sets TF_ENABLE_ONEDNN_OPTS=0 in `environ` unless it is set; returns whether it was set
    here. TensorFlow reads the variable once, on import: call this before importing it."""
    if ONEDNN_ENV in environ:
        return False
    environ[ONEDNN_ENV] = "0"
    return True
