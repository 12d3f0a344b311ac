"""Reading metrics.jsonl as a user follows a run: its last records from the file's end, only the
keys asked for, and only what was appended since the previous read, while the run writes it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from api.errors import UserError
from distributed.api import RunResult
from system.run.metrics_file import (
    MetricsTail,
    key_filter,
    last_metrics,
    newest_record,
    read_metrics,
    tail_offset,
)


def write(run_dir: Path, records: list[dict], tail: str = "") -> Path:
    path = run_dir / "metrics.jsonl"
    with path.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def frames(records: list[dict]) -> list[int]:
    return [r["env_frames"] for r in records]


@pytest.mark.parametrize("last", [1, 7, 999, 1000, 5000])
def test_the_last_records_are_those_of_the_whole_file(tmp_path, last):
    write(tmp_path, [{"env_frames": i, "pad": "x" * (i % 300)} for i in range(1000)])
    assert read_metrics(tmp_path, last=last) == read_metrics(tmp_path)[-last:]


def test_the_last_lines_are_found_back_from_the_end_in_small_blocks(tmp_path):
    path = write(tmp_path, [{"i": i} for i in range(100)], tail='{"i": 1')
    lines = path.read_bytes().split(b"\n")
    for n in (1, 2, 3, 50, 100):
        start = tail_offset(path, n, block=16)
        assert path.read_bytes()[start:].split(b"\n")[:-1] == lines[100 - n : 100]
    assert tail_offset(path, 101, block=16) == 0
    assert tail_offset(tmp_path / "absent", 3) == 0


def test_a_line_being_written_is_not_a_record_yet(tmp_path):
    write(tmp_path, [{"env_frames": 1}, {"env_frames": 2}], tail='{"env_frames": 3, "ep')
    assert frames(read_metrics(tmp_path)) == [1, 2]
    assert frames(read_metrics(tmp_path, last=1)) == [2]
    assert last_metrics(tmp_path) == {"env_frames": 2}


def test_a_whole_record_without_its_newline_yet_is_read(tmp_path):
    write(tmp_path, [{"env_frames": 1}, {"env_frames": 2}], tail='{"env_frames": 3}')
    assert frames(read_metrics(tmp_path)) == [1, 2, 3]
    assert frames(read_metrics(tmp_path, last=2)) == [2, 3]


def test_the_last_records_are_counted_past_blank_and_broken_lines(tmp_path):
    write(tmp_path, [{"env_frames": i} for i in range(5)], tail='{"env_fr\n\n\n')
    write(tmp_path, [{"env_frames": 5}])
    assert frames(read_metrics(tmp_path, last=3)) == [3, 4, 5]
    assert frames(read_metrics(tmp_path, last=9)) == [0, 1, 2, 3, 4, 5]


def test_last_zero_or_an_absent_file_reads_nothing(tmp_path):
    assert read_metrics(tmp_path, last=3) == [] and last_metrics(tmp_path) is None
    write(tmp_path, [{"env_frames": 1}])
    assert read_metrics(tmp_path, last=0) == []


def test_keys_keep_names_and_everything_under_a_name_ending_in_a_slash():
    keep = key_filter(["env_frames", "trainer/default/"])
    names = ("env_frames", "env_frames_x", "trainer/default/loss", "trainer/b/loss")
    assert [k for k in names if keep(k)] == ["env_frames", "trainer/default/loss"]
    assert key_filter("fps")("fps") and not key_filter("fps")("f")
    assert key_filter(None) is None


def test_a_tail_reads_only_what_was_appended_since_its_last_read(tmp_path):
    tail = MetricsTail(tmp_path)
    assert tail.read() == []  # no file yet
    write(tmp_path, [{"env_frames": 1}, {"env_frames": 2}], tail='{"env_frames": 3, "fp')
    assert frames(tail.read()) == [1, 2]
    write(tmp_path, [], tail='s": 9.5}\n{"env_frames": 4, "fps": 1.0}\n')
    assert tail.read(key_filter(["fps"])) == [{"fps": 9.5}, {"fps": 1.0}]
    assert tail.read() == []
    write(tmp_path, [{"env_frames": 5}])
    assert frames(tail.read()) == [5]


def test_a_broken_line_read_from_an_offset_is_named_by_its_byte(tmp_path, caplog):
    path = write(tmp_path, [{"env_frames": 1}])
    tail = MetricsTail(tmp_path)
    tail.read()
    at = path.stat().st_size
    write(tmp_path, [], tail='{"env_fra\n{"env_frames": 2}\n')
    with caplog.at_level(logging.WARNING, logger="system.run.report"):
        assert frames(tail.read()) == [2]
    assert f"metrics.jsonl (byte {at}) is not a JSON object; skipping that line" in caplog.text


def test_a_file_replaced_by_a_shorter_one_is_read_again_from_its_start(tmp_path, caplog):
    tail = MetricsTail(tmp_path)
    write(tmp_path, [{"env_frames": i} for i in range(10)])
    assert len(tail.read()) == 10
    (tmp_path / "metrics.jsonl").write_text('{"env_frames": 0}\n')
    with caplog.at_level(logging.WARNING, logger="system.run.report"):
        assert frames(tail.read()) == [0]
    assert "is shorter than before; reading it from its start" in caplog.text


def test_a_run_result_reads_keys_the_last_records_and_what_is_new(tmp_path):
    write(tmp_path, [{"env_frames": i, "episode_return": i / 2, "fps": 9} for i in range(5)])
    result = RunResult(tmp_path)
    assert result.metrics(["env_frames"], last=2) == [{"env_frames": 3}, {"env_frames": 4}]
    assert len(result.metrics()) == 5
    assert frames(result.new_metrics()) == [0, 1, 2, 3, 4]
    write(tmp_path, [{"env_frames": 5, "fps": 9}])
    assert result.new_metrics(["env_frames"]) == [{"env_frames": 5}]
    assert result.new_metrics() == []
    with pytest.raises(UserError, match="last: the number of records to read, 0 or more"):
        result.metrics(last=-1)
    assert result.latest == {"env_frames": 5, "fps": 9}  # no latest.json: the file's last
    (tmp_path / "latest.json").write_text(json.dumps({"wall_s": 7.0, "env_frames": 6}))
    assert result.latest == {"wall_s": 7.0, "env_frames": 6}


def test_the_newest_record_is_the_last_second_s_where_the_file_was_thinned(tmp_path, caplog):
    """After a day a thinned metrics.jsonl may hold nothing of the last minute: a resume and
    troupe status take latest.json, written each second, where it is the newer."""
    assert newest_record(tmp_path) is None
    write(tmp_path, [{"wall_s": 60.0, "env_frames": 600}, {"wall_s": 120.0, "env_frames": 1200}])
    assert newest_record(tmp_path) == {"wall_s": 120.0, "env_frames": 1200}  # no latest.json
    latest = tmp_path / "latest.json"
    latest.write_text(json.dumps({"wall_s": 179.0, "env_frames": 1790}))
    assert newest_record(tmp_path) == {"wall_s": 179.0, "env_frames": 1790}
    latest.write_text(json.dumps({"wall_s": 100.0, "env_frames": 1000}))  # an older one
    assert newest_record(tmp_path)["wall_s"] == 120.0
    for bad in ("{", "[1, 2]", '{"env_frames": 5}', '{"wall_s": "soon"}'):
        latest.write_text(bad)
        assert newest_record(tmp_path)["wall_s"] == 120.0, bad
    assert "latest.json is not a JSON object; using the last record of metrics.jsonl" in caplog.text
    (tmp_path / "metrics.jsonl").unlink()
    latest.write_text(json.dumps({"wall_s": 3.0}))
    assert newest_record(tmp_path) == {"wall_s": 3.0}
