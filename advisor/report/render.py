"""The report rendered with jinja2: one self-contained HTML file (charts as inline SVG, styles inline,
no network), or Markdown with the charts as SVG files in a folder beside it."""

from __future__ import annotations

from pathlib import Path

import jinja2

from advisor.errors import UserError
from advisor.report.content import Report

PACKAGE = Path(__file__).resolve().parent
FORMATS = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md"}


def _environment(autoescape: bool) -> jinja2.Environment:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(PACKAGE / "templates"), autoescape=autoescape,
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    environment.filters["md"] = markdown_cell
    return environment


def markdown_cell(text: str) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, no line breaks."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_html(report: Report) -> str:
    """The whole report as one HTML document."""
    css = (PACKAGE / "report.css").read_text()
    return _environment(autoescape=True).get_template("report.html.j2").render(r=report, css=css)


def render_markdown(report: Report, chart_dir: str) -> str:
    """The report as Markdown; charts are referenced as `chart_dir`/NAME.svg."""
    return _environment(autoescape=False).get_template("report.md.j2").render(r=report, chart_dir=chart_dir)


def report_format(path: Path) -> str:
    """"html" or "md" from the output file's suffix."""
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        raise UserError(f"cannot tell the report format from '{path.name}': name it .html or .md")
    return found


def check_folder(path: Path) -> None:
    """UserError when the folder `path` would be written into does not exist."""
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: folder {path.parent} does not exist")


def write_report(report: Report, path: Path) -> list[Path]:
    """Write the report to `path` (.html or .md; Markdown's charts go to PATH-stem_charts/). Returns the
    files written, the report first."""
    kind = report_format(path)
    check_folder(path)
    if kind == "html":
        path.write_text(render_html(report), encoding="utf-8")
        return [path]
    chart_dir = path.parent / f"{path.stem}_charts"
    chart_dir.mkdir(exist_ok=True)
    written = [path]
    for chart in report.charts:
        target = chart_dir / f"{chart.name}.svg"
        target.write_text(chart.svg, encoding="utf-8")
        written.append(target)
    path.write_text(render_markdown(report, chart_dir.name), encoding="utf-8")
    return written
