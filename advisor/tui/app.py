"""`gpu-advisor [MODEL.py]`: the Textual application (thin: screens live in their own modules)."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from pathlib import Path

from textual.app import App
from textual.widgets import Select

from advisor.errors import UserError
from advisor.hardware.loader import load_hwdb
from advisor.hardware.specs import HardwareDB
from advisor.profile.background import ForkedCall
from advisor.tui.commands import AdvisorCommands
from advisor.tui.database_screen import DatabaseScreen
from advisor.tui.estimate_screen import EstimateScreen
from advisor.tui.export_screen import ExportScreen
from advisor.tui.help_screen import HelpScreen
from advisor.tui.machine_screen import MachineScreen
from advisor.tui.request import EstimateRequest, TracePair, prefetch_traces


class AdvisorApp(App):
    """The GPU advisor TUI: the estimate screen, with the machine, database, help and export screens."""

    CSS_PATH = "app.tcss"
    TITLE = "gpu-advisor"
    COMMANDS = App.COMMANDS | {AdvisorCommands}

    def __init__(self, db: HardwareDB, request: EstimateRequest | None = None,
                 prefetched: ForkedCall[TracePair] | None = None) -> None:
        super().__init__()
        self.db = db
        self.request = request or EstimateRequest()
        self.prefetched = prefetched

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

        self.push_screen(ExportScreen(screen.estimate, self.db, screen.request), written)

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
                        help="model file (see PRODUCT.md's contract) or built-in example name; default resnet50")
    parser.add_argument("--hwdb", action="append", default=[], metavar="DIR",
                        help="extra hardware/price YAML directory (as for `advisor`)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    try:
        db = load_hwdb(args.hwdb)
        if args.model is not None:  # a wrong path is a one-sentence error before the screen opens
            from advisor.profile.model_file import resolve_model_path

            resolve_model_path(args.model)
    except UserError as exc:
        print(f"gpu-advisor: error: {exc}", file=sys.stderr)
        return exc.exit_code
    request = EstimateRequest(model=args.model)
    prefetched = prefetch_traces(request)  # before the app starts threads: it can fork
    try:
        AdvisorApp(db, request, prefetched).run()
    finally:
        if prefetched is not None:
            prefetched.close()
    gc.freeze()  # exit without the final walk over torch's objects (see advisor.cli.main.console_main)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
