"""`data-server journal verify|dump`: what an operator reads when a dispatcher refuses to start."""

import io
import json
import random

import pytest
from state_helpers import random_updates, record_offsets

from dataservice import cli
from dataservice.dispatcher import journal, journal_tool
from dataservice.dispatcher.state import DispatcherState
from dataservice.v1 import journal_pb2

CHUNK = 1024


def _journal(work_dir, updates, seq=0):
    """Writes `updates` as segment `seq` of work_dir's journal; returns its path."""
    directory = journal.directory_of(str(work_dir))
    directory.mkdir(exist_ok=True)
    writer = journal.JournalWriter(directory, seq, chunk_bytes=CHUNK, base=0)
    for update in updates:
        writer.append(update)
    writer.close()
    return directory / f"journal-{seq:010d}.log"


def _run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = journal_tool.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def _record_starts(path):
    return record_offsets(path)[0]


def test_an_empty_work_dir_would_start_empty(tmp_path):
    code, out, _ = _run("verify", f"--work_dir={tmp_path}")
    assert code == 0 and "no journal files" in out


def test_a_healthy_journal_verifies_and_says_what_it_holds(tmp_path):
    updates = random_updates(random.Random(3), 60)
    _journal(tmp_path, updates)
    code, out, _ = _run("verify", f"--work_dir={tmp_path}")
    assert code == 0, out
    assert "journal-0000000000.log" in out and f"{len(updates)} updates" in out
    expected = DispatcherState.replay(updates).summary()
    assert f"datasets {expected['datasets']}," in out and f"jobs {expected['jobs']}," in out
    assert out.rstrip().endswith("OK: a dispatcher with this work_dir would start")


def test_a_torn_final_record_is_reported_and_left_as_it_is(tmp_path):
    updates = random_updates(random.Random(4), 10)
    path = _journal(tmp_path, updates)
    last = _record_starts(path)[-1]
    data = bytearray(path.read_bytes())
    data[last + 20] ^= 0xFF  # the last record's payload: a crash mid-write
    path.write_bytes(bytes(data))
    code, out, _ = _run("verify", f"--work_dir={tmp_path}")
    assert code == 0, out
    assert f"torn by a crash at offset {last:,}" in out and f"{len(updates) - 1} updates" in out
    assert path.read_bytes() == bytes(data), "verify changed the journal"


def test_damage_is_refused_naming_the_file_and_offset(tmp_path):
    path = _journal(tmp_path, random_updates(random.Random(5), 10))
    third = _record_starts(path)[3]
    data = bytearray(path.read_bytes())
    data[third + 20] ^= 0xFF  # a record with valid records after it: not a crash
    path.write_bytes(bytes(data))
    code, out, _ = _run("verify", f"--work_dir={tmp_path}")
    assert code == 1
    assert "DAMAGED" in out and f"REFUSED: a dispatcher would not start: journal file {path}" in out
    assert f"damaged at offset {third}" in out
    assert path.read_bytes() == bytes(data)
    code, out, err = _run("dump", f"--work_dir={tmp_path}")
    assert code == 1 and not out and f"damaged at offset {third}" in err


def test_an_update_that_does_not_apply_is_named(tmp_path):
    updates = random_updates(random.Random(6), 5)
    orphan = journal_pb2.Update(create_iteration=journal_pb2.CreateIterationUpdate(iteration_id=999, job_id=999))
    _journal(tmp_path, updates + [orphan])
    code, out, _ = _run("verify", f"--work_dir={tmp_path}")
    assert code == 1 and f"REFUSED: update {len(updates)} (create_iteration) does not apply" in out
    assert "KeyError" in out


def test_dump_prints_the_replayed_updates_as_json_lines(tmp_path):
    updates = random_updates(random.Random(7), 25)
    _journal(tmp_path, updates[:10], seq=0)
    _journal(tmp_path, updates[10:], seq=1)
    code, out, _ = _run("dump", f"--work_dir={tmp_path}")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["index"] for line in lines] == list(range(len(updates)))
    kinds = [next(iter(line["update"])) for line in lines]
    assert kinds == [update.WhichOneof("kind") for update in updates]


def test_data_server_routes_the_journal_command(tmp_path, capsys):
    _journal(tmp_path, random_updates(random.Random(8), 5))
    assert cli.main(["journal", "verify", f"--work_dir={tmp_path}"]) == 0
    assert "would start" in capsys.readouterr().out
    assert cli.main(["journal", "verify", f"--work_dir={tmp_path / 'missing'}"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["journal", "repair", f"--work_dir={tmp_path}"])
