"""The estimate's output formats (issue #23): a table that fits the width it is given ($COLUMNS, also
when piped), CSV and Markdown with every column, --json unchanged, --quiet, readable money."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from advisor.cli.main import main
from advisor.cli.table import Column, fit_columns, render_markdown, render_table
from advisor.present.format import money

GPUS = ("--gpu", "h100-sxm", "--gpu", "rtx-3090", "--gpu", "t4", "--gpu", "a100-sxm4-80gb")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("width", [80, 100, 120])
def test_every_line_fits_the_width_in_columns(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                              width: int) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, err = run(capsys, "estimate", "mlp", *GPUS)
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= width
    table = next(line for line in out.splitlines() if line.split()[:2] == ["#", "Device"])
    assert "Train" in table and "Job $" in table and "Peak/Mem GiB" in table  # never dropped


def test_a_pipe_without_columns_gets_every_column(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = run(capsys, "estimate", "mlp", *GPUS)
    assert code == 0
    header = next(line for line in out.splitlines() if line.split()[:2] == ["#", "Device"])
    assert header.split() == ["#", "Device", "Peak/Mem", "GiB", "Max", "bs", "Step", "Samples/s", "Train", "Bound",
                              "Cheapest", "cloud", "Job", "$", "Spot", "$", "Buy", "$", "Calib", "GPUs", "MFU"]


@pytest.mark.slow
def test_the_real_command_fits_80_columns_when_piped() -> None:
    done = subprocess.run([sys.executable, "-m", "advisor", "estimate", "mlp", *GPUS], capture_output=True, text=True,
                          env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


def test_csv_has_every_device_and_column(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # the width is for the terminal table only
    code, out, _ = run(capsys, "estimate", "mlp", *GPUS, "--format", "csv")
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0][:3] == ["#", "Device", "Peak/Mem GiB"] and len(rows[0]) == 15 and rows[0][-2:] == ["GPUs", "MFU"]
    assert sorted(row[1] for row in rows[1:]) == sorted(GPUS[1::2])


def test_every_device_row_shows_the_mfu_of_its_json(capsys: pytest.CaptureFixture[str]) -> None:
    """MFU beside throughput in the table as in --json: the step's FLOPs / step time / the peak (issue #28)."""
    code, out, _ = run(capsys, "estimate", "mlp", *GPUS, "--format", "csv")
    assert code == 0
    shown = {row[1]: row[-1] for row in list(csv.reader(io.StringIO(out)))[1:]}
    code, out, _ = run(capsys, "estimate", "mlp", *GPUS, "--json")
    results = json.loads(out)["results"]
    assert results and all(r["mfu"] is not None for r in results)
    for result in results:
        mfu = result["mfu"]
        assert 0 < mfu < 1
        assert shown[result["gpu_id"]] == (f"{100 * mfu:.0f}%" if mfu >= 0.095 else f"{100 * mfu:.1f}%")


def test_markdown_is_a_table_with_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "mlp", *GPUS, "--format", "markdown")
    assert code == 0
    assert "| # | Device | Peak/Mem GiB |" in out and "|---:|---|---:|" in out
    assert "- Fastest: " in out


def test_format_json_is_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "mlp", "--gpu", "t4", "--format", "json")
    assert code == 0 and json.loads(out)["results"][0]["gpu_id"] == "t4"


def test_quiet_silences_notes(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    from tests.test_cli_gpus import TINY_GPU, write_yaml

    write_yaml(tmp_path / "mine.yaml", {"gpus": [{**TINY_GPU, "id": "rtx-3090", "memory_gb": 48, "sources": ["P23"]}]})
    code, _, err = run(capsys, "gpus", "--hwdb", str(tmp_path), "--json")
    assert code == 0 and "advisor: note:" in err  # the override is noted...
    code, _, err = run(capsys, "gpus", "--hwdb", str(tmp_path), "--json", "--quiet")
    assert code == 0 and err == ""  # ...unless --quiet


def test_columns_give_way_in_their_order() -> None:
    columns = [Column("a"), Column("b", drop_order=2), Column("c", drop_order=1), Column("d")]
    rows = [["aaaa", "bbbb", "cccc", "dddd"]]
    # all four: 4 x 4 + 3 x 2 = 22 characters; without c: 16; without b and c: 10
    assert [c.header for c in fit_columns(columns, rows, 22)[0]] == ["a", "b", "c", "d"]
    assert [c.header for c in fit_columns(columns, rows, 21)[0]] == ["a", "b", "d"]
    assert [c.header for c in fit_columns(columns, rows, 12)[0]] == ["a", "d"]
    assert render_table(columns, rows, 5).splitlines()[0] == "a     d"  # never-dropped ones stay
    assert render_markdown([Column("x|y", True)], [["1|2"]]) == "| x\\|y |\n|---:|\n| 1\\|2 |"


@pytest.mark.parametrize("usd, text", [(None, "-"), (0.0, "0"), (9.8e-05, "<0.01"), (0.0123, "0.01"),
                                       (0.57, "0.57"), (12.345, "12.35"), (1234.4, "1,234"), (3.46e12, "3.46 T")])
def test_money_reads_as_people_write_it(usd: float | None, text: str) -> None:
    assert money(usd) == text


@pytest.mark.parametrize("command", ["estimate", "profile", "memory", "report", "calibrate", "gpus"])
def test_every_help_shows_examples_that_parse(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    import shlex

    from advisor.cli.main import build_parser

    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    examples = out[out.index("examples:"):].splitlines()[1:]
    commands = [line.strip() for line in examples if line.strip().startswith("advisor ")]
    assert len(commands) >= 3
    for line in commands:  # each example is a valid command line (what it runs is tested elsewhere)
        argv = shlex.split(line.split(" > ")[0])[1:]
        build_parser().parse_args(argv)


def test_colour_only_on_request_of_the_terminal(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # 2^20 MNIST images: 19.5 GiB on an H100 (fits: the fastest, green), t4's 16 GiB does not (red)
    argv = ("estimate", "mlp", "--gpu", "t4", "--gpu", "h100-sxm", "--batch-size", "1048576")
    monkeypatch.setenv("FORCE_COLOR", "1")
    code, out, _ = run(capsys, *argv)
    lines = out.splitlines()
    assert any(line.startswith("\x1b[32m") and "h100-sxm" in line for line in lines)
    assert any(line.startswith("\x1b[31m") and "t4" in line for line in lines)
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("NO_COLOR", "1")
    code, out, _ = run(capsys, *argv)
    assert "\x1b[" not in out  # NO_COLOR, and a pipe (capsys) never gets colour either


@pytest.mark.parametrize("mfu, text", [(None, "-"), (0.412, "41%"), (0.095, "10%"), (0.0123, "1.2%")])
def test_mfu_reads_as_a_percentage(mfu: float | None, text: str) -> None:
    from advisor.present.format import mfu_cell

    assert mfu_cell(mfu) == text


def test_sort_by_mfu_puts_the_highest_first(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "mlp", *GPUS, "--sort", "mfu", "--format", "csv")
    assert code == 0
    shown = [float(row[-1].rstrip("%")) for row in list(csv.reader(io.StringIO(out)))[1:] if row[-1]]
    assert len(shown) == 4 and shown == sorted(shown, reverse=True)


def test_a_sequence_models_summary_gives_tokens_per_second(capsys: pytest.CaptureFixture[str]) -> None:
    """Every speed the summary gives for a sequence model is in tokens/s, as its table's column."""
    code, out, _ = run(capsys, "estimate", "gpt2_small", "--gpu", "rtx-4090", "--batch-size", "2",
                       "--max-price-usd", "5000")
    assert code == 0
    code, js, _ = run(capsys, "estimate", "gpt2_small", "--gpu", "rtx-4090", "--batch-size", "2", "--json")
    tokens = json.loads(js)["results"][0]["throughput_tokens_per_s"]
    best_value = next(line for line in out.splitlines() if line.startswith("Best value to buy:"))
    within = next(line for line in out.splitlines() if line.startswith("Fastest card within"))
    for line in (best_value, within):  # "... 1,599 USD for 25,600 tokens/s" (samples/s x 1,024 tokens)
        assert f"USD for {tokens:,.0f} tokens/s" in line and "sequences/s" not in line, line
