"""The planning report: its recommendations are the estimator's ranking, every chart is there, both
renderings carry the same content with no missing value shown as nan/None, and `advisor report`
writes the files or fails in one sentence. A headless-Chromium screenshot runs where Chromium is."""

from __future__ import annotations

import dataclasses

import datetime as dt
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from advisor.calibration.reference import load_families
from advisor.cli.main import main
from advisor.estimate.costs import Job
from advisor.estimate.plan import EstimateSettings, estimate_model
from advisor.estimate.targets import database_targets
from advisor.hardware.loader import load_hwdb
from advisor.memory.plan import MemorySettings
from advisor.profile.model_file import load_model_file
from advisor.report.content import build_report
from advisor.report.render import render_html, write_report

GPUS = ("rtx-3090", "h100-sxm", "t4", "a100-sxm4-80gb", "rtx-4090", "rtx-3060")
CHARTS = ("time_vs_cost", "memory", "buy_vs_rent")
FIXED_TIME = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)
MISSING = re.compile(r"\b(nan|None|null|inf)\b", re.IGNORECASE)


@pytest.fixture(scope="module")
def estimate_and_db():
    """The MLP at batch 700,000 (about 13.5 GiB of training memory): fits the 16-80 GiB cards, not the
    12 GiB rtx-3060; 70,000,000 samples = 100 steps."""
    db = load_hwdb([])
    targets = database_targets(db, [db.gpu(i) for i in GPUS], load_families(db))
    settings = EstimateSettings(MemorySettings(700_000, "fp32", "adamw"), Job(samples=70_000_000, epochs=1))
    return estimate_model(load_model_file("mlp"), db, targets, settings), db


@pytest.fixture(scope="module")
def report(estimate_and_db):
    estimate, db = estimate_and_db
    return build_report(estimate, db, budget_usd=1e6, deadline_s=1.0, now=FIXED_TIME)


def visible_text(document: str) -> str:
    """The HTML's text as a reader sees it: SVG drawings, styles and tags removed."""
    document = re.sub(r"<svg.*?</svg>|<style>.*?</style>", " ", document, flags=re.DOTALL)
    return html.unescape(re.sub(r"<[^>]+>", " ", document))


def test_recommendations_are_the_estimators_ranking(estimate_and_db, report) -> None:
    estimate, _ = estimate_and_db
    chosen = {r.title: r.device for r in report.recommendations}
    assert chosen["Fastest"] == estimate.by_time()[0].id
    assert chosen["Cheapest to rent (on demand)"] == estimate.by_cost()[0].id
    assert chosen["Best value to buy"] == estimate.best_value_to_buy().id
    # a budget of a million USD buys every rentable device: the fastest of them
    fastest_rentable = min(estimate.by_cost(), key=lambda r: r.time_to_train_s)
    assert chosen["Fastest within 1,000,000 USD"] == fastest_rentable.id
    # a one-second deadline cannot be met (100 steps of 700,000 samples)
    assert chosen["Cheapest within 1.0 s"] == "no device"
    assert all(r.reason for r in report.recommendations)


def test_the_device_that_does_not_fit_is_set_apart(estimate_and_db, report) -> None:
    estimate, _ = estimate_and_db
    assert not estimate.result("rtx-3060").fits
    last = report.devices[-1]
    assert last.device == "rtx-3060" and not last.fits and last.step == "does not fit"
    assert last.throughput.endswith("GiB short")
    assert [d.device for d in report.devices[:-1]] == [r.id for r in estimate.by_time()]


def test_html_is_self_contained_with_every_chart_and_no_missing_values(report) -> None:
    document = render_html(report)
    assert document.startswith("<!DOCTYPE html>")
    for name in CHARTS:
        assert re.search(rf'<figure id="chart-{name}">\s*<h3>[^<]+</h3>\s*<svg', document), name
    assert "<script" not in document and "<link" not in document and 'src="http' not in document
    text = visible_text(document)
    assert not MISSING.findall(text), MISSING.findall(text)[:5]
    for device in GPUS:
        assert device in text
    assert "Price sources" in text and "Accuracy" in text and "typically within" in text
    # a document for a manager: no repository paths or commands
    assert not re.search(r"benchmarks/|\.\./shared|\.py\b|--part|`", text), re.findall(r".{30}benchmarks/.{30}", text)


def test_markdown_has_the_same_content_and_its_charts_beside_it(report, tmp_path: Path) -> None:
    written = write_report(report, tmp_path / "plan.md")
    assert [p.name for p in written] == ["plan.md", *(f"{name}.svg" for name in CHARTS)]
    text = (tmp_path / "plan.md").read_text()
    for name in CHARTS:
        assert f"](plan_charts/{name}.svg)" in text
        assert (tmp_path / "plan_charts" / f"{name}.svg").read_text().startswith("<svg")
    assert not MISSING.findall(text), MISSING.findall(text)[:5]
    for recommendation in report.recommendations:
        assert recommendation.device in text
    rows = [line for line in text.splitlines() if re.match(r"\| (\d+|-) \| ", line)]
    assert len(rows) == len(GPUS)  # the device table: one row per device


def test_markdown_renders_as_a_git_forge_renders_it(report, tmp_path: Path) -> None:
    """GitHub-flavoured Markdown (markdown-it-py's gfm-like preset, what Textual itself ships): every
    table parses as a table and every chart as an image."""
    from markdown_it import MarkdownIt

    write_report(report, tmp_path / "plan.md")
    rendered = MarkdownIt("gfm-like").render((tmp_path / "plan.md").read_text())
    # summary, model and job, memory, time by bound, top ops, devices, offers
    assert rendered.count("<table>") == 7
    assert re.findall(r'<img src="([^"]+)"', rendered) == [f"plan_charts/{name}.svg" for name in CHARTS]
    assert "|" not in re.sub(r"<table>.*?</table>", "", rendered, flags=re.DOTALL)  # no table left unparsed


def test_charts_are_deterministic(estimate_and_db) -> None:
    estimate, db = estimate_and_db
    first = build_report(estimate, db, now=FIXED_TIME)
    again = build_report(estimate, db, now=FIXED_TIME)
    assert [c.svg for c in first.charts] == [c.svg for c in again.charts]


def test_cli_writes_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.html"
    assert main(["report", "mlp", "--gpu", "rtx-3090", "--gpu", "t4", "-o", str(out), "--budget-usd", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert "Fastest within 1.00 USD" in visible_text(out.read_text())


@pytest.mark.parametrize("name, message", [
    ("plan.pdf", "cannot tell the report format from 'plan.pdf': name it .html or .md"),
    ("missing/plan.html", "folder"),
])
def test_cli_errors_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                     message: str) -> None:
    assert main(["report", "mlp", "--gpu", "t4", "-o", str(tmp_path / name)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("advisor: error: ") and message in error


def test_a_model_that_fits_nowhere_still_gets_its_report_and_exit_2(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.md"
    assert main(["report", "mlp", "--gpu", "rtx-3060", "--batch-size", "1000000", "--plans", "never",
                 "-o", str(out)]) == 2
    assert "does not fit on any of the 1 devices" in capsys.readouterr().err
    text = out.read_text()
    assert "**Does not fit** | `no device`" in text and "GiB short" in text


CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="needs a Chromium browser (apt install chromium)")
def test_html_renders_in_headless_chromium(report, tmp_path: Path) -> None:
    page = tmp_path / "plan.html"
    write_report(report, page)
    shot = tmp_path / "plan.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,2000", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 50_000  # a blank page is a few KB


def test_a_chart_that_would_be_empty_is_a_sentence(estimate_and_db) -> None:
    # only the rtx-3060 (12 GiB, the model needs 13.5): nothing fits, so nothing is rented or bought
    from advisor.report.charts import all_charts

    estimate, db = estimate_and_db
    nothing_fits = dataclasses.replace(estimate, results=tuple(r for r in estimate.results if not r.fits))
    charts = all_charts(nothing_fits)
    sentences = [c for c in charts if isinstance(c, str)]
    assert len(sentences) == 2 and sentences[0].startswith("Time to train against cost: no device")
    assert sentences[1].startswith("Buying against renting: no card")
    report = build_report(nothing_fits, db, now=FIXED_TIME)
    assert [c.name for c in report.charts] == ["memory"] and report.omitted_charts == tuple(sentences)


def test_the_time_axis_reads_in_planning_units(estimate_and_db) -> None:
    from advisor.report.charts import NICE_HOURS, _hours_label, _ticks

    # 16.6 d and 20.1 d (llama on b200 and h200-sxm): no nice value between, so 14 d and 30 d frame them
    ticks, low, high = _ticks(NICE_HOURS, 398 / 1.4, 482 * 1.4)
    assert [_hours_label(t) for t in ticks] == ["7 d", "14 d", "30 d"] and low < 24 * 7 and high > 24 * 30
    assert [_hours_label(h) for h in (1 / 6, 0.5, 1, 2, 48)] == ["10 min", "30 min", "1 h", "2 h", "2 d"]


def test_the_accuracy_section_quotes_the_multi_gpu_figures(tmp_path) -> None:
    from advisor.report.content import accuracy_lines

    path = tmp_path / "accuracy.yaml"
    path.write_text("date: '2026-11-24'\npublished: {rows: 244, median_abs_error: 0.153, mean_abs_error: 0.22, "
                    "bare_roofline_median_abs_error: 0.325}\nmulti_gpu: {rows: 354, median_abs_error: 0.304}\n"
                    "scaling_efficiency: {rows: 333, median_abs_error: 0.062}\n")
    text = " ".join(accuracy_lines(path))
    assert "354 published runs on 2, 4 and 8 GPUs" in text
    assert "within 6% of what was measured, and the training speed within 30%" in text
    path.write_text("date: '2026-11-24'\n")  # a file from before the multi-GPU rows: no such sentence
    assert "GPUs of one machine" not in " ".join(accuracy_lines(path))


def test_the_notes_an_estimate_ends_with_follow_the_summary(estimate_and_db, report, tmp_path: Path) -> None:
    # the MLP's step needs no note; the same step run on real values (weight-dependent control flow) does, in
    # both renderings, right after the summary
    estimate, db = estimate_and_db
    assert report.notes == ()
    real = dataclasses.replace(estimate, trace=dataclasses.replace(estimate.trace, values="real"))
    noted = build_report(real, db, now=FIXED_TIME)
    (note,) = noted.notes
    assert note.startswith("Note: the model branches on values computed from its weights")
    text = visible_text(render_html(noted))
    assert note in " ".join(text.split()) and text.index("Summary") < text.index(note[:40]) < text.index("The model")
    write_report(noted, tmp_path / "noted.md")
    assert f"> {note[:40]}" in (tmp_path / "noted.md").read_text().replace("\\", "")


def test_every_device_row_gives_its_mfu_in_html_and_markdown(estimate_and_db, report, tmp_path: Path) -> None:
    """MFU beside throughput (issue #28): each fitting device's row has its model FLOPs utilisation."""
    from advisor.present.format import mfu_cell

    estimate, _ = estimate_and_db
    rows = {row.device: row for row in report.devices}
    for result in estimate.results:
        assert rows[result.id].mfu == (mfu_cell(result.mfu) if result.fits else "-")
        assert rows[result.id].mfu != "-" or not result.fits
    document = render_html(report)
    assert "<th class=\"num\">MFU</th>" in document
    fastest = estimate.by_time()[0]
    assert f"{mfu_cell(fastest.mfu)} MFU" in next(r.reason for r in report.recommendations if r.title == "Fastest")
    write_report(report, tmp_path / "plan.md")
    markdown = (tmp_path / "plan.md").read_text()
    assert "| samples/s | MFU | train |" in markdown and f"| {rows[fastest.id].mfu} |" in markdown


def test_a_sequence_models_devices_give_tokens_per_second(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As the command line's table: a model with a sequence length counts tokens/s (samples/s x its length)."""
    out = tmp_path / "plan.md"
    assert main(["report", "gpt2_small", "--gpu", "h100-sxm", "--batch-size", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    markdown = out.read_text()
    assert "| step | tokens/s | MFU |" in markdown and "samples/s" not in markdown.split("## All devices")[1]
    assert main(["estimate", "gpt2_small", "--gpu", "h100-sxm", "--batch-size", "2", "--json"]) == 0
    tokens = json.loads(capsys.readouterr().out)["results"][0]["throughput_tokens_per_s"]
    row = next(line for line in markdown.splitlines() if line.startswith("| 1 | h100-sxm |"))
    assert f"| {tokens:,.0f} |" in row
    fastest = next(line for line in markdown.splitlines() if line.startswith("| **Fastest** |"))
    assert f"({tokens:,.0f} tokens/s, " in fastest and "samples/s" not in fastest  # as the CLI's summary
