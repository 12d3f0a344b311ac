"""Which Troupe code a worker image holds (distributed/images/source.py): the digest a build
labels the image with, and the run's word when its image holds other code."""

from __future__ import annotations

from distributed.images import source


def test_the_digest_follows_the_code_and_nothing_else(tmp_path):
    package = tmp_path / "system"
    (package / "run").mkdir(parents=True)
    (package / "run" / "worker.py").write_text("x = 1\n")
    first = source.source_digest([package])
    (package / "run" / "__pycache__").mkdir()
    (package / "run" / "__pycache__" / "worker.cpython-311.pyc").write_bytes(b"\0")
    (package / "notes.txt").write_text("not code")
    assert source.source_digest([package]) == first
    (package / "run" / "worker.py").write_text("x = 2\n")
    assert source.source_digest([package]) != first
    (package / "run" / "worker.py").rename(package / "run" / "other.py")
    assert source.source_digest([package]) != first


def test_troupes_own_code_is_found_wherever_the_tests_run():
    """``tests/api`` and its like stood for the packages in a test session (namespace
    packages, no ``__file__``): the digest is made from the files beside this module."""
    assert all((source.HOME / p / "__init__.py").is_file() for p in source.PACKAGES)
    assert len(source.source_digest()) == 64


def test_an_image_of_other_code_is_said_and_one_that_says_nothing_is_not():
    assert source.stale_image({source.LABEL: source.source_digest()}, "w:1") is None
    assert source.stale_image({}, "w:1") is None and source.stale_image(None, "w:1") is None
    said = source.stale_image({source.LABEL: "0" * 64}, "w:1")
    assert said is not None and "`troupe image build --tag w:1`" in said
