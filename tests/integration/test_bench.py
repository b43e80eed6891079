"""`python -m dataservice.bench --quick` completes and writes its table (a smoke run: no speed is asserted)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT


@pytest.mark.timeout(900)
def test_quick_bench_completes(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-m", "dataservice.bench", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=REPO_ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    workloads = {row["workload"].split(".")[0] for row in rows}
    assert workloads == {str(w) for w in range(1, 17)}
    tls_rows = [row for row in rows if row["workload"].startswith("9.")]
    assert len(tls_rows) == 2 and all(row["values"]["tls"] > 0 for row in tls_rows)
    compared = [row for row in rows if "tf.data service" in row["values"]]
    assert compared and all(row["values"]["dataservice"] > 0 for row in compared)
