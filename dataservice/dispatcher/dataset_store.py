"""Where the dispatcher keeps registered dataset graphs.

Graphs can be large (a from_tensor_slices embeds its data), so they are kept
apart from the state, and what they hold of memory is bounded by
graph_memory_bytes: with a work_dir, each graph is a file under
<work_dir>/datasets/, written before the update that registers it, and memory
holds only the graphs used last (read back from their files when needed
again); without a work_dir, memory is all there is, and a graph that would
take the store past the bound is refused (RESOURCE_EXHAUSTED) rather than
growing the dispatcher without limit.
"""

from __future__ import annotations

import collections
import pathlib
import threading

from dataservice import durable_files, status
from dataservice.config import DEFAULT_GRAPH_MEMORY_BYTES


class DatasetStore:
    def __init__(self, work_dir: str | None, memory_bytes: int = DEFAULT_GRAPH_MEMORY_BYTES):
        self._dir = pathlib.Path(work_dir) / "datasets" if work_dir else None
        self._memory_bytes = memory_bytes
        # dataset id -> graph, the least recently used first
        self._graphs: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._held = 0  # bytes of self._graphs
        self._lock = threading.Lock()
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)

    def _path(self, dataset_id: str) -> pathlib.Path:
        assert self._dir is not None
        # Ids are user-chosen strings: hex-encode them into a safe file name.
        return self._dir / (dataset_id.encode().hex() + ".graphdef")

    def put(self, dataset_id: str, graph_def: bytes) -> None:
        """Stores the graph durably (file and directory fsynced) before returning: the journal
        record that names it follows. Without a work_dir, raises status.ServiceError
        (RESOURCE_EXHAUSTED) when the graph does not fit in graph_memory_bytes."""
        if self._dir is None:
            with self._lock:
                if self._held + len(graph_def) > self._memory_bytes:
                    raise status.error(
                        status.Code.RESOURCE_EXHAUSTED,
                        f"the dispatcher holds {self._held:,} bytes of dataset graphs and this one "
                        f"({len(graph_def):,} bytes) would take it past graph_memory_bytes "
                        f"({self._memory_bytes:,}): run the dispatcher with a work_dir (graphs then live on "
                        "its disk) or raise graph_memory_bytes",
                    )
                self._graphs[dataset_id] = graph_def
                self._held += len(graph_def)
            return
        durable_files.write_durably(self._path(dataset_id), graph_def)
        self._cache(dataset_id, graph_def)

    def get(self, dataset_id: str) -> bytes | None:
        with self._lock:
            graph = self._graphs.get(dataset_id)
            if graph is not None:
                self._graphs.move_to_end(dataset_id)
                return graph
        if self._dir is None:
            return None
        path = self._path(dataset_id)
        if not path.exists():
            return None
        graph = path.read_bytes()
        self._cache(dataset_id, graph)
        return graph

    def _cache(self, dataset_id: str, graph_def: bytes) -> None:
        """Keeps a graph that is on disk in memory too, dropping the least recently used ones
        past graph_memory_bytes (a graph larger than that is read from its file each time)."""
        if len(graph_def) > self._memory_bytes:
            return
        with self._lock:
            previous = self._graphs.pop(dataset_id, None)
            if previous is not None:
                self._held -= len(previous)
            self._graphs[dataset_id] = graph_def
            self._held += len(graph_def)
            while self._held > self._memory_bytes:
                _, dropped = self._graphs.popitem(last=False)
                self._held -= len(dropped)

    @property
    def bytes_in_memory(self) -> int:
        with self._lock:
            return self._held
