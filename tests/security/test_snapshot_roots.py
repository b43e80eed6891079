"""distributed_save confined to the dispatcher's snapshot_roots, attacked by a client holding
the token of a TLS cluster of `data-server` processes: saves outside the roots, through `..`,
and through a symlink under a root that points elsewhere are PERMISSION_DENIED and create
nothing; a save under a root is written (by a worker whose sandbox covers the root) and
loads back whole."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf
from conftest import wait_until

import dataservice


def _save(secure_cluster, path: str) -> None:
    dataservice.distributed_save(tf.data.Dataset.range(100), path, secure_cluster.target)


def test_saves_outside_the_snapshot_roots_are_refused(secure_cluster, tmp_path):
    outside = tmp_path / "elsewhere"
    link = os.path.join(secure_cluster.snapshots_dir, "link-out")
    if not os.path.lexists(link):
        os.symlink(str(tmp_path), link)
    for path in (
        str(outside / "save"),
        os.path.join(secure_cluster.snapshots_dir, "..", "escaped"),
        os.path.join(link, "through-link"),
        secure_cluster.snapshots_dir,
    ):
        with pytest.raises(tf.errors.PermissionDeniedError, match="snapshot_roots"):
            _save(secure_cluster, path)
    assert not outside.exists() and not (tmp_path / "through-link").exists()
    assert not os.path.exists(os.path.join(os.path.dirname(secure_cluster.snapshots_dir), "escaped"))


def test_a_save_under_a_root_is_written_and_loads_back(secure_cluster):
    path = os.path.join(secure_cluster.snapshots_dir, "good")
    _save(secure_cluster, path)
    wait_until(
        lambda: os.path.exists(os.path.join(path, "DONE")) or os.path.exists(os.path.join(path, "ERROR")),
        "the save to finish",
        timeout_s=90,
    )
    assert not os.path.exists(os.path.join(path, "ERROR")), open(os.path.join(path, "ERROR")).read()
    assert sorted(tf.data.Dataset.load(path).as_numpy_iterator()) == list(range(100))
