"""Settings a worker process gives TensorFlow before it runs a pipeline.

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

Every function instantiation also runs Grappler over the function, and in
it the TFG hook: an MLIR import of the function, shape inference, an export.
For a worker that is again once per function of every task, where a local
loop pays it once an epoch, and it was most of Grappler's time there. The
other Grappler passes, which rewrite the function, still run; the hook only
annotates shapes for them. A worker leaves it out
(leave_out_tfg_function_pass), which TensorFlow allows only before it runs
its first op.
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


def leave_out_tfg_function_pass() -> bool:
    """Leaves Grappler's TFG hook out of the optimization of the functions this process
    instantiates (tf_internal.leave_out_tfg_function_pass); call it after importing TensorFlow
    and before the first op. Returns whether that was still possible."""
    from dataservice import tf_internal

    return tf_internal.leave_out_tfg_function_pass()
