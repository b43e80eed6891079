"""Liveness and garbage collection: when clients and workers were last heard from, and what
the dispatcher ends or drops when they fall silent or are done.

When a peer was last heard from is runtime bookkeeping, not state: after a restart every peer
is given a fresh timeout. What the timeouts decide (a worker removed and its tasks lost, a
client released, an iteration ended or dropped) is journaled like any other change.

A dispatcher that hears from no peer at all, while it knows of two or more, takes itself for
cut off (its host partitioned, or the process frozen) rather than every peer for dead: it
removes and releases no one while the silence lasts, and the first peer it hears from again
gives every peer a fresh timeout. Otherwise a partition of the dispatcher's host longer than
worker_timeout_ms would lose every task of every worker that went on serving its clients.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from dataservice.config import NEVER, resolved
from dataservice.dispatcher.context import CoreContext
from dataservice.dispatcher.state import ClientId, IterationId, TaskId, WorkerAddress
from dataservice.monitoring.logs import ids
from dataservice.v1 import journal_pb2

log = logging.getLogger(__name__)

# The shortest silence from every peer that makes the dispatcher take itself for cut off
# (with at least half of worker_timeout_ms: a quiet cluster's peers heartbeat every second).
MIN_CUT_OFF_S = 2.0


class Liveness:
    """Peers' last contact, and the removals and releases their silence or their end causes.
    `forget_worker`, `forget_client`, `forget_iteration` and `forget_job` are called once each
    thing is gone, for the bookkeeping other parts keep about it (rates, rounds, chunks)."""

    def __init__(
        self,
        ctx: CoreContext,
        *,
        forget_worker: Callable[[WorkerAddress], None],
        forget_client: Callable[[ClientId], None],
        forget_iteration: Callable[[IterationId], None],
        forget_job: Callable[[int], None],
    ):
        self._ctx = ctx
        self._forget_worker = forget_worker
        self._forget_client = forget_client
        self._forget_iteration = forget_iteration
        self._forget_job = forget_job
        now = ctx.clock()
        self.client_seen: dict[ClientId, float] = {c: now for c in ctx.state.client_ids()}
        self.worker_seen: dict[WorkerAddress, float] = {w: now for w in ctx.state.alive_workers()}
        # When any peer was last heard from; whether the current silence from all was logged.
        self._last_contact = now
        self._cut_off_logged = False
        # Named iterations without clients, since when: ended after job_gc_timeout_ms.
        self._idle_since: dict[IterationId, float] = {}
        # Finished iterations without clients, since when (as first seen so; after a restart,
        # from the restart): dropped after iteration_retention_ms.
        self._retired_since: dict[IterationId, float] = {}
        # Named iterations this process ended for want of readers (their tasks are gone).
        self._collected: set[IterationId] = set()

    def interval_s(self) -> float:
        """How often collect_garbage() should run: a quarter of the shortest timeout it enforces."""
        config = self._ctx.config
        return (
            min(
                resolved(config.job_gc_check_interval_ms),
                resolved(config.client_timeout_ms),
                resolved(config.worker_timeout_ms),
            )
            / 4000
        )

    # ---- contact (call with the lock held) ---------------------------------------

    def worker_heard(self, address: WorkerAddress) -> None:
        self._contact()
        self.worker_seen[address] = self._ctx.clock()

    def client_heard(self, client_id: ClientId) -> None:
        self._contact()
        self.client_seen[client_id] = self._ctx.clock()

    def _cut_off_s(self) -> float:
        return max(MIN_CUT_OFF_S, resolved(self._ctx.config.worker_timeout_ms) / 2000)

    def _silent_all(self, now: float) -> bool:
        """Whether no peer was heard for _cut_off_s() while two or more are known."""
        return len(self.worker_seen) + len(self.client_seen) >= 2 and now - self._last_contact > self._cut_off_s()

    def _contact(self) -> None:
        """A peer was heard from (a new one too: the first to get through after a partition heals
        may be a client starting to read). After a silence from all (this dispatcher was cut
        off), every peer gets a fresh timeout: the others are as likely to be back."""
        now = self._ctx.clock()
        if self._silent_all(now):
            log.warning(
                "heard from a peer after %.1f s of silence from all %d workers and clients: this dispatcher was "
                "cut off (partitioned or paused), not they; every peer gets a fresh timeout",
                now - self._last_contact,
                len(self.worker_seen) + len(self.client_seen),
            )
            self.worker_seen = dict.fromkeys(self.worker_seen, now)
            self.client_seen = dict.fromkeys(self.client_seen, now)
        self._last_contact = now
        self._cut_off_logged = False

    def workers_heard_within(self, addresses: Iterable[WorkerAddress], seconds: float) -> list[WorkerAddress]:
        """Those of `addresses` heard from within the last `seconds`."""
        now = self._ctx.clock()
        return [w for w in addresses if w in self.worker_seen and now - self.worker_seen[w] <= seconds]

    def job_collected(self, job) -> bool:
        """Whether the named `job` is one TensorFlow's service would have collected: every
        iteration of it finished without clients, each ended here for want of readers or
        finished for longer than job_gc_timeout_ms. Its name then makes a new job (the old one
        stays, by id, for iteration_retention_ms). Call with the lock held."""
        timeout_ms = resolved(self._ctx.config.job_gc_timeout_ms)
        if timeout_ms == NEVER or not job.iterations:
            return False
        now = self._ctx.clock()
        for iteration_id in job.iterations.values():
            iteration = self._ctx.state.known_iteration(iteration_id)
            if not iteration.finished or iteration.client_ids:
                return False
            if iteration_id in self._collected:
                continue
            since = self._retired_since.get(iteration_id)
            if since is None or now - since <= timeout_ms / 1000:
                return False
        return True

    def client_joined(self, client_id: ClientId, iteration_id: IterationId) -> None:
        """A client acquired the iteration: it is heard from now, and the iteration is in use."""
        self.client_heard(client_id)
        self._idle_since.pop(iteration_id, None)
        self._retired_since.pop(iteration_id, None)

    # ---- removals (call with the lock held) --------------------------------------

    def remove_worker(self, address: WorkerAddress, lost: list[TaskId]) -> None:
        """Journals the worker's removal: its unfinished tasks `lost`, their unstarted split
        ranges back to the pool."""
        self._ctx.commit(remove_worker=journal_pb2.RemoveWorkerUpdate(worker_address=address, lost_tasks=lost))
        self.worker_seen.pop(address, None)
        self._forget_worker(address)

    def release_client(self, client_id: ClientId) -> None:
        """Journals the client's release. An anonymous job's iteration ends with its last client;
        a named one waits job_gc_timeout_ms for another client to join."""
        ctx = self._ctx
        iteration = ctx.state.iteration_of_client(client_id)
        if iteration is None:
            raise KeyError(f"client {client_id} is not a client of any iteration")
        ctx.commit(release_iteration_client=journal_pb2.ReleaseIterationClientUpdate(iteration_client_id=client_id))
        self.client_seen.pop(client_id, None)
        self._forget_client(client_id)
        log.info(
            "client left", extra=ids(job_id=iteration.job_id, iteration_id=iteration.iteration_id, client_id=client_id)
        )
        if iteration.client_ids or iteration.finished:
            return
        if ctx.state.job_of(iteration).job_name:
            self._idle_since[iteration.iteration_id] = ctx.clock()
        else:
            ctx.commit(finish_iteration=journal_pb2.FinishIterationUpdate(iteration_id=iteration.iteration_id))

    # ---- garbage collection --------------------------------------------------------

    def collect_garbage(self) -> None:
        """Removes workers silent for worker_timeout_ms (their unfinished tasks are lost and their
        unstarted split ranges return to the pool), releases clients silent for
        client_timeout_ms, ends named iterations nobody has read for job_gc_timeout_ms, and
        drops iterations finished without clients for iteration_retention_ms."""
        ctx = self._ctx
        config = ctx.config
        with ctx.lock:
            now = ctx.clock()
            if self._silent_all(now):
                if not self._cut_off_logged:
                    log.warning(
                        "heard from none of %d workers and clients for %.1f s: taking this dispatcher to be cut off; "
                        "removing and releasing no one until a peer is heard from again",
                        len(self.worker_seen) + len(self.client_seen),
                        now - self._last_contact,
                    )
                    self._cut_off_logged = True
                self._drop_retired_iterations(now)
                return
            for address, seen in list(self.worker_seen.items()):
                if now - seen > resolved(config.worker_timeout_ms) / 1000:
                    lost = ctx.state.lost_tasks_of(address)
                    log.warning(
                        "worker missing for %.1f s: removed, tasks %s lost", now - seen, lost, extra=ids(worker=address)
                    )
                    self.remove_worker(address, lost)
            for client_id, seen in list(self.client_seen.items()):
                timed_out = now - seen > resolved(config.client_timeout_ms) / 1000
                if timed_out and ctx.state.iteration_of_client(client_id) is not None:
                    log.info("client silent for %.1f s: released", now - seen, extra=ids(client_id=client_id))
                    self.release_client(client_id)
            for iteration_id, since in list(self._idle_since.items()):
                iteration = ctx.state.known_iteration(iteration_id)
                if iteration.client_ids or iteration.finished:
                    del self._idle_since[iteration_id]
                elif (
                    resolved(config.job_gc_timeout_ms) != NEVER
                    and now - since > resolved(config.job_gc_timeout_ms) / 1000
                ):
                    log.info(
                        "iteration without clients for %.1f s: ended",
                        now - since,
                        extra=ids(job_id=iteration.job_id, iteration_id=iteration_id),
                    )
                    ctx.commit(finish_iteration=journal_pb2.FinishIterationUpdate(iteration_id=iteration_id))
                    del self._idle_since[iteration_id]
                    self._collected.add(iteration_id)
            self._drop_retired_iterations(now)

    def _drop_retired_iterations(self, now: float) -> None:
        """Drops the iterations finished without clients for iteration_retention_ms, and with
        the last iteration of a job the job (its name is free again, its rates forgotten).
        Call with the lock held."""
        ctx = self._ctx
        retention_ms = resolved(ctx.config.iteration_retention_ms)
        retired = {iteration.iteration_id for iteration in ctx.state.retired_iterations()}
        for iteration_id in list(self._retired_since):
            if iteration_id not in retired:  # a reader joined it again (a named job's repetition)
                del self._retired_since[iteration_id]
        for iteration_id in sorted(retired):
            since = self._retired_since.setdefault(iteration_id, now)
            if retention_ms == NEVER or now - since <= retention_ms / 1000:
                continue
            job_id = ctx.state.known_iteration(iteration_id).job_id
            ctx.commit(drop_iteration=journal_pb2.DropIterationUpdate(iteration_id=iteration_id))
            del self._retired_since[iteration_id]
            self._idle_since.pop(iteration_id, None)
            self._collected.discard(iteration_id)
            self._forget_iteration(iteration_id)
            job_dropped = ctx.state.job(job_id) is None
            if job_dropped:
                self._forget_job(job_id)
            log.info(
                "iteration dropped after %.0f s finished without clients%s",
                now - since,
                " (and its job)" if job_dropped else "",
                extra=ids(job_id=job_id, iteration_id=iteration_id),
            )
