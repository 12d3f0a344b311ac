"""The parameter client's shared-memory side (system.parameters.shm_link) on a real shared-memory
area: a large version written once and mapped back, small or unnameable ones left to the socket,
and the fallback to full pushes after repeated failures."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from system.parameters.shm_link import SHM_FAILURES, ShmLink, _min_bytes
from system.streams import shm


@pytest.fixture
def area(tmp_path, monkeypatch):
    monkeypatch.setenv(shm.ENV_DIR, str(tmp_path))  # the client's configured directory
    area = shm.ShmArea(tmp_path)
    yield area
    area.close()


def _link(switches: list, min_bytes: int = 0) -> ShmLink:
    return ShmLink(
        "tcp://h:1", wanted=True, min_bytes=min_bytes, stats=Counter(), bad=pytest.fail,
        on_switch=switches.append,
    )  # fmt: skip


def test_a_version_goes_through_the_file_and_comes_back_the_same(area):
    switches: list = []
    link = _link(switches)
    assert link.write("p", 1, {"w": np.ones(4, np.float32)}, False) is None  # no hello yet
    link.on_hello(area.info())
    assert switches == [True] and link.peer is not None
    params = {"w": np.arange(1000, dtype=np.float32), "b": np.zeros(3, np.float64)}
    layout = link.write("p", 7, params, False)
    assert layout is not None
    area.adopt(layout["name"])  # as the service does when it takes the version
    link.published(layout)
    back = link.map_notice("p", 7, layout, writable=False)
    assert np.array_equal(back["w"], params["w"]) and back["b"].dtype == np.float64
    assert link.stats["shm_publishes"] == 1 and link.stats["shm_pushes"] == 1
    link.close()


def test_small_or_unnameable_versions_go_by_socket(area, monkeypatch):
    link = _link([], min_bytes=1 << 20)
    link.on_hello(area.info())
    assert link.write("p", 1, {"w": np.ones(4, np.float32)}, False) is None  # too small
    link.min_bytes = 0
    assert link.write("bad/name", 1, {"w": np.ones(4)}, False) is None
    assert link.write("p", -1, {"w": np.ones(4)}, False) is None
    assert link.write("p", 1, {"w": np.ones(4)}, "yes") is None
    monkeypatch.setenv("TROUPE_SHM_MIN_BYTES", "0")
    assert _min_bytes() == 0
    monkeypatch.setenv("TROUPE_SHM_MIN_BYTES", "lots")
    assert _min_bytes() == 1 << 20  # ignored, with a warning
    link.close()


def test_notices_that_cannot_be_mapped_send_the_client_back_to_full_pushes(area):
    switches: list = []
    link = _link(switches)
    link.on_hello(area.info())
    gone = link.write("p", 1, {"w": np.ones(100, np.float32)}, False)
    link.discard(gone)  # the service dropped it: its notice points at nothing
    for _ in range(SHM_FAILURES):
        assert link.map_notice("p", 1, gone, writable=False) is None
    assert switches == [True, False] and link.peer is None and not link.wanted
    assert link.stats["shm_missed"] == SHM_FAILURES and link.stats["shm_failures"] == 1
    link.on_hello(area.info())  # asked again: stays on the socket for good
    assert link.peer is None and switches == [True, False]
