"""`python -m dataservice.bench --quick` completes and writes its table (a smoke run: no speed is asserted).

CI leaves out the workloads that need a second worker per service (3, 4 and 15: starting those
worker processes and measuring on them took a third of the smoke run's minute); `--bench-all`
runs every workload, as `python -m dataservice.bench --quick` does."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from dataservice.bench.workloads import ALL_WORKLOADS, TWO_WORKER_WORKLOADS


@pytest.mark.timeout(900)
def test_quick_bench_completes(tmp_path, pytestconfig):
    out = tmp_path / "bench.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    workloads = set(ALL_WORKLOADS)
    if not pytestconfig.getoption("--bench-all"):
        workloads -= TWO_WORKER_WORKLOADS
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dataservice.bench",
            "--quick",
            "--json",
            str(out),
            "--workloads",
            ",".join(map(str, sorted(workloads))),
        ],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=REPO_ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {row["workload"].split(".")[0] for row in rows} == {str(w) for w in workloads}
    tls_rows = [row for row in rows if row["workload"].startswith("9.")]
    assert len(tls_rows) == 2 and all(row["values"]["tls"] > 0 for row in tls_rows)
    compared = [row for row in rows if "tf.data service" in row["values"]]
    assert compared and all(row["values"]["dataservice"] > 0 for row in compared)
