"""What a worker keeps under values its clients choose stays bounded: the positions of
cross-trainer cache trainers are forgotten once they stop reading, and the coordinated-reads
table of rounds asked for refuses rounds no consumer can have reached and drops the ones the
consumers moved past."""

import time

import pytest
import tensorflow as tf

from dataservice.transfer.element_codec import ElementCodec
from dataservice.worker import cross_trainer_cache, round_robin
from dataservice.worker.chunk_iterator import ChunkIterator
from dataservice.worker.cross_trainer_cache import CachingTaskRunner
from dataservice.worker.round_robin import RoundRobinServer
from dataservice.worker.task_runner import TaskRunner

INFINITE = tf.data.Dataset.range(10**9)


def _runner(cls=TaskRunner, **kwargs):
    codec = ElementCodec(INFINITE.element_spec)
    return cls(1, lambda: ChunkIterator.over(INFINITE, codec, max_chunk=4), codec, **kwargs)


def test_trainers_that_stop_reading_are_forgotten(monkeypatch):
    monkeypatch.setattr(cross_trainer_cache, "TRAINER_IDLE_S", 0.2)
    runner = _runner(CachingTaskRunner, cache_bytes=1 << 20)
    try:
        for i in range(50):  # trainers that come, read, and go
            taken, _ = runner.take(2, 1 << 20, timeout_s=5, trainer_id=f"gone-{i}")
            assert taken
        assert runner.trainers == 50
        time.sleep(0.5)
        taken, _ = runner.take(2, 1 << 20, timeout_s=5, trainer_id="reading")
        assert taken and runner.trainers == 1
    finally:
        runner.stop()


def test_rounds_far_ahead_are_refused_and_rounds_passed_are_forgotten():
    runner = _runner()
    rounds = RoundRobinServer(runner, num_consumers=2, starting_round=10)
    try:
        with pytest.raises(ValueError, match="no consumer can have reached it"):
            rounds.get(0, 10 + round_robin.MAX_ROUNDS_AHEAD + 1, wait_s=0)
        # A consumer alone asks for rounds 11..20 (the other never comes for them): not ready.
        for r in range(11, 21):
            assert rounds.get(0, r, wait_s=0) == (None, False)
        assert len(rounds._requested) == 10  # the table under test
        # Both ask for round 30: it is cut, and the rounds below it are asked for no more.
        assert rounds.get(1, 30, wait_s=0) == (None, False)
        element, end = rounds.get(0, 30, wait_s=5)
        assert element is not None and not end
        assert rounds._requested == {}
    finally:
        runner.stop()


def test_a_cut_round_is_given_again_to_its_client_but_refused_to_a_new_one():
    """A consumer whose response was lost asks again and gets the same element; a consumer
    started again (another client, same index) asking for a cut round is refused, as
    TensorFlow's worker refuses a round before its current one."""
    runner = _runner()
    rounds = RoundRobinServer(runner, num_consumers=2, starting_round=0)
    try:
        assert rounds.get(1, 0, wait_s=0, client_id=11) == (None, False)
        first, _ = rounds.get(0, 0, wait_s=5, client_id=10)
        again, _ = rounds.get(0, 0, wait_s=5, client_id=10)
        assert first is not None and again is first
        with pytest.raises(round_robin.RoundPassedError, match="current round has already reached 1"):
            rounds.get(0, 0, wait_s=5, client_id=12)
        # The new client may take the consumer's place from the next round on.
        assert rounds.get(0, 1, wait_s=0, client_id=12) == (None, False)
    finally:
        runner.stop()
