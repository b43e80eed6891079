"""What the parts of the dispatcher core share: the state, the one lock over it, the commit
that journals and then applies an Update, the clock and the configuration.

The core (core.py) is split along its seams (admission.py, split_handout.py, rounds.py,
liveness.py, snapshots.py); each part is given this context instead of reaching into the
others, so that a part can be read, and tested, with only the state machine beside it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from dataservice import status
from dataservice.config import DispatcherConfig
from dataservice.dispatcher.journal import JournalWriter
from dataservice.dispatcher.state import Dataset, DispatcherState
from dataservice.dispatcher.task_changes import TaskChanges
from dataservice.v1 import journal_pb2

log = logging.getLogger(__name__)

Clock = Callable[[], float]

# Journal updates between two journal compactions.
DEFAULT_COMPACT_EVERY = 10_000


def dispatcher_at(address: str) -> str:
    """The dispatcher at `address`, as its error messages and logs name it."""
    return f"the dispatcher at {address}"


class Committer:
    """Journals, then applies, one Update: the only way the dispatcher's state changes.
    Every `compact_every` updates it starts a compaction of the journal (a snapshot of the
    state written in the background), so that recovery time stays flat however long the
    dispatcher runs."""

    def __init__(
        self,
        state: DispatcherState,
        journal: JournalWriter | None,
        task_changes: TaskChanges,
        where: str,
        compact_every: int = DEFAULT_COMPACT_EVERY,
    ):
        self._state = state
        self._journal = journal
        self._task_changes = task_changes
        self._where = where
        self._compact_every = compact_every
        self._since_compaction = 0

    @property
    def appended(self) -> int:
        """Updates journaled by this process (0 without a journal)."""
        return self._journal.appended if self._journal is not None else 0

    def __call__(self, **change) -> None:
        """Commits the Update whose one field is `change`. Call with the core's lock held.

        A journal that cannot be written (disk full, I/O error) fails the request with
        UNAVAILABLE and nothing is applied: clients retry, and succeed once the disk does."""
        update = journal_pb2.Update(**change)
        if self._journal is not None:
            try:
                self._journal.append(update)
            except OSError as e:
                log.error("journal write failed, %s not made: %s", update.WhichOneof("kind"), e)
                raise status.unavailable(
                    f"{self._where} cannot write its journal ({e.strerror or e}); the change was not made. "
                    "It is retried; free space on the work_dir's disk if this persists"
                ) from None
        self._state.apply(update)
        self._task_changes.record(update, self._state)
        if self._journal is not None:
            self._since_compaction += 1
            if self._since_compaction >= self._compact_every:
                # Written in the background from the journal's own files, so requests do not
                # wait for it. A compaction that fails loses nothing (the segments stay): the
                # next one is tried later.
                try:
                    if self._journal.snapshot_in_background(_rebuild):
                        self._since_compaction = 0
                except OSError as e:
                    self._since_compaction = 0
                    log.error("starting a journal compaction failed (the journal is whole; retried later): %s", e)

    def compact_soon(self) -> None:
        """Makes the next commit also start a compaction. Call with the core's lock held."""
        self._since_compaction = self._compact_every

    def wait_for_compaction(self, timeout_s: float) -> bool:
        """Waits for a compaction being written to be on disk; False on timeout."""
        return self._journal is None or self._journal.wait_for_snapshot(timeout_s)


def _rebuild(updates: list[journal_pb2.Update]) -> list[journal_pb2.Update]:
    """The updates that rebuild the state `updates` make (a compacted journal's content)."""
    return DispatcherState.replay(updates).to_updates()


@dataclasses.dataclass(frozen=True)
class CoreContext:
    """The state and how it is changed, shared by the parts of the core. `lock` guards `state`
    (and each part's own bookkeeping); `commit` must be called with it held."""

    config: DispatcherConfig
    address: str
    state: DispatcherState
    lock: threading.RLock
    commit: Callable[..., None]
    clock: Clock

    @property
    def where(self) -> str:
        """The dispatcher, as error messages name it."""
        return dispatcher_at(self.address)

    def dataset(self, dataset_id: str) -> Dataset:
        """The registered dataset `dataset_id`; INVALID_ARGUMENT for an empty id, NOT_FOUND for
        an unknown one. Call with the lock held."""
        if not dataset_id:
            raise status.invalid_argument("dataset_id must not be empty")
        dataset = self.state.dataset(dataset_id)
        if dataset is None:
            # "Dataset id ... not found": TensorFlow's words, which its tests match.
            raise status.not_found(
                f"Dataset id {dataset_id} not found: it is not registered with {self.where}; "
                "register it with register_dataset() first"
            )
        return dataset

    def dropped_reason(self) -> str:
        """Why an id in use once is not known any more, for NOT_FOUND messages."""
        return (
            "ended and was dropped after iteration_retention_ms "
            f"({self.config.iteration_retention_ms} ms) without clients"
        )
