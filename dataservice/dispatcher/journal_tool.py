"""`data-server journal verify|dump --work_dir=DIR`: the dispatcher's journal, read offline.

An operator needs this when a dispatcher refuses to start (JournalCorruptError names a file
and an offset) or to see what a work_dir holds before moving it. Neither command writes
anything: a torn final record that a start would zero is reported, not repaired.

verify: every journal file read on its own (kind, sequence number, size, updates, damage),
then what a start would do: replay the newest snapshot and the segments after it through
the state machine and check the state's invariants (which a start does not). Exit status 0
when a dispatcher with this work_dir would start on a sound state, 1 when it would refuse
(and why) or the state breaks an invariant, 2 for a bad command line.

dump: the updates a start would replay, in order, one JSON object a line.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import TextIO

from google.protobuf import json_format

from dataservice.dispatcher import journal
from dataservice.dispatcher.state import DispatcherState


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="data-server journal", description="Read a dispatcher's journal offline (changes nothing)."
    )
    parser.add_argument("command", choices=("verify", "dump"), help="verify: would a dispatcher start; dump: updates")
    parser.add_argument("--work_dir", required=True, help="the dispatcher's work_dir (its journal/ is read)")
    return parser


def _describe(report: journal.FileReport) -> str:
    line = f"  {report.path.name:<26} {report.size:>12,} bytes  {report.updates:>9,} updates"
    if report.torn_at is not None:
        line += f", a final record torn by a crash at offset {report.torn_at:,} (a start drops it)"
    if report.problem is not None:
        line += "  DAMAGED"
    return line


def verify(directory: pathlib.Path, out: TextIO) -> int:
    reports = journal.inspect(directory)
    if not reports:
        print(f"no journal files under {directory}: a dispatcher would start with an empty state", file=out)
        return 0
    print(f"{len(reports)} journal file(s) under {directory}:", file=out)
    for report in reports:
        print(_describe(report), file=out)
    try:
        replay = journal.read(directory)
    except journal.JournalCorruptError as e:
        print(f"REFUSED: a dispatcher would not start: {e}", file=out)
        return 1
    state = DispatcherState()
    for index, update in enumerate(replay.updates):
        try:
            state.apply(update)
        except Exception as e:  # noqa: BLE001 - any failure to apply is what an operator must see
            kind = update.WhichOneof("kind")
            problem = f"{type(e).__name__}: {e}"
            print(f"REFUSED: update {index} ({kind}) does not apply to the state before it: {problem}", file=out)
            return 1
    try:
        state.validate()
    except Exception as e:  # noqa: BLE001 - as above
        problem = f"{type(e).__name__}: {e}"
        print(f"INCONSISTENT: a dispatcher would start, on a state that breaks an invariant: {problem}", file=out)
        return 1
    counts = ", ".join(f"{name} {count:,}" for name, count in state.summary().items())
    print(f"replay: {len(replay.updates):,} updates from sequence {replay.base}; state: {counts}", file=out)
    damaged_unread = [r.path.name for r in reports if r.problem is not None]
    if damaged_unread:
        # Files older than the newest snapshot are not replayed (a start deletes them later).
        print(f"not replayed and damaged (older than the newest snapshot): {', '.join(damaged_unread)}", file=out)
    print("OK: a dispatcher with this work_dir would start", file=out)
    return 0


def dump(directory: pathlib.Path, out: TextIO, err: TextIO) -> int:
    try:
        replay = journal.read(directory)
    except journal.JournalCorruptError as e:
        print(f"data-server journal dump: {e}", file=err)
        return 1
    for index, update in enumerate(replay.updates):
        fields = json_format.MessageToDict(update, preserving_proto_field_name=True)
        print(json.dumps({"index": index, "update": fields}, sort_keys=True), file=out)
    return 0


def main(argv: list[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = _parser().parse_args(argv)
    work_dir = pathlib.Path(args.work_dir)
    if not work_dir.is_dir():
        print(f"data-server journal: --work_dir {work_dir} is not a directory", file=err)
        return 2
    directory = journal.directory_of(args.work_dir)
    return verify(directory, out) if args.command == "verify" else dump(directory, out, err)
