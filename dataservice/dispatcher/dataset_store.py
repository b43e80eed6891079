"""Where the dispatcher keeps registered dataset graphs.

Graphs can be large (a from_tensor_slices embeds its data), so they are kept
apart from the state: in memory, or, with a work_dir, one file per dataset
under <work_dir>/datasets/, written before the update that registers it.
"""

from __future__ import annotations

import pathlib
import threading

from dataservice import durable_files


class DatasetStore:
    def __init__(self, work_dir: str | None):
        self._dir = pathlib.Path(work_dir) / "datasets" if work_dir else None
        self._graphs: dict[str, bytes] = {}
        self._lock = threading.Lock()
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)

    def _path(self, dataset_id: str) -> pathlib.Path:
        assert self._dir is not None
        # Ids are user-chosen strings: hex-encode them into a safe file name.
        return self._dir / (dataset_id.encode().hex() + ".graphdef")

    def put(self, dataset_id: str, graph_def: bytes) -> None:
        """Stores the graph durably (file and directory fsynced) before returning: the journal
        record that names it follows."""
        if self._dir is not None:
            durable_files.write_durably(self._path(dataset_id), graph_def)
        with self._lock:
            self._graphs[dataset_id] = graph_def

    def get(self, dataset_id: str) -> bytes | None:
        with self._lock:
            graph = self._graphs.get(dataset_id)
        if graph is None and self._dir is not None:
            path = self._path(dataset_id)
            if path.exists():
                graph = path.read_bytes()
                with self._lock:
                    self._graphs[dataset_id] = graph
        return graph
