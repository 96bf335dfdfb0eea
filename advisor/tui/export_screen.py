"""Export the current estimate: the planning report (HTML or Markdown, as `advisor report`) or
PRODUCT.md's JSON (as `advisor estimate --json`)."""

from __future__ import annotations

import json
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from advisor.errors import UserError
from advisor.estimate.plan import Estimate
from advisor.hardware.specs import HardwareDB
from advisor.report.content import build_report
from advisor.report.render import check_folder, write_atomically, write_report
from advisor.app.fit import FitPlan
from advisor.app.request import PlanRequest

SUFFIXES = {"export-html": ".html", "export-md": ".md", "export-json": ".json"}


def export(estimate: Estimate, db: HardwareDB, request: PlanRequest, path: Path,
           plans: tuple[FitPlan, ...] | None = None) -> list[Path]:
    """Write `estimate` (and the fit advisor's `plans`, None when it did not run) to `path` by its suffix
    (.html, .md, .json); the files written."""
    if path.suffix == ".json":
        check_folder(path)
        document = estimate.to_dict() | {"plans": [plan.to_dict() for plan in plans or ()]}
        write_atomically(path, json.dumps(document, indent=2) + "\n")
        return [path]
    report = build_report(estimate, db, request.budget_usd, request.deadline_s, max_price_usd=request.max_price_usd,
                          plans=plans)
    return write_report(report, path)


class ExportScreen(ModalScreen["list[Path] | None"]):
    """Asks for a file name; the buttons pick the format. Dismissed with the files written."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, estimate: Estimate, db: HardwareDB, request: PlanRequest,
                 plans: tuple[FitPlan, ...] | None = None) -> None:
        super().__init__()
        self.estimate, self.db, self.request, self.plans = estimate, db, request, plans

    def compose(self) -> ComposeResult:
        with Vertical(id="export"):
            yield Label(f"Export the estimate of {self.estimate.model.name}")
            yield Input(str(Path.cwd() / f"gpu-advisor-{self.estimate.model.name}"), id="export-path")
            with Horizontal():
                yield Button("HTML report", id="export-html", variant="primary")
                yield Button("Markdown", id="export-md")
                yield Button("JSON", id="export-json")
                yield Button("Cancel", id="export-cancel")
            yield Static(id="export-error")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "export-cancel":
            self.dismiss(None)
            return
        assert event.button.id in SUFFIXES
        path = Path(self.query_one("#export-path", Input).value.strip()).expanduser()
        path = path.with_suffix(SUFFIXES[event.button.id])
        try:
            written = export(self.estimate, self.db, self.request, path, self.plans)
        except UserError as exc:
            self.query_one("#export-error", Static).update(str(exc))
            return
        self.dismiss(written)
