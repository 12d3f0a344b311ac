"""The command blocks of README.md, docker/README.md and distributed/DEPLOY.md run as written.

Every ``bash`` block carries a marker comment just above it saying how it is checked:

- ``<!-- docs-test: run -->``: this module runs the block as written (bash, ``set -e``) in a
  scratch folder that has the project's ``.venv``; so only blocks that need no more than this
  machine are marked so;
- ``<!-- docs-test: tested-by PATH::TEST -->``: a test of the suite runs these commands (the
  marker names it, and this module checks that it exists);
- ``<!-- docs-test: needs WHAT -->``: the block needs what a CI machine does not have (a cluster,
  a registry, a GPU), said in the marker.

Whatever the marker, every ``troupe`` command line of every block is parsed by the real command
line parser, and the experiment and ``key=value`` overrides it names are resolved as ``troupe
run`` would: a README line that cannot work (a missing required option, an unknown key) fails
here, not on a user's machine.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docker/README.md", "distributed/DEPLOY.md")
MARKER = re.compile(r"<!-- docs-test: (run|tested-by|needs)\b\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    text: str
    marker: str | None
    detail: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    def commands(self) -> list[str]:
        """Each command of the block: continuation lines joined, comments dropped."""
        joined = self.text.replace("\\\n", " ")
        out = []
        for line in joined.splitlines():
            line = _strip_comment(line).strip()
            if line:
                out.extend(part.strip() for part in re.split(r"\s(?:&&|;)\s", line))
        return [c.rstrip("&").strip() for c in out if c]


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# ...`` comment (a ``#`` inside quotes stays)."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1] == " "):
            return line[:i]
    return line


def blocks() -> list[Block]:
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for m in re.finditer(r"```bash\n(.*?)```", text, re.S):
            before = text[: m.start()].rstrip("\n").splitlines()[-1:]
            marker = MARKER.search(before[0]) if before else None
            found.append(
                Block(
                    doc,
                    text[: m.start()].count("\n") + 1,
                    m.group(1),
                    marker.group(1) if marker else None,
                    marker.group(2) if marker else "",
                )
            )
    return found


BLOCKS = blocks()


def troupe_lines() -> list[tuple[str, list[str]]]:
    """(where, argv after ``troupe``) for every troupe command of every block."""
    out = []
    for block in BLOCKS:
        for command in block.commands():
            argv = shlex.split(command)
            for i, token in enumerate(argv):  # redirections and pipes are the shell's
                if token == "|" or re.match(r"^\d?>|^<", token):
                    argv = argv[:i]
                    break
            if argv and Path(argv[0]).name == "troupe":
                out.append((block.where, argv[1:]))
    return out


def test_every_block_says_how_it_is_checked():
    unmarked = [b.where for b in BLOCKS if b.marker is None]
    assert not unmarked, (
        "bash blocks without a <!-- docs-test: run | tested-by PATH::TEST | needs WHAT --> "
        f"marker on the line above: {unmarked}"
    )
    assert len(BLOCKS) >= 25  # the three documents' blocks were found


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.marker == "tested-by"],
                         ids=lambda b: b.where)  # fmt: skip
def test_the_named_test_exists(block):
    path, _, name = block.detail.partition("::")
    assert (ROOT / path).exists(), f"{block.where}: {path} does not exist"
    if name:
        assert re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), (
            f"{block.where}: {path} has no test {name}"
        )


def test_a_needs_marker_says_what():
    for block in BLOCKS:
        if block.marker == "needs":
            assert len(block.detail) > 5, f"{block.where}: say what the block needs"


@pytest.mark.parametrize("where,argv", troupe_lines(), ids=lambda x: x if isinstance(x, str)
                         else " ".join(x)[:60])  # fmt: skip
def test_every_troupe_line_parses_and_names_a_real_experiment(where, argv):
    from distributed.cli import _parse, build_parser

    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as e:
        pytest.fail(f"{where}: `troupe {' '.join(argv)}` is refused by the parser ({e})")
    _check_experiment(where, args)


def _check_experiment(where: str, args) -> None:
    """The experiment and overrides of run/train/show-config/test-pipeline/deploy resolve, when
    the experiment is a registered name or an environment id (a user's file or a placeholder
    path is theirs to write)."""
    from api.resolve import load_experiment

    experiment = getattr(args, "experiment", None)
    if getattr(args, "resume", None):
        return  # a resume's words are overrides of a run folder's own config
    if not isinstance(experiment, str) or "/" in experiment or experiment.endswith(".py"):
        return
    if getattr(args, "imports", None) or args.command in ("train", "test-env"):
        return  # a user's module, or a command whose arguments are the environment's own
    overrides = [o for o in getattr(args, "overrides", []) or [] if "=" in o]
    try:
        load_experiment(experiment, overrides)
    except Exception as e:
        pytest.fail(f"{where}: `{experiment} {' '.join(overrides)}` does not resolve: {e}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.marker == "run"], ids=lambda b: b.where)
def test_the_block_runs_as_written(block, tmp_path):
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, (
        f"{block.where} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def test_the_checks_refuse_a_line_that_cannot_work():
    """What the parse check would say of the README's Slurm line before it was fixed (a
    required option missing) and of a misspelt key: so the checks above can fail."""
    from distributed.cli import _parse, build_parser

    with pytest.raises(SystemExit):
        _parse(build_parser(), ["deploy", "slurm", "cartpole-ppo", "--out", "slurm/"])
    args = _parse(build_parser(), ["run", "cartpole-ppo", "actors.wokers=4"])
    with pytest.raises(pytest.fail.Exception, match="does not resolve"):
        _check_experiment("README.md:1", args)
    unmarked = Block("X.md", 1, "troupe list\n", None, "")
    assert unmarked.commands() == ["troupe list"]
