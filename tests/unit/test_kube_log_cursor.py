"""The kubernetes backend's log positions (services/jobs/kube/logs.py): by the kubelet's
timestamps and the lines sent at the last one, so a rotation (which restarts the served
file, and so the line numbers) neither skips nor repeats a line; cursors of the earlier
line-number kind still decode."""

from __future__ import annotations

import base64
import json

import pytest

from paddlecloud.common.errors import BadCursor
from paddlecloud.jobs.kube.logs import (
    STAMPED,
    Position,
    Row,
    after,
    canonical,
    decode,
    encode,
    kept_rows,
    kept_text,
    since_time,
    stamped_rows,
)

A = "00000|2026-11-27T09:00:00Z|job-trainer-0-abc|00000"
B = "00001|2026-11-27T09:01:00Z|job-trainer-0-def|00000"


def test_kubelet_stamps_compare_as_times_whatever_their_digits_or_offset() -> None:
    # RFC3339Nano drops trailing zeros: as strings, "05.1Z" would sort after "05.12Z".
    assert canonical("2026-11-27T09:00:05.1Z") == "2026-11-27T09:00:05.100000000Z"
    assert canonical("2026-11-27T09:00:05.1Z") < canonical("2026-11-27T09:00:05.12Z")  # type: ignore[operator]
    assert canonical("2026-11-27T09:00:05Z") == "2026-11-27T09:00:05.000000000Z"
    assert canonical("2026-11-27T11:00:05.5+02:00") == "2026-11-27T09:00:05.500000000Z"
    assert canonical("step 5") is None and canonical("2026-13-45T99:00:05Z") is None
    assert since_time("2026-11-27T09:00:05.500000000Z") == "2026-11-27T09:00:05Z"


def test_a_read_from_the_whole_second_drops_exactly_what_the_reader_has() -> None:
    text = "".join(
        f"{stamp} {line}\n"
        for stamp, line in [
            ("2026-11-27T09:00:05.1Z", "a"),
            ("2026-11-27T09:00:05.2Z", "b"),
            ("2026-11-27T09:00:05.2Z", "c"),  # two lines with one stamp
            ("2026-11-27T09:00:05.2Z", "d"),
            ("2026-11-27T09:00:06Z", "e"),
        ]
    )
    rows = stamped_rows(text, ended=False)
    sent = after(rows, A, None)
    assert [r.text for r, _ in sent] == ["a", "b", "c", "d", "e"]
    # After "c": the second of its stamp read again holds a and b too; only d and e are new.
    at_c = sent[2][1]
    assert at_c == Position(A, "2026-11-27T09:00:05.200000000Z", 2)
    assert [r.text for r, _ in after(rows, A, at_c)] == ["d", "e"]
    assert after(rows, A, sent[-1][1]) == []


def test_after_a_rotation_the_new_file_continues_where_the_reader_was() -> None:
    before = stamped_rows("2026-11-27T09:00:05.1Z old 1\n2026-11-27T09:00:05.3Z old 2\n", ended=False)
    position = after(before, A, None)[-1][1]
    # The rotated file starts within the same second, with fewer lines than were read:
    # by line number the reader would wait for line 3 and skip these.
    rotated = stamped_rows("2026-11-27T09:00:05.4Z new 1\n2026-11-27T09:00:07Z new 2\n", ended=False)
    assert [r.text for r, _ in after(rotated, A, position)] == ["new 1", "new 2"]


def test_a_running_containers_last_line_waits_until_it_is_whole() -> None:
    assert [r.text for r in stamped_rows("2026-11-27T09:00:05Z one\n2026-11-27T09:00:06Z tw", False)] == [
        "one"
    ]
    assert [r.text for r in stamped_rows("2026-11-27T09:00:05Z one\n2026-11-27T09:00:06Z tw", True)] == [
        "one",
        "tw",
    ]


def test_cursors_round_trip_and_earlier_line_number_cursors_still_decode() -> None:
    names = ["trainer-0", "trainer-1"]
    positions = {
        "trainer-0": Position(A, "2026-11-27T09:00:05.200000000Z", 2),
        "trainer-1": Position(B, None, 0),
    }
    assert decode(encode(positions), names) == positions
    # An earlier version's: "p" + base64url JSON {worker: [attempt, line number]}.
    old = "p" + base64.urlsafe_b64encode(json.dumps({"trainer-0": [A, 7], "ps-9": [B, 1]}).encode()).decode()
    assert decode(old.rstrip("="), names) == {"trainer-0": Position(A, None, 7)}
    # Placed by line number once, then by stamp.
    rows = [Row(f"2026-11-27T09:00:{i:02d}.000000000Z", f"line {i}") for i in range(1, 10)]
    sent = after(rows, A, Position(A, None, 7))
    assert [r.text for r, _ in sent] == ["line 8", "line 9"]
    assert sent[-1][1] == Position(A, "2026-11-27T09:00:09.000000000Z", 1)


@pytest.mark.parametrize(
    "cursor",
    [
        "x123",
        "t!!",
        "t" + base64.urlsafe_b64encode(b'{"trainer-0": [1]}').decode(),
        "t" + base64.urlsafe_b64encode(b'{"trainer-0": ["k", "noon", 1]}').decode(),
    ],
)
def test_a_cursor_not_handed_out_is_refused(cursor: str) -> None:
    with pytest.raises(BadCursor):
        decode(cursor, ["trainer-0"])


def test_kept_logs_keep_their_stamps_and_earlier_kept_logs_read_by_line() -> None:
    text = "".join(f"2026-11-27T09:00:{i:02d}Z line {i}\n" for i in range(10))
    kept = kept_text(text, limit=60)
    assert kept.startswith(STAMPED)
    rows = kept_rows(kept)
    # The note of what was cut carries the stamp of the first line kept: still in order.
    assert rows[0].text.startswith("[... ") and rows[0].stamp == rows[1].stamp
    assert [r.text for r in rows[1:]] == [f"line {i}" for i in range(10 - len(rows) + 1, 10)]
    assert kept_rows("one\ntwo\n") == [Row(None, "one"), Row(None, "two")]
