"""system.logs: the console keeps to warnings, the run folder keeps the INFO story of each
process, bounded by rotation, in text or JSON lines."""

from __future__ import annotations

import json
import logging
import os

import pytest

from system import logs


@pytest.fixture
def clean_root():
    """Give the root logger back as it was: the tests replace its handlers."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_info_goes_to_the_run_folder_while_the_console_shows_warnings(
    tmp_path, clean_root, capsys, monkeypatch
):
    monkeypatch.delenv(logs.ENV_LEVEL, raising=False)
    monkeypatch.delenv(logs.ENV_FORMAT, raising=False)
    logs.configure_process("actor/3")
    path = logs.keep_in_run_folder(tmp_path, "actor/3")
    assert path == tmp_path / "logs" / "actor-3.log"
    log = logging.getLogger("troupe.test")
    log.info("configured")
    log.warning("slow environment")
    for handler in clean_root.handlers:
        handler.flush()
    text = path.read_text()
    assert "actor/3 INFO troupe.test: configured" in text
    assert "actor/3 WARNING troupe.test: slow environment" in text
    console = capsys.readouterr().err
    assert "slow environment" in console and "configured" not in console


def test_a_notice_reaches_the_console_as_a_notice_and_warning_level_hides_it(
    tmp_path, clean_root, capsys, monkeypatch
):
    """A PBT member copying another is not a problem; it was logged as a WARNING to be seen."""
    monkeypatch.delenv(logs.ENV_FORMAT, raising=False)
    log = logging.getLogger("troupe.test")
    monkeypatch.delenv(logs.ENV_LEVEL, raising=False)
    logs.configure_process("controller")
    log.log(logs.NOTICE, "pbt: member1 copies member3")
    assert "controller NOTICE troupe.test: pbt: member1 copies member3" in capsys.readouterr().err
    monkeypatch.setenv(logs.ENV_LEVEL, "warning")
    logs.configure_process("controller")
    log.log(logs.NOTICE, "pbt: member2 copies member3")
    log.warning("slow environment")
    console = capsys.readouterr().err
    assert "member2" not in console and "slow environment" in console


def test_the_log_file_rotates_and_stays_bounded(tmp_path, clean_root, monkeypatch):
    monkeypatch.setattr(logs, "FILE_BYTES", 2000)
    monkeypatch.setattr(logs, "FILE_BACKUPS", 2)
    logs.configure_process("trainer/default/0")
    path = logs.keep_in_run_folder(tmp_path, "trainer/default/0")
    log = logging.getLogger("troupe.test")
    for n in range(500):
        log.info("step %d of a long run", n)
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["trainer-default-0.log", "trainer-default-0.log.1", "trainer-default-0.log.2"]
    assert sum(p.stat().st_size for p in path.parent.iterdir()) <= 3 * 2000
    assert "step 499 of a long run" in path.read_text()  # the newest lines are kept


def test_json_lines_on_request(tmp_path, clean_root, monkeypatch):
    monkeypatch.setenv(logs.ENV_FORMAT, "json")
    logs.configure_process("params")
    path = logs.keep_in_run_folder(tmp_path, "params")
    log = logging.getLogger("troupe.test")
    log.info("served %d versions", 3)
    try:
        raise ValueError("broken")
    except ValueError:
        log.exception("a failure")
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    assert entries[0]["message"] == "served 3 versions" and entries[0]["worker"] == "params"
    assert entries[0]["level"] == "INFO" and entries[0]["time"].endswith("Z")
    assert "ValueError: broken" in entries[1]["traceback"]


def test_a_folder_the_process_cannot_see_or_write_keeps_the_console_only(tmp_path, clean_root):
    logs.configure_process("actor/0")
    assert logs.keep_in_run_folder(tmp_path / "not-mounted", "actor/0") is None
    assert not (tmp_path / "not-mounted").exists()  # nothing made where the folder is absent
    if os.geteuid() != 0:  # root writes anywhere
        read_only = tmp_path / "ro"
        read_only.mkdir(mode=0o555)
        assert logs.keep_in_run_folder(read_only, "actor/0") is None


def test_a_wrong_setting_names_itself(monkeypatch, clean_root):
    monkeypatch.setenv(logs.ENV_FORMAT, "xml")
    with pytest.raises(ValueError, match="TROUPE_LOG_FORMAT='xml'"):
        logs.configure_process("actor/0")
    monkeypatch.setenv(logs.ENV_FORMAT, "text")
    monkeypatch.setenv(logs.ENV_LEVEL, "LOUD")
    with pytest.raises(ValueError, match="TROUPE_LOG_LEVEL='LOUD'"):
        logs.configure_process("actor/0")
