"""Attacks on `advisor report` (issue #19): where the report goes (a folder, a missing or read-only
folder, a full disk) and what names it carries (HTML, Markdown, newlines, pipes, backticks and
javascript: links in a model's, GPU's, provider's or source's name). Bad places end in one sentence and
exit 2 with the previous report whole; names show as themselves, never as markup or a live link."""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import os
import re
import time
from pathlib import Path

import pytest

from advisor.calibration.reference import load_families
from advisor.errors import UserError
from advisor.estimate.costs import Job
from advisor.estimate.plan import EstimateSettings, estimate_model
from advisor.estimate.targets import database_targets
from advisor.hardware.loader import load_hwdb
from advisor.hardware.specs import Source
from advisor.memory.plan import MemorySettings
from advisor.profile.model_file import load_model_file
from advisor.report.content import build_report
from advisor.report.render import (
    TEMPORARY_SUFFIX,
    http_url,
    markdown_code,
    markdown_text,
    markdown_url,
    remove_stale_temporaries,
    render_html,
    render_markdown,
    write_atomically,
    write_report,
)
from tests.attacks import Attack, check_attack

GPU = "rtx-3090"
REPORT = ("report", "mlp", "--gpu", GPU, "--batch-size", "64")
FIXED_TIME = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)
OLD = "the previous report\n"


def _chmod(name: str, mode: int):
    def setup(tmp: Path) -> None:
        (tmp / name).chmod(mode)
    return setup


ATTACKS = [
    # every one of these is refused before the model is traced
    Attack("output_is_an_existing_folder", (*REPORT, "-o", "{tmp}/out/plan.html"), files={"out/plan.html/.keep": ""},
           stderr=r"cannot write \S*/out/plan\.html: it is a folder; name a file such as \S*plan\.html/plan\.html"),
    Attack("output_is_the_working_folder", (*REPORT, "-o", "{tmp}"), files={".keep": ""},
           stderr=r"cannot write \S+: it is a folder; name a file such as"),
    Attack("output_folder_does_not_exist", (*REPORT, "-o", "{tmp}/nowhere/plan.html"),
           stderr=r"cannot write \S*/nowhere/plan\.html: folder \S*/nowhere does not exist"),
    Attack("output_folder_is_a_file", (*REPORT, "-o", "{tmp}/notes.txt/plan.md"), files={"notes.txt": "x"},
           stderr=r"cannot write \S*/notes\.txt/plan\.md: folder \S*/notes\.txt is not a folder"),
    Attack("chart_folder_is_a_file", (*REPORT, "-o", "{tmp}/plan.md"), files={"plan_charts": "not a folder"},
           stderr=r"cannot write the charts into \S*/plan_charts: it is a file, not a folder"),
    Attack("output_folder_read_only", (*REPORT, "-o", "{tmp}/ro/plan.html"), files={"ro/plan.html": OLD},
           setup=_chmod("ro", 0o500), stderr=r"cannot write \S*/ro/plan\.html: folder \S*/ro is read-only"),
    # a place that takes no files though it looks writable (root may write /proc, which makes none)
    Attack("output_in_proc", (*REPORT, "-o", "/proc/plan.html"),
           stderr=r"cannot write /proc/plan\.html: (folder /proc is read-only|No such file or directory; the file was "
                  r"not created|Permission denied; the file was not created)"),
]

NEEDS_PERMISSIONS = {"output_folder_read_only"}
"""chmod does not stop root: as root this runs simulated (test_read_only_folder_simulated)."""


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_report_attack(attack: Attack, tmp_path: Path, capfd: pytest.CaptureFixture[str],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    if attack.name in NEEDS_PERMISSIONS and os.geteuid() == 0:
        pytest.skip("root writes whatever the folder's mode")
    if attack.name == "output_in_proc" and not os.path.isdir("/proc"):
        pytest.skip("needs /proc")
    started = time.perf_counter()
    outcome = check_attack(attack, tmp_path, capfd, monkeypatch)
    if attack.name != "output_in_proc":  # the others are refused before the model is traced
        assert time.perf_counter() - started < 10
    assert outcome.stdout == ""
    for name, content in attack.files.items():  # nothing the user had is lost
        if isinstance(content, str) and content and (tmp_path / name).is_file():
            assert (tmp_path / name).read_text() == content


def test_full_disk_through_the_cli_keeps_the_previous_report(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC on the write (simulated where the data reaches the disk): one sentence, exit 2, the old
    report byte for byte, no temporary left. Before, the report was truncated first: 0 bytes."""

    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    check_attack(Attack("full_disk", (*REPORT, "-o", "{tmp}/plan.html"), files={"plan.html": OLD},
                        stderr=r"cannot write \S*plan\.html: No space left on device; the previous file is unchanged"),
                 tmp_path, capfd, monkeypatch)
    assert (tmp_path / "plan.html").read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.html"]


# ----------------------------------------------------------------------------- the writer


@pytest.fixture(scope="module")
def estimate_and_db():
    db = load_hwdb([])
    targets = database_targets(db, [db.gpu(GPU), db.gpu("t4")], load_families(db))
    settings = EstimateSettings(MemorySettings(64, "fp32", "adamw"), Job(samples=640_000, epochs=1))
    return estimate_model(load_model_file("mlp"), db, targets, settings), db


@pytest.fixture(scope="module")
def report(estimate_and_db):
    estimate, db = estimate_and_db
    return build_report(estimate, db, now=FIXED_TIME)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(f"*{TEMPORARY_SUFFIX}"))


@pytest.mark.parametrize("name", ["plan.html", "plan.md"])
def test_a_failed_write_leaves_the_previous_report_whole(report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         name: str) -> None:
    before = write_report(report, tmp_path / name)
    (tmp_path / name).write_text(OLD)
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(UserError, match=r"No space left on device; the previous file is unchanged"):
        write_report(report, tmp_path / name)
    assert (tmp_path / name).read_text() == OLD
    assert all(path.read_text().startswith("<svg") for path in before[1:])  # Markdown's charts: whole
    assert _leftovers(tmp_path) == []


def test_read_only_folder_simulated(report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plan.html").write_text(OLD)
    real_open = os.open

    def read_only(path: object, flags: int, mode: int = 0o777, **kwargs: object) -> int:
        if str(path).endswith(TEMPORARY_SUFFIX):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(UserError, match=r"cannot write \S+plan\.html: Read-only file system; the previous file is"):
        write_report(report, tmp_path / "plan.html")
    assert (tmp_path / "plan.html").read_text() == OLD


def test_a_new_file_that_cannot_be_written_says_nothing_was_written(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    with pytest.raises(UserError, match=r"plan\.md: Permission denied; the file was not created"):
        write_atomically(tmp_path / "plan.md", "text")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_write_removes_its_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plan.html").write_text(OLD)
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "plan.html", "new")
    assert (tmp_path / "plan.html").read_text() == OLD and _leftovers(tmp_path) == []


def test_the_write_keeps_permissions_and_goes_through_links(tmp_path: Path) -> None:
    (tmp_path / "plan.html").write_text(OLD)
    (tmp_path / "plan.html").chmod(0o640)
    write_atomically(tmp_path / "plan.html", "new")
    assert (tmp_path / "plan.html").read_text() == "new"
    assert (tmp_path / "plan.html").stat().st_mode & 0o777 == 0o640
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "real.html").write_text(OLD)
    (tmp_path / "link.html").symlink_to(tmp_path / "site" / "real.html")
    write_atomically(tmp_path / "link.html", "through")
    assert (tmp_path / "link.html").is_symlink() and (tmp_path / "site" / "real.html").read_text() == "through"


def test_stale_temporaries_of_a_killed_run_are_removed(tmp_path: Path) -> None:
    """`.NAME.PID.HEX.advisor-tmp`: removed when PID no longer runs or it is over an hour old; a fresh
    one of a running process, another file's and anything not named so are left alone."""
    dead = tmp_path / f".plan.html.999999999.ab12{TEMPORARY_SUFFIX}"  # above any pid_max: not running
    old = tmp_path / f".plan.html.{os.getpid()}.cd34{TEMPORARY_SUFFIX}"
    fresh = tmp_path / f".plan.html.{os.getpid()}.ef56{TEMPORARY_SUFFIX}"
    other = tmp_path / f".other.html.999999999.ab12{TEMPORARY_SUFFIX}"
    mine = tmp_path / "plan.html.bak"
    for path in (dead, old, fresh, other, mine):
        path.write_text("x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert sorted(remove_stale_temporaries(tmp_path / "plan.html")) == sorted([dead, old])
    assert fresh.exists() and other.exists() and mine.exists()
    write_atomically(tmp_path / "other.html", "new")  # a write cleans its own file's leftovers
    assert not other.exists()


# ----------------------------------------------------------------------------- names as markup

HOSTILE = "<img src=x onerror=alert(1)>|`rm`\n# [click](javascript:alert(1)) *b* _i_ ~s~ \\ &amp;"


@pytest.mark.parametrize(("text", "expected"), [
    ("plain text, 1,024 images/s", "plain text, 1,024 images/s"),
    ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
    ("a|b", "a\\|b"),
    ("two\nlines\r\nand\u2028more", "two lines and more"),
    ("`tick`", "\\`tick\\`"),
    ("[x](javascript:alert(1))", "\\[x\\](javascript:alert(1))"),
    ("*b* _i_ ~s~ \\", "\\*b\\* \\_i\\_ \\~s\\~ \\\\"),
    ("bell\x07esc\x1b[31m", "bellesc\\[31m"),
    ("&amp;", "&amp;amp;"),
])
def test_markdown_text(text: str, expected: str) -> None:
    assert markdown_text(text) == expected


def test_markdown_code_only_for_plain_names() -> None:
    assert markdown_code("rtx-3090") == "`rtx-3090`"
    assert markdown_code("aten::native_layer_norm") == "`aten::native_layer_norm`"
    assert markdown_code("no device") == "`no device`"
    assert markdown_code("a`b|c") == "a\\`b\\|c"  # not a code span: escaped text
    assert markdown_code("<b>\n") == "&lt;b&gt;"


@pytest.mark.parametrize("url", ["javascript:alert(1)", "JavaScript:alert(1)", " javascript:alert(1)",
                                 "data:text/html,<script>", "file:///etc/passwd", "vbscript:x", "//evil.example",
                                 "https:", "http://a.example/\x00", ""])
def test_only_http_addresses_become_links(url: str) -> None:
    assert http_url(url) == "" and markdown_url(url) == ""


def test_http_addresses_are_encoded_for_markdown() -> None:
    assert http_url("https://a.example/x?y=1") == "https://a.example/x?y=1"
    assert markdown_url("https://en.wikipedia.org/wiki/A_(b) c|d`e") == \
        "https://en.wikipedia.org/wiki/A_%28b%29%20c%7Cd%60e"


def _hostile(report, name: str = HOSTILE):
    """The report with `name` in every field a user's data reaches."""
    source = Source("EVIL", "A", name, "javascript:alert(1)")
    good = Source("GOOD", "B", "a page", "https://a.example/x (y)")
    return dataclasses.replace(
        report,
        title=f"Training plan for {name}",
        model_lines=((report.model_lines[0][0], name), *report.model_lines[1:]),
        settings_lines=tuple((key, name if key == "Job" else value) for key, value in report.settings_lines),
        recommendations=tuple(dataclasses.replace(r, reason=name) for r in report.recommendations),
        devices=tuple(dataclasses.replace(d, name=name, cloud=name) for d in report.devices),
        offers=tuple(dataclasses.replace(o, provider=name, instance=name, region=name, source="EVIL")
                     for o in report.offers),
        sources=(source, good),
        assumptions=(name,),
    )


def test_hostile_names_stay_text_in_markdown(report, estimate_and_db) -> None:
    """Rendered as a Git forge renders it (markdown-it, GFM-like): the same tables with the same cells as
    the plain report, no HTML element and no javascript: link from the names."""
    from markdown_it import MarkdownIt

    def tables(html: str) -> list[list[int]]:
        return [[row.count("<td") for row in re.findall(r"<tr>.*?</tr>", table, re.DOTALL)]
                for table in re.findall(r"<table>.*?</table>", html, re.DOTALL)]

    parser = MarkdownIt("gfm-like")
    plain = parser.render(render_markdown(_hostile(report, "a plain name"), "plan_charts"))
    text = render_markdown(_hostile(report), "plan_charts")
    hostile = parser.render(text)
    assert tables(hostile) == tables(plain)
    assert "<img src=x" not in hostile and "javascript:" not in re.sub(r"\\|&[a-z]+;", "", "".join(
        re.findall(r'href="([^"]*)"', hostile)))
    assert "<h1>" in hostile and hostile.count("<h1>") == 1  # the name's '# ' did not start a heading
    for element in ("<em>", "<strong>", "<code>", "<img", "<s>", "<del>"):  # only the template's own markup
        assert hostile.count(element) == plain.count(element), element
    assert hostile.count("<a href") == 1  # the one http(s) source
    assert "https://a.example/x%20%28y%29" in hostile  # the http(s) source is still a link
    assert "&lt;img src=x onerror=alert(1)&gt;|`rm` # [click](javascript:alert(1)) *b* _i_ ~s~ \\ &amp;amp;" \
        in hostile  # shown as the name itself


def test_hostile_names_stay_text_in_html(report) -> None:
    document = render_html(_hostile(report))
    body = re.sub(r"<svg.*?</svg>|<style>.*?</style>", "", document, flags=re.DOTALL)
    assert "<img" not in body and "<script" not in body
    assert not re.search(r'href="\s*javascript:', document, re.IGNORECASE)
    assert 'href="https://a.example/x (y)"' in document
    assert "&lt;img src=x onerror=alert(1)&gt;" in body
    assert '"Segoe UI"' in document  # the stylesheet is ours and printed as it is


def test_a_model_named_like_markup(estimate_and_db, tmp_path: Path) -> None:
    """The model's name and SAMPLE_UNIT reach the title, the model lines, the job and the reasons."""
    estimate, db = estimate_and_db
    model = dataclasses.replace(estimate.model, name="<b>evil</b>|x\ny", sample_unit="<i>img</i>|`s`")
    hostile = build_report(dataclasses.replace(estimate, model=model), db, now=FIXED_TIME)
    write_report(hostile, tmp_path / "plan.md")
    text = (tmp_path / "plan.md").read_text()
    assert "<b>" not in text and "<i>" not in text and "`s`" not in text
    assert text.startswith("# Training plan for &lt;b&gt;evil&lt;/b&gt;\\|x y\n")
    assert "&lt;i&gt;img&lt;/i&gt;\\|\\`s\\`/s" in text
