"""write_durably: whole files or the old content, never a partial one."""

import pytest

from dataservice import durable_files


def test_writes_bytes_and_chunks(tmp_path):
    path = tmp_path / "a.bin"
    durable_files.write_durably(path, b"hello")
    assert path.read_bytes() == b"hello"
    durable_files.write_durably(path, (bytes([i]) * 3 for i in range(3)))
    assert path.read_bytes() == b"\x00\x00\x00\x01\x01\x01\x02\x02\x02"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.bin"
    durable_files.write_durably(path, b"old")

    def chunks():
        yield b"new, partly"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        durable_files.write_durably(path, chunks())
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_a_temporary_left_by_a_crash_is_overwritten(tmp_path):
    (tmp_path / "a.bin.tmp").write_bytes(b"torn")
    durable_files.write_durably(tmp_path / "a.bin", b"whole")
    assert (tmp_path / "a.bin").read_bytes() == b"whole"
    assert not (tmp_path / "a.bin.tmp").exists()
