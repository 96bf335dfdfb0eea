"""The attack table's runner: one bad input (arguments, files, environment) through the real entry
point, and what the contract says must come out of it (PRODUCT.md: one clear sentence on stderr and
exit 2 for bad input, 1 only for our own bugs, data alone on stdout, nothing lost).

Each area keeps its own table of `Attack` rows (tests/test_attacks_*.py) and runs it with
`check_attack`; a new finding is one more row. `{tmp}` in arguments, file names, file contents and
environment values stands for the case's temporary directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from advisor.cli.main import main

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Attack:
    """One attack and the outcome the contract requires."""

    name: str
    argv: tuple[str, ...]
    exit_code: int = 2
    stderr: str = ""
    """A regular expression that must be found in stderr ("" checks nothing)."""
    files: dict[str, str | bytes] = field(default_factory=dict)
    """Files written under the temporary directory before the run: relative name -> text or bytes."""
    env: dict[str, str] = field(default_factory=dict)
    json_stdout: bool = False
    """stdout must parse as JSON (when the exit code is 0) or be empty."""
    stdout: str | None = None
    """A regular expression stdout must match (None checks nothing)."""
    max_stderr_lines: int = 4
    """One sentence, perhaps with a note or two; never a traceback."""
    subprocess: bool = False
    """Run `python -m advisor` in a child process (exit behaviour, signals, threads) instead of main()."""
    timeout_s: float = 120.0
    setup: Callable[[Path], None] | None = None
    """Called with the temporary directory after the files are written (permissions, folders...)."""


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str


def _expand(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp))


def prepare(attack: Attack, tmp: Path) -> None:
    for name, content in attack.files.items():
        path = tmp / _expand(name, tmp)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(_expand(content, tmp), encoding="utf-8")
    if attack.setup is not None:
        attack.setup(tmp)


def run_attack(attack: Attack, tmp: Path, capfd: pytest.CaptureFixture[str],
               monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """Run the attack in `tmp` and return what came out."""
    prepare(attack, tmp)
    argv = [_expand(a, tmp) for a in attack.argv]
    env = {key: _expand(value, tmp) for key, value in attack.env.items()}
    if attack.subprocess:
        result = subprocess.run([sys.executable, "-m", "advisor", *argv], cwd=tmp, capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=attack.timeout_s)
        return Outcome(result.returncode, result.stdout, result.stderr)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capfd.readouterr()
    return Outcome(code, out, err)


def check_attack(attack: Attack, tmp: Path, capfd: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """Run the attack and assert the contract; returns the outcome for further checks."""
    outcome = run_attack(attack, tmp, capfd, monkeypatch)
    context = f"{attack.name}: exit {outcome.code}\nstdout: {outcome.stdout[-2000:]}\nstderr: {outcome.stderr[-3000:]}"
    assert outcome.code == attack.exit_code, context
    assert "Traceback (most recent call last)" not in outcome.stderr or attack.exit_code == 1, context
    if attack.exit_code != 0:
        assert len(outcome.stderr.strip().splitlines()) <= attack.max_stderr_lines, context
    if attack.stderr:
        assert re.search(attack.stderr, outcome.stderr), context
    if attack.json_stdout and outcome.stdout.strip():
        try:
            json.loads(outcome.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"stdout is not JSON ({exc})\n{context}") from exc
    if attack.stdout is not None:
        assert re.search(attack.stdout, outcome.stdout), context
    return outcome
