"""Issue 25, item 3: checkpoints that prove themselves, and a folder that stays bounded.

Every file a run resumes from (a version's parameters, ``latest.ckpt``, the trainer's state, the
replay buffer) ends with a checksum of its contents: a flipped byte anywhere is refused on load,
the store skips a damaged file for the newest good one (naming it), and numbered checkpoints are
pruned to ``keep_last`` (tagged versions and ``keep_every`` multiples kept).
"""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest

from system.parameters.checkpoint_file import (
    DamagedCheckpointError,
    load_checkpoint_file,
    write_checkpoint,
)
from system.parameters.store import (
    LATEST_FILE,
    TRAINER_FILE,
    TRAINER_PREVIOUS_FILE,
    ParameterStore,
)
from system.run_folder import write_atomically
from system.workers import replay_worker

FLIPS = 100


def _params(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=(64, 32)).astype(np.float32), "b": np.zeros(32, np.float32)}


def _run_folder(tmp_path):
    """A store like a run's service after a few publishes: every file kind on disk."""
    store = ParameterStore(tmp_path, durable=True)
    store.publish("default", 1, _params(1), persist=True, trainer_state={"step": np.array(1)})
    store.publish("default", 2, _params(2), persist=True, trainer_state={"step": np.array(2)})
    store.publish("default", 3, _params(3))  # latest.ckpt only
    return tmp_path / "checkpoints" / "default"


def _replay_file(tmp_path):
    """A saved buffer's layout (``ReplayBuffer.state_dict``): arrays by name."""
    rng = np.random.default_rng(0)
    state = {
        "store/obs": rng.normal(size=(8, 16, 4)).astype(np.float32),
        "store/action": rng.integers(0, 2, size=(8, 16)),
        "stamp": np.arange(8),
        "valid": np.ones(8, bool),
        "serial": np.array(8),
        "limiter/inserted": np.array(128),
    }
    path = tmp_path / "replay.ckpt"
    record = {"policy": "default", "replay": state}
    write_atomically(path, lambda f: write_checkpoint(f, record))
    return path


def _flipped(data: bytes, offset: int, rng: random.Random) -> bytes:
    damaged = bytearray(data)
    damaged[offset] ^= rng.randrange(1, 256)  # at least one bit differs
    return bytes(damaged)


@pytest.mark.parametrize("kind", ["v00000002.ckpt", LATEST_FILE, TRAINER_FILE, "replay.ckpt"])
def test_a_flipped_byte_anywhere_in_any_checkpoint_kind_is_detected(tmp_path, kind):
    folder = _run_folder(tmp_path)
    if kind == "replay.ckpt":
        path, read = _replay_file(tmp_path), replay_worker._read_state
    else:
        field = "trainer" if kind == TRAINER_FILE else "params"
        path = folder / kind

        def read(p):
            return load_checkpoint_file(p, field=field)

    data = path.read_bytes()
    read(path)  # whole, it loads
    rng = random.Random(kind)
    victim = tmp_path / f"damaged-{kind}"
    offsets = rng.sample(range(len(data)), FLIPS)
    for offset in offsets:
        victim.write_bytes(_flipped(data, offset, rng))
        with pytest.raises(DamagedCheckpointError) as e:
            read(victim)
        assert str(victim) in str(e.value), offset


def test_4kb_zeroed_in_the_newest_files_falls_back_to_the_previous_good_one(tmp_path, caplog):
    """The issue's case: header intact, the middle zeroed, in the newest numbered checkpoint
    and in latest.ckpt: the store resumes from the previous version and names both files."""
    store = ParameterStore(tmp_path, durable=True)
    for version in range(1, 4):
        store.publish("default", version, _params(version) | {"big": np.ones(4096, np.float32)},
                      persist=True)  # fmt: skip
    folder = tmp_path / "checkpoints" / "default"
    store.publish("default", 4, _params(4) | {"big": np.ones(4096, np.float32)})
    for name in ("v00000003.ckpt", LATEST_FILE):
        data = bytearray((folder / name).read_bytes())
        middle = len(data) // 2
        data[middle : middle + 4096] = bytes(4096)
        (folder / name).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        resumed = ParameterStore(tmp_path)
        assert resumed.load_from_disk() == {"default": 2}
    version, params = resumed.get("default")
    assert version == 2
    np.testing.assert_array_equal(params["w"], _params(2)["w"])
    assert "v00000003.ckpt is damaged: its checksum does not match" in caplog.text
    assert f"{LATEST_FILE} is damaged: its checksum does not match" in caplog.text


def test_a_damaged_trainer_state_falls_back_to_the_previous_one(tmp_path, caplog):
    folder = _run_folder(tmp_path)
    assert (folder / TRAINER_PREVIOUS_FILE).is_file()
    data = bytearray((folder / TRAINER_FILE).read_bytes())
    data[20] ^= 0xFF
    (folder / TRAINER_FILE).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        version, state = ParameterStore(tmp_path).trainer_state("default")
    assert version == 1 and int(state["step"]) == 1
    assert f"{TRAINER_FILE} is damaged" in caplog.text


def test_a_trainer_state_newer_than_the_parameters_restored_is_not_given(tmp_path, caplog):
    """Version 2's parameters damaged (and latest.ckpt's 3): the store resumed from version 1
    but handed the trainer version 2's optimiser state and step count."""
    folder = _run_folder(tmp_path)
    for name in ("v00000002.ckpt", LATEST_FILE):
        data = bytearray((folder / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (folder / name).write_bytes(bytes(data))
    resumed = ParameterStore(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert resumed.load_from_disk() == {"default": 1}
        version, state = resumed.trainer_state("default")
    assert version == 1 and int(state["step"]) == 1  # trainer.prev.ckpt's, saved with it
    assert "the trainer state of version 2, newer than the parameters restored" in caplog.text
    (folder / TRAINER_PREVIOUS_FILE).unlink()
    assert resumed.trainer_state("default") is None  # none that fits: the trainer starts afresh


def test_numbered_checkpoints_are_pruned_to_keep_last_but_tags_and_multiples_stay(tmp_path):
    store = ParameterStore(tmp_path, durable=True, keep_files=3, keep_every=10)
    for version in range(1, 26):
        store.publish("default", version, _params(0), persist=True)
        if version == 7:
            store.tag("default", 7, "eval")
    folder = tmp_path / "checkpoints" / "default"
    kept = sorted(int(p.stem[1:]) for p in folder.glob("v*.ckpt"))
    assert kept == [7, 10, 20, 23, 24, 25]
    resumed = ParameterStore(tmp_path)
    resumed.load_from_disk()
    assert resumed.get("default", 7)[0] == 7  # the tagged version still loads


def test_a_reader_never_removes_files(tmp_path):
    writer = ParameterStore(tmp_path, durable=True)
    for version in range(1, 6):
        writer.publish("default", version, _params(0), persist=True)
    reader = ParameterStore(tmp_path, keep_files=1)  # troupe eval: not durable
    reader.load_from_disk()
    assert len(list((tmp_path / "checkpoints" / "default").glob("v*.ckpt"))) == 5


def test_checkpoints_of_older_runs_without_a_checksum_still_load(tmp_path):
    """Files written before the checksum (magic TROUPECK) are read as they were."""
    import struct

    from system.streams import wire

    frames = wire.encode("checkpoint", {"policy": "default", "version": 5, "params": _params(5)})
    path = tmp_path / "checkpoints" / "default" / "v00000005.ckpt"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.write(b"TROUPECK" + struct.pack("<I", len(frames)))
        for frame in frames:
            view = memoryview(frame).cast("B")
            f.write(struct.pack("<Q", view.nbytes))
            f.write(view)
    store = ParameterStore(tmp_path)
    assert store.load_from_disk() == {"default": 5}
