"""`gpu-advisor [MODEL.py]`: the Textual application (thin: screens live in their own modules)."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from textual.app import App
from textual.widgets import Select

from advisor.errors import UserError
from advisor.process import REPORT_BUGS, exit_now, report_exit, terminate_on_sigterm
from advisor.hardware.loader import load_hwdb
from advisor.hardware.specs import HardwareDB
from advisor.profile.background import ForkedCall
from advisor.tui.commands import AdvisorCommands
from advisor.tui.database_screen import DatabaseScreen
from advisor.tui.estimate_screen import EstimateScreen
from advisor.tui.export_screen import ExportScreen
from advisor.tui.help_screen import HelpScreen
from advisor.tui.machine_screen import MachineScreen
from advisor.app.plan import TracePair
from advisor.app.request import PlanRequest
from advisor.tui.request import prefetch_traces


class AdvisorApp(App):
    """The GPU advisor TUI: the estimate screen, with the machine, database, help and export screens."""

    CSS_PATH = "app.tcss"
    TITLE = "gpu-advisor"
    COMMANDS = App.COMMANDS | {AdvisorCommands}

    def __init__(self, db: HardwareDB, request: PlanRequest | None = None,
                 prefetched: ForkedCall[TracePair] | None = None) -> None:
        super().__init__()
        self.db = db
        self.request = request or PlanRequest()
        self.prefetched = prefetched
        self.internal_errors: list[BaseException] = []
        """Our bugs met in workers: shown in the app, their tracebacks printed on exit."""

    def on_mount(self) -> None:
        self.push_screen(EstimateScreen(self.db, self.request, self.prefetched))

    @property
    def estimate_screen(self) -> EstimateScreen:
        return next(s for s in self.screen_stack if isinstance(s, EstimateScreen))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_machine(self) -> None:
        self.push_screen(MachineScreen(self.db))

    def action_database(self) -> None:
        self.push_screen(DatabaseScreen(self.db))

    def action_export(self) -> None:
        screen = self.estimate_screen
        if screen.estimate is None:
            self.notify("No estimate yet: wait for it to finish.", severity="warning")
            return

        def written(paths: list[Path] | None) -> None:
            if paths:
                self.notify("wrote " + ", ".join(str(p) for p in paths), title="Exported")

        self.push_screen(ExportScreen(screen.estimate, self.db, screen.request, screen.plans), written)

    def estimate_action(self, name: str) -> None:
        """Run an action of the estimate screen (from the command palette)."""
        getattr(self.estimate_screen, f"action_{name}")()

    def sort_by(self, key: str) -> None:
        self.estimate_screen.sort_by(key)

    def set_precision(self, precision: str) -> None:
        self.estimate_screen.query_one("#precision", Select).value = precision


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-advisor", description="Choose a GPU for training MODEL: the TUI.")
    parser.add_argument("model", nargs="?", metavar="MODEL.py",
                        help="model file (see docs/model-file.md) or built-in example name; default resnet50")
    parser.add_argument("--hwdb", action="append", default=[], metavar="DIR",
                        help="extra hardware/price YAML directory (as for `advisor`)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the app; the exit code: 0, 2 for a bad argument, 1 when the app ended on our bug (its
    traceback printed after the screen is restored)."""
    args = parse_arguments(argv)
    try:
        db = load_hwdb(args.hwdb)
        if args.model is not None:  # a wrong path is a one-sentence error before the screen opens
            from advisor.profile.model_file import resolve_model_path

            resolve_model_path(args.model)
    except UserError as exc:
        return report_exit(exc, "gpu-advisor")
    request = PlanRequest(model=args.model)
    prefetched = prefetch_traces(request)  # before the app starts threads: it can fork
    app = AdvisorApp(db, request, prefetched)
    try:
        app.run()
    finally:
        if prefetched is not None:
            prefetched.close()
    for error in app.internal_errors:  # shown in the app as they happened; the tracebacks for a report
        traceback.print_exception(error)
    if app.internal_errors:
        print(f"gpu-advisor: internal error: {REPORT_BUGS}", file=sys.stderr)
    return app.return_code or (1 if app.internal_errors else 0)


def console_main() -> NoReturn:
    """The `gpu-advisor` command: main(), then exit at once (threads a model file started do not keep
    it alive; see advisor.process.exit_now). Ctrl-C before the app is up exits 130 in one line."""
    terminate_on_sigterm()
    try:
        code = main()
    except BaseException as exc:  # noqa: BLE001 -- reported once, as `advisor` does
        code = report_exit(exc, "gpu-advisor")
    exit_now(code)


if __name__ == "__main__":
    console_main()
