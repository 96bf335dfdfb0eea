"""The report rendered with jinja2: one self-contained HTML file (charts as inline SVG, styles inline,
no network), or Markdown with the charts as SVG files in a folder beside it.

Every name in a report may come from the user (the model file's name, SAMPLE_UNIT, a GPU, provider or
instance from their own hwdb files), so neither rendering lets one through as markup: HTML is
autoescaped by jinja2, Markdown escapes every value the template prints (`finalize`), and a link is
made only from an http(s) address. Files are written atomically: a temporary file beside the target,
then os.replace, so a failed write (a full disk, a read-only folder) leaves the previous report whole."""

from __future__ import annotations

import contextlib
import os
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from advisor import atomic
from advisor.errors import UserError
from advisor.report.content import Report

PACKAGE = Path(__file__).resolve().parent
FORMATS = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md"}
TEMPORARY_SUFFIX = ".advisor-tmp"
"""Temporary files are `.NAME.PID.RANDOM.advisor-tmp` beside NAME: hidden, and plainly ours."""
STALE_TEMPORARY_S = 3600.0
"""A temporary of a process still running is left alone unless it is this old (a write takes ms)."""


# ----------------------------------------------------------------------------- escaping


class MarkdownText(str):
    """Text already safe in the Markdown template: printed as it is."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]|~]|(?<![^\W_])_|_(?![^\W_]))")
"""Characters Markdown could read as markup; `_` inside a word (TRAIN_SAMPLES) is not, so stays bare."""
_HTML_SPECIAL = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def markdown_text(value: Any) -> MarkdownText:
    """`value` as plain text in Markdown, in a table cell or anywhere else: one line (line breaks become
    spaces), no control characters, HTML's special characters as entities (no raw HTML gets through),
    and Markdown's (`\\ ` * _ [ ] | ~`, `_` unless inside a word) escaped, so a name shows as itself and
    never as a link, code, emphasis or a new table cell."""
    text = _CONTROL.sub("", " ".join(str(value).split()))
    text = "".join(_HTML_SPECIAL.get(c, c) for c in text)
    return MarkdownText(_MARKDOWN_SPECIAL.sub(r"\\\1", text))


def markdown_code(value: Any) -> MarkdownText:
    """`value` as inline code (device ids, op names), or as escaped text when it holds anything a code
    span cannot show safely (backticks, pipes, angle brackets, line breaks)."""
    text = str(value)
    if text and re.fullmatch(r"[^`|<>&\\\s]+( [^`|<>&\\\s]+)*", text) and not _CONTROL.search(text):
        return MarkdownText(f"`{text}`")
    return markdown_text(text)


def http_url(value: Any) -> str:
    """`value` when it is an http(s) address, else "": the only links a report makes (the loader checks
    this too; a report never makes a javascript: or data: link, whatever reaches it)."""
    text = str(value or "")
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:
        return ""
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc or _CONTROL.search(text):
        return ""
    return text


def markdown_url(value: Any) -> MarkdownText:
    """An http(s) address as a Markdown link target (spaces, parentheses, angle brackets, pipes and
    backticks percent-encoded), or "" for anything else."""
    url = http_url(value)
    return MarkdownText(urllib.parse.quote(url, safe=":/?#@!$&'*+,;=%~[]") if url else "")


def markdown_path(value: Any) -> MarkdownText:
    """A relative file path (the charts' folder) as a Markdown link target, percent-encoded."""
    return MarkdownText(urllib.parse.quote(str(value), safe="/"))


def _finalize_markdown(value: Any) -> Any:
    return value if isinstance(value, MarkdownText) else markdown_text(value)


def _environment(markdown: bool) -> jinja2.Environment:
    options: dict[str, Any] = {"finalize": _finalize_markdown} if markdown else {"autoescape": True}
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(PACKAGE / "templates"),
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True, **options)
    environment.filters.update(md=markdown_text, code=markdown_code, md_url=markdown_url, md_path=markdown_path,
                               http_url=http_url)
    return environment


def render_html(report: Report) -> str:
    """The whole report as one HTML document."""
    css = Markup((PACKAGE / "report.css").read_text())  # ours, inside <style>: not to be escaped
    return _environment(markdown=False).get_template("report.html.j2").render(r=report, css=css)


def render_markdown(report: Report, chart_dir: str) -> str:
    """The report as Markdown; charts are referenced as `chart_dir`/NAME.svg."""
    return _environment(markdown=True).get_template("report.md.j2").render(r=report, chart_dir=chart_dir)


# ----------------------------------------------------------------------------- the files


def report_format(path: Path) -> str:
    """"html" or "md" from the output file's suffix, once check_folder() found a place for it: a bad
    name or place is an error before seconds of tracing."""
    if path.is_dir():
        raise UserError(f"cannot write {path}: it is a folder; name a file such as {path / 'plan.html'}")
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        raise UserError(f"cannot tell the report format from '{path.name}': name it .html or .md")
    check_folder(path)
    if found == "md" and chart_folder(path).exists() and not chart_folder(path).is_dir():
        raise UserError(f"cannot write the charts into {chart_folder(path)}: it is a file, not a folder")
    return found


def check_folder(path: Path) -> None:
    """UserError when `path` cannot be written: its folder does not exist or is read-only, or it is a
    folder itself."""
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UserError(f"cannot write {path}: folder {folder} {what}")
    if path.is_dir():
        raise UserError(f"cannot write {path}: it is a folder")
    if not os.access(folder, os.W_OK):
        raise UserError(f"cannot write {path}: folder {folder} is read-only")


def chart_folder(path: Path) -> Path:
    """Where a Markdown report's charts go: PATH-stem_charts/ beside it."""
    return path.parent / f"{path.stem}_charts"


def write_report(report: Report, path: Path) -> list[Path]:
    """Write the report to `path` (.html or .md; Markdown's charts go to PATH-stem_charts/). Returns the
    files written, the report first. Each file is replaced whole or not at all; UserError when one
    cannot be written (the previous one stays as it was)."""
    kind = report_format(path)
    if kind == "html":
        write_atomically(path, render_html(report))
        return [path]
    chart_dir = chart_folder(path)
    text = render_markdown(report, chart_dir.name)
    try:
        chart_dir.mkdir(exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write the charts into {chart_dir}: {exc.strerror or exc}") from None
    written = [path]
    for chart in report.charts:  # the charts first: the report never points at a chart not yet there
        target = chart_dir / f"{chart.name}.svg"
        write_atomically(target, chart.svg)
        written.append(target)
    write_atomically(path, text)
    return written


def write_atomically(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` with advisor.atomic.write_atomically (a temporary file beside it,
    fsync, os.replace): readers see the old file or the new one, never a part. A link is written through
    to its target; an existing file keeps its permissions. Stale temporaries of a killed run are removed
    first. On any failure the temporary is removed and the old file is untouched; an OSError becomes one
    UserError sentence."""
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    remove_stale_temporaries(target)
    existed = target.exists()
    try:
        atomic.write_atomically(path, text, suffix=TEMPORARY_SUFFIX)
    except OSError as exc:
        kept = "the previous file is unchanged" if existed else "the file was not created"
        raise UserError(f"cannot write {path}: {exc.strerror or exc}; {kept}") from None


def remove_stale_temporaries(path: Path, now: float | None = None) -> list[Path]:
    """Remove the temporaries of `path` that a killed run left beside it: those of a process that is
    no longer running, and any older than STALE_TEMPORARY_S. Returns the files removed."""
    removed = []
    now = time.time() if now is None else now
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[0-9a-f]+{re.escape(TEMPORARY_SUFFIX)}")
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            found = pattern.fullmatch(entry.name)
            if found is None or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                if not _running(int(found.group(1))) or now - entry.stat().st_mtime > STALE_TEMPORARY_S:
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def _running(pid: int) -> bool:
    """Whether process `pid` runs on this machine (True where that cannot be told)."""
    if pid == os.getpid():
        return True
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
