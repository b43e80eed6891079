"""CreditLedger: a client's budget split over its streams, freed as the consumer takes elements."""

import threading
import time

from dataservice.client.credits import CreditLedger

never = lambda: False  # noqa: E731


def test_streams_share_the_budget():
    ledger = CreditLedger(100)
    ledger.open("a")
    assert ledger.grant("a", 0, never) == 100, "alone, a stream gets the whole budget"
    ledger.open("b")
    assert ledger.grant("b", 0, never) == 0, "nothing free until the consumer takes elements"
    ledger.received("a", 100)
    ledger.consumed([("a", 60)])
    assert ledger.grant("b", 0, never) == 50, "b's share, out of the 60 freed"
    assert ledger.outstanding() == 90
    assert ledger.grant("a", 0, never) == 0, "a holds 40 of its 50 share: too small a grant to send"


def test_an_ended_stream_returns_what_it_did_not_receive():
    ledger = CreditLedger(10)
    ledger.open("a")
    ledger.grant("a", 0, never)
    ledger.received("a", 4)
    assert ledger.unused("a") == 6
    ledger.end("a")
    assert ledger.outstanding() == 4, "the 4 received stay held until the consumer takes them"
    assert ledger.is_done("a") and ledger.all_done()
    assert ledger.grant("a", 0, never) == 0
    ledger.consumed([("a", 4)])
    assert ledger.outstanding() == 0


def test_grant_waits_for_the_consumer_and_stops_when_asked():
    ledger = CreditLedger(8)
    ledger.open("a")
    assert ledger.grant("a", 0, never) == 8
    ledger.received("a", 8)
    threading.Timer(0.1, lambda: ledger.consumed([("a", 8)])).start()
    began = time.monotonic()
    assert ledger.grant("a", 5, never) == 8
    assert time.monotonic() - began < 2, "woken by the consumer, not by the timeout"
    stop = threading.Event()
    threading.Timer(0.1, lambda: (stop.set(), ledger.wake())).start()
    assert ledger.grant("a", 5, stop.is_set) == 0


def test_reading_meter_splits_waiting_from_the_consumers_own_time():
    import time

    from dataservice.client.reading_meter import ReadingMeter

    meter = ReadingMeter()
    meter.wait_started()
    time.sleep(0.05)
    meter.wait_started()  # asked again while still waiting (a poll): the wait goes on
    time.sleep(0.05)
    meter.handed(3, 24)
    time.sleep(0.2)  # the consumer works on the 3 elements
    meter.wait_started()
    totals = meter.totals()
    assert (totals.elements, totals.nbytes) == (3, 24)
    assert 0.1 <= totals.wait_s < totals.consume_s
    assert totals.consume_s >= 0.2
    # A wait in progress counts up to now.
    time.sleep(0.05)
    assert meter.totals().wait_s >= totals.wait_s + 0.05
