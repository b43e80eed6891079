"""Load tracking and the worker recommendation (dispatcher/load.py) on a fake clock."""

import pytest

from dataservice.dispatcher import load
from dataservice.dispatcher.load import LoadTracker, recommended_workers


def test_recommendation_is_demand_over_mean_worker_throughput():
    # Two clients that would take 300 and 200 elements/s; workers making 50/s each.
    assert recommended_workers([300.0, 200.0], [50.0, 50.0, 50.0]) == 10
    assert recommended_workers([100.0], [50.0]) == 2
    assert recommended_workers([101.0], [50.0]) == 3
    # Never below one worker, and nothing to say without both sides.
    assert recommended_workers([1.0], [500.0]) == 1
    assert recommended_workers([], [50.0]) is None
    assert recommended_workers([100.0], []) is None
    assert recommended_workers([100.0], [0.0]) is None


def test_outliers_count_as_the_median():
    # As TensorFlow's auto_scaler: 1,000 elements/s from one worker of five is taken as the median (50).
    assert recommended_workers([500.0], [50.0, 50.0, 50.0, 50.0, 1000.0]) == 10
    assert recommended_workers([500.0], [50.0, 50.0, 50.0, 50.0, 50.0]) == 10


def feed(tracker: LoadTracker, seconds: int, client_rate: float, wait_share: float, worker_rate: float, workers=1):
    """`seconds` of one-second reports: a client handed `client_rate` elements/s that waited
    `wait_share` of each second, and `workers` workers producing at `worker_rate` elements/s."""
    for t in range(seconds + 1):
        tracker.report_client(
            job_id=1,
            client_id=7,
            now=float(t),
            elements=int(client_rate * t),
            nbytes=int(client_rate * t) * 8,
            wait_s=wait_share * t,
            consume_s=(1 - wait_share) * t,
        )
        for w in range(workers):
            elements = int(client_rate / workers * t)
            tracker.report_task(
                1,
                f"w{w}:1",
                task_id=w + 1,
                now=float(t),
                elements=elements,
                nbytes=elements * 8,
                processing_s=elements / worker_rate,
            )


def test_a_starved_client_gets_more_workers_recommended():
    tracker = LoadTracker()
    # The client gets 50 elements/s from 2 workers of 25/s, and waits 75% of the time: its own
    # pace is 50 / 0.25 = 200 elements/s, which takes 8 such workers.
    feed(tracker, seconds=8, client_rate=50, wait_share=0.75, worker_rate=25, workers=2)
    job = tracker.load(1, now=8.0)
    assert job.wait_fraction == pytest.approx(0.75)
    assert job.consumption_rates[7] == pytest.approx(200)
    assert job.worker_throughputs == {"w0:1": pytest.approx(25), "w1:1": pytest.approx(25)}
    assert job.recommended_workers == 8
    assert job.elements_received == 400 and job.bytes_received == 3200
    assert job.wait_seconds == pytest.approx(6.0)


def test_a_client_that_never_waits_needs_no_more_workers():
    tracker = LoadTracker()
    feed(tracker, seconds=8, client_rate=50, wait_share=0.0, worker_rate=25, workers=4)
    job = tracker.load(1, now=8.0)
    assert job.wait_fraction == 0.0
    assert job.recommended_workers == 2  # 4 run; 2 would do


def test_a_client_waiting_all_the_time_is_bounded_by_its_received_rate():
    tracker = LoadTracker()
    feed(tracker, seconds=8, client_rate=50, wait_share=1.0, worker_rate=25, workers=2)
    job = tracker.load(1, now=8.0)
    assert job.consumption_rates[7] == pytest.approx(50 / load.MIN_CONSUME_SHARE)


def test_rates_use_the_last_window_only():
    tracker = LoadTracker()
    feed(tracker, seconds=30, client_rate=50, wait_share=0.0, worker_rate=25)
    # Reports stop: after the window the rates are unknown, the totals stay.
    job = tracker.load(1, now=30.0 + load.WINDOW_S + 1)
    assert job.recommended_workers is None and job.wait_fraction is None
    assert job.elements_received == 1500


def test_totals_never_go_down_and_survive_forgotten_clients():
    tracker = LoadTracker()
    tracker.report_client(1, 7, 0.0, 100, 800, 1.0, 1.0)
    tracker.report_client(1, 7, 1.0, 150, 1200, 1.5, 1.5)
    # A client whose totals went down restarted counting: what it reports now is all new.
    tracker.report_client(1, 7, 2.0, 20, 160, 0.5, 0.5)
    tracker.forget_client(7)
    tracker.report_client(1, 8, 3.0, 5, 40, 0.0, 0.1)
    job = tracker.load(1, now=3.0)
    assert job.elements_received == 175 and job.bytes_received == 1400
    assert job.wait_seconds == pytest.approx(2.0)


def test_forgotten_workers_leave_the_estimate():
    tracker = LoadTracker()
    feed(tracker, seconds=5, client_rate=50, wait_share=0.5, worker_rate=25, workers=2)
    tracker.forget_worker("w1:1")
    assert set(tracker.load(1, now=5.0).worker_throughputs) == {"w0:1"}


def test_history_buckets_elements_per_second():
    tracker = LoadTracker()
    for t in range(0, 31):
        tracker.report_client(1, 7, float(t), 100 * t, 0, 0.0, float(t))
    points = tracker.history(now=31.0)
    assert len(points) == load.HISTORY_BUCKETS
    rates = dict(points)
    assert rates[0.0] == pytest.approx(80)  # the first report (0 elements) opens the series
    assert rates[10.0] == pytest.approx(100) and rates[25.0] == pytest.approx(100)
    assert rates[-5.0] == 0
