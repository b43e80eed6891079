"""The journal on disk: durable records, a crash's torn record dropped, damage refused, snapshots."""

import collections
import random
import threading

import pytest
from state_helpers import comparable, random_updates, record_offsets

from dataservice.dispatcher import journal
from dataservice.dispatcher.state import DispatcherState

pytestmark = pytest.mark.timeout(300)

# Small chunks keep the files of the byte sweep small.
CHUNK = 1024


def _write(directory, updates, seq=0, chunk=CHUNK):
    writer = journal.JournalWriter(directory, seq, chunk_bytes=chunk, base=0)
    for update in updates:
        writer.append(update)
    writer.close()
    return directory / f"journal-{seq:010d}.log"


def _state(updates):
    return DispatcherState.replay(updates)


def test_records_round_trip_across_segments(tmp_path):
    updates = random_updates(random.Random(1), 50)
    _write(tmp_path, updates[:30], seq=0)
    _write(tmp_path, updates[30:], seq=1)
    replay = journal.read(tmp_path)
    assert replay.updates == updates and replay.next_seq == 2 and replay.torn is None


def test_segments_are_whole_chunks_of_zeros_after_the_records(tmp_path):
    path = _write(tmp_path, random_updates(random.Random(1), 40), chunk=512)
    data = path.read_bytes()
    assert len(data) % 512 == 0 and len(data) > 512, "grown by whole chunks"
    _, end = record_offsets(path)
    assert not any(data[end:])


def test_a_torn_final_record_is_dropped_and_repaired_before_writing_on(tmp_path, caplog):
    updates = random_updates(random.Random(2), 10)
    path = _write(tmp_path, updates)
    offsets, end = record_offsets(path)
    data = bytearray(path.read_bytes())
    data[offsets[-1] + 20 : end] = bytes(end - offsets[-1] - 20)  # the crash wrote only its first 20 bytes
    path.write_bytes(bytes(data))
    replay = journal.read(tmp_path)
    assert replay.updates == updates[:-1]
    assert replay.torn.offset == offsets[-1] and "torn" in caplog.text
    writer = journal.JournalWriter.after(tmp_path, replay, chunk_bytes=CHUNK)
    writer.append(updates[-1])
    writer.close()
    replay = journal.read(tmp_path)
    assert replay.updates == updates and replay.torn is None, "the repaired segment reads whole"


def test_damage_before_the_last_record_is_refused_with_file_and_offset(tmp_path):
    updates = random_updates(random.Random(4), 10)
    path = _write(tmp_path, updates)
    offsets, _ = record_offsets(path)
    data = bytearray(path.read_bytes())
    data[offsets[3] + 5] ^= 0xFF  # the length field of the third update's header
    path.write_bytes(bytes(data))
    with pytest.raises(journal.JournalCorruptError) as info:
        journal.read(tmp_path)
    message = str(info.value)
    assert path.name in message and f"offset {offsets[3]}" in message
    assert "restore" in message and "move this file" in message, "it says how to proceed"


def test_a_cut_segment_and_a_missing_segment_are_refused(tmp_path):
    updates = random_updates(random.Random(5), 30)
    first = _write(tmp_path, updates[:10], seq=0)
    second = _write(tmp_path, updates[10:20], seq=1)
    third = _write(tmp_path, updates[20:], seq=2)
    third.write_bytes(third.read_bytes()[: CHUNK - 1])
    with pytest.raises(journal.JournalCorruptError, match="cut short"):
        journal.read(tmp_path)
    third.unlink()
    assert journal.read(tmp_path).updates == updates[:20]
    _write(tmp_path, updates[20:], seq=2)
    second.rename(tmp_path / "elsewhere")
    with pytest.raises(journal.JournalCorruptError, match="journal-0000000001.log.*missing"):
        journal.read(tmp_path)
    (tmp_path / "elsewhere").rename(second)
    first.unlink()
    with pytest.raises(journal.JournalCorruptError, match="builds on sequence number 0.*missing"):
        journal.read(tmp_path)


def test_snapshot_replaces_old_segments(tmp_path):
    updates = random_updates(random.Random(5), 80)
    writer = journal.JournalWriter(tmp_path, 0, chunk_bytes=CHUNK)
    for update in updates[:50]:
        writer.append(update)
    writer.snapshot(_state(updates[:50]).to_updates())
    for update in updates[50:]:
        writer.append(update)
    writer.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["journal-0000000001.log", "snapshot-0000000001.log"]
    replay = journal.read(tmp_path)
    assert comparable(_state(replay.updates)) == comparable(_state(updates))
    assert replay.next_seq == 2


def _rebuild(updates):
    return _state(updates).to_updates()


def test_a_background_snapshot_lets_appends_go_on_and_replaces_the_old_files(tmp_path):
    updates = random_updates(random.Random(10), 90)
    writer = journal.JournalWriter(tmp_path, 0, chunk_bytes=CHUNK)
    for update in updates[:60]:
        writer.append(update)
    release = threading.Event()

    def held_rebuild(replayed):
        release.wait(30)
        return _rebuild(replayed)

    assert writer.snapshot_in_background(held_rebuild)
    for update in updates[60:]:
        writer.append(update)  # appends go on while the snapshot is being made
    assert not writer.snapshot_in_background(_rebuild), "one snapshot at a time"
    assert not writer.wait_for_snapshot(0.05)
    release.set()
    assert writer.wait_for_snapshot(30)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal-0000000001.log", "snapshot-0000000001.log"]
    assert comparable(_state(journal.read(tmp_path).updates)) == comparable(_state(updates))


def test_a_background_snapshot_that_fails_leaves_the_journal_whole(tmp_path):
    updates = random_updates(random.Random(11), 60)
    writer = journal.JournalWriter(tmp_path, 0, chunk_bytes=CHUNK)
    for update in updates[:30]:
        writer.append(update)

    def failing(_):
        raise OSError(28, "No space left on device")

    assert writer.snapshot_in_background(failing)
    writer.wait_for_snapshot(30)
    for update in updates[30:45]:
        writer.append(update)
    # The state a crash now would recover: the old segment, then the new one (which names the old base).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal-0000000000.log", "journal-0000000001.log"]
    assert journal.read(tmp_path).updates == updates[:45]
    assert writer.snapshot_in_background(_rebuild), "the next snapshot is tried"
    for update in updates[45:]:
        writer.append(update)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal-0000000002.log", "snapshot-0000000002.log"]
    assert comparable(_state(journal.read(tmp_path).updates)) == comparable(_state(updates))


def test_a_crash_between_a_snapshot_and_its_segment_recovers(tmp_path):
    updates = random_updates(random.Random(9), 40)
    writer = journal.JournalWriter(tmp_path, 0, chunk_bytes=CHUNK)
    for update in updates[:25]:
        writer.append(update)
    writer.snapshot(_state(updates[:25]).to_updates())
    writer.close()
    (tmp_path / "journal-0000000001.log").unlink()  # as if the crash came before the segment was made
    replay = journal.read(tmp_path)
    assert comparable(_state(replay.updates)) == comparable(_state(updates[:25]))
    assert replay.next_seq == 1
    writer = journal.JournalWriter.after(tmp_path, replay, chunk_bytes=CHUNK)
    for update in updates[25:]:
        writer.append(update)
    writer.close()
    assert comparable(_state(journal.read(tmp_path).updates)) == comparable(_state(updates))


def test_a_failed_append_leaves_nothing_and_the_next_one_writes_there(tmp_path, monkeypatch):
    updates = random_updates(random.Random(7), 6)
    writer = journal.JournalWriter(tmp_path, 0, chunk_bytes=CHUNK)
    for update in updates[:3]:
        writer.append(update)
    real_fdatasync = journal.os.fdatasync

    def failing_fdatasync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal.os, "fdatasync", failing_fdatasync)
    with pytest.raises(OSError, match="Input/output"):
        writer.append(updates[3])
    monkeypatch.setattr(journal.os, "fdatasync", real_fdatasync)
    for update in updates[4:]:
        writer.append(update)
    writer.close()
    assert journal.read(tmp_path).updates == updates[:3] + updates[4:]


def test_a_100k_update_journal_recovers_whole(tmp_path):
    updates = random_updates(random.Random(6), 100_000)
    writer = journal.JournalWriter(tmp_path, 0, sync=False)
    for update in updates:
        writer.append(update)
    writer.close()
    assert len(journal.read(tmp_path).updates) == len(updates)


# ---- the byte-damage sweep ----------------------------------------------------------


def _sweep_journal(directory):
    """A snapshot and two segments, as a dispatcher that snapshotted, ran on, and restarted leaves them."""
    updates = random_updates(random.Random(8), 30)
    writer = journal.JournalWriter(directory, 0, chunk_bytes=CHUNK)
    for update in updates[:12]:
        writer.append(update)
    writer.snapshot(_state(updates[:12]).to_updates())
    for update in updates[12:20]:
        writer.append(update)
    writer.close()
    writer = journal.JournalWriter.after(directory, journal.read(directory), chunk_bytes=CHUNK)
    for update in updates[20:]:
        writer.append(update)
    writer.close()
    return updates


def test_every_byte_flipped_zeroed_or_cut_gives_the_state_less_at_most_the_last_record_or_a_refusal(tmp_path):
    directory = tmp_path / "journal"
    directory.mkdir()
    updates = _sweep_journal(directory)
    files = sorted(directory.iterdir())
    assert [p.name for p in files] == ["journal-0000000001.log", "journal-0000000002.log", "snapshot-0000000001.log"]
    whole = comparable(_state(updates))
    less_last = comparable(_state(updates[:-1]))
    originals = {path: path.read_bytes() for path in files}
    outcomes = collections.Counter()
    for path, original in originals.items():
        for position in range(len(original)):
            flipped = bytearray(original)
            flipped[position] ^= 0xFF
            zeroed = bytearray(original)
            zeroed[position] = 0
            for damage, data in (("flip", flipped), ("zero", zeroed), ("cut", original[:position])):
                path.write_bytes(bytes(data))
                try:
                    state = comparable(_state(journal.read(directory).updates))
                except journal.JournalCorruptError as e:
                    assert path.name in str(e) or "missing" in str(e), (damage, path.name, position, str(e))
                    assert "offset" in str(e)
                    outcomes["refused"] += 1
                else:
                    if state == whole:
                        outcomes["whole"] += 1
                    elif state == less_last and path.name == "journal-0000000002.log":
                        outcomes["less the last record"] += 1
                    else:
                        raise AssertionError(f"{damage} of {path.name} at byte {position}: a different state")
            path.write_bytes(original)
    print(f"byte sweep over {sum(map(len, originals.values()))} bytes x 3 damages: {dict(outcomes)}")
    assert outcomes["refused"] and outcomes["whole"] and outcomes["less the last record"]
