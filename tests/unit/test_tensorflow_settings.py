"""A worker's settings for TensorFlow (worker/tensorflow_settings.py), checked on TensorFlow itself
in fresh processes: it reads them once, on import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import run_with_grappler_log

from dataservice.worker import tensorflow_settings

_PROBE = """
from dataservice.worker import tensorflow_settings
tensorflow_settings.leave_out_onednn_rewrites()
from tensorflow.python.util import _pywrap_util_port
print(_pywrap_util_port.IsMklEnabled())
"""


def _onednn_enabled_after_settings(preset: str | None) -> bool:
    env = {k: v for k, v in os.environ.items() if k != tensorflow_settings.ONEDNN_ENV}
    if preset is not None:
        env[tensorflow_settings.ONEDNN_ENV] = preset
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.timeout(300)
def test_onednn_rewrites_are_off_unless_the_environment_keeps_them():
    assert not _onednn_enabled_after_settings(None)
    assert _onednn_enabled_after_settings("1")


def test_an_explicit_setting_is_left_as_it_is():
    environ: dict[str, str] = {}
    assert tensorflow_settings.leave_out_onednn_rewrites(environ)
    assert environ == {tensorflow_settings.ONEDNN_ENV: "0"}
    kept = {tensorflow_settings.ONEDNN_ENV: "1"}
    assert not tensorflow_settings.leave_out_onednn_rewrites(kept)
    assert kept == {tensorflow_settings.ONEDNN_ENV: "1"}


_TFG_PROBE = """
import sys
import tensorflow as tf
from dataservice.worker import tensorflow_settings
if sys.argv[1] == "leave-out":
    assert tensorflow_settings.leave_out_tfg_function_pass()
options = tf.data.Options()  # no rewrites of the pipeline's graph: what is optimized is its function
options.experimental_optimization.apply_default_optimizations = False
options.autotune.enabled = False
dataset = tf.data.Dataset.range(4).map(lambda x: x * 2).with_options(options)
print("READ", flush=True)
assert [int(x) for x in dataset] == [0, 2, 4, 6]
assert not tensorflow_settings.leave_out_tfg_function_pass(), "too late once TensorFlow has run an op"
"""


def _tfg_runs_on_a_function(*args: str) -> int:
    out = run_with_grappler_log(_TFG_PROBE, *args)
    after = out.split("READ", 1)[1]
    assert "Starting optimization for grappler item: __inference_Dataset_map" in after, after[-2000:]
    return after.count("tfg_optimizer")


@pytest.mark.timeout(300)
def test_the_tfg_hook_is_left_out_of_the_functions_a_worker_instantiates():
    assert _tfg_runs_on_a_function("keep") > 0
    assert _tfg_runs_on_a_function("leave-out") == 0
