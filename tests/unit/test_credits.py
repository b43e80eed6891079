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


def test_an_ended_connection_grants_nothing_the_next_one_would_not_grant_again():
    """A stream's connection ended while its request loop waits in grant(): the consumer then
    frees credits. The old connection's grant must come back empty, else its credits would go
    out on a dead connection while the ledger counts them granted, and the next connection
    (which grants again only `unused`: granted, not received) would never grant them: the
    worker would wait for credits the client thinks it holds."""
    ledger = CreditLedger(4)
    ledger.open("a")
    assert ledger.grant("a", 0, never) == 4
    ledger.received("a", 4)
    ended = threading.Event()
    late: list[int] = []
    waiting = threading.Thread(target=lambda: late.append(ledger.grant("a", 5.0, ended.is_set)))
    waiting.start()
    time.sleep(0.1)
    ledger.end_connection(ended)
    next_connection_regrants = ledger.unused("a")
    ledger.consumed([("a", 4)])
    waiting.join(5)
    assert late == [0] and next_connection_regrants == 0
    assert ledger.grant("a", 0, never) == 4, "the next connection's own grant gets the freed credits"
