"""`gpu-advisor`: the Textual application (thin: screens live in their own modules)."""

from __future__ import annotations

import sys

from textual.app import App

from advisor.errors import UserError
from advisor.hardware.loader import load_hwdb
from advisor.hardware.specs import HardwareDB
from advisor.tui.database_screen import DatabaseScreen


class AdvisorApp(App):
    """The GPU advisor TUI."""

    CSS_PATH = "app.tcss"
    TITLE = "gpu-advisor"

    def __init__(self, db: HardwareDB) -> None:
        super().__init__()
        self.db = db

    def on_mount(self) -> None:
        self.push_screen(DatabaseScreen(self.db))


def main() -> int:
    try:
        db = load_hwdb()
    except UserError as exc:
        print(f"gpu-advisor: error: {exc}", file=sys.stderr)
        return exc.exit_code
    AdvisorApp(db).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
