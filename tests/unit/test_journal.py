"""The journal on disk: durable records, torn tails dropped, corruption refused, snapshots."""

import random
import time

import pytest
from test_state import comparable, random_updates

from dataservice.dispatcher import journal
from dataservice.dispatcher.state import DispatcherState

pytestmark = pytest.mark.timeout(120)


def _write(directory, updates, seq=0):
    writer = journal.JournalWriter(directory, seq)
    for update in updates:
        writer.append(update)
    writer.close()
    return directory / f"journal-{seq:010d}.log"


def _state(updates):
    state = DispatcherState()
    for update in updates:
        state.apply(update)
    return state


def test_records_round_trip_across_segments(tmp_path):
    updates = random_updates(random.Random(1), 50)
    _write(tmp_path, updates[:30], seq=0)
    _write(tmp_path, updates[30:], seq=1)
    read, next_seq = journal.read(tmp_path)
    assert read == updates and next_seq == 2


@pytest.mark.parametrize("tail", [b"\x10\x00", b"\x40\x00\x00\x00\x01\x02\x03\x04partial"])
def test_torn_tail_is_dropped(tmp_path, tail, caplog):
    updates = random_updates(random.Random(2), 10)
    path = _write(tmp_path, updates)
    with open(path, "ab") as f:
        f.write(tail)
    read, _ = journal.read(tmp_path)
    assert read == updates
    assert "torn" in caplog.text


def test_torn_last_record_with_bad_checksum_is_dropped(tmp_path):
    updates = random_updates(random.Random(3), 10)
    path = _write(tmp_path, updates)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    read, _ = journal.read(tmp_path)
    assert read == updates[:-1]


def test_corrupt_record_in_the_middle_is_refused(tmp_path):
    updates = random_updates(random.Random(4), 10)
    path = _write(tmp_path, updates)
    first_len = len(updates[0].SerializeToString()) + 8
    data = bytearray(path.read_bytes())
    data[first_len + 10] ^= 0xFF  # inside the second record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(journal.JournalCorruptError, match=f"{path.name} is corrupt at offset {first_len}"):
        journal.read(tmp_path)


def test_snapshot_replaces_old_segments(tmp_path):
    rng = random.Random(5)
    updates = random_updates(rng, 80)
    writer = journal.JournalWriter(tmp_path, 0)
    for update in updates[:50]:
        writer.append(update)
    writer.snapshot(_state(updates[:50]).to_updates())
    for update in updates[50:]:
        writer.append(update)
    writer.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["journal-0000000001.log", "snapshot-0000000001.log"]
    read, next_seq = journal.read(tmp_path)
    assert comparable(_state(read)) == comparable(_state(updates))
    assert next_seq == 2


def test_a_100k_update_journal_recovers_whole(tmp_path):
    updates = random_updates(random.Random(6), 100_000)
    writer = journal.JournalWriter(tmp_path, 0)
    # Bypass per-record fsync for the setup; reading is what is measured.
    with open(tmp_path / "journal-0000000000.log", "ab") as f:
        for update in updates:
            f.write(journal._encode(update))
    writer.close()
    start = time.perf_counter()
    read, _ = journal.read(tmp_path)
    _state(read)
    elapsed = time.perf_counter() - start
    print(f"recovered {len(read)} updates in {elapsed:.3f} s")
    assert len(read) == len(updates)
