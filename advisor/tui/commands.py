"""Command palette entries (ctrl+p): sorting, precision, export, this machine, the GPU list, help."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from advisor.present.ranking import SORT_KEYS
from advisor.profile.choices import PRECISIONS


class AdvisorCommands(Provider):
    """The app's actions by name."""

    def _commands(self) -> list[tuple[str, Callable[[], object], str]]:
        app = self.app
        commands: list[tuple[str, Callable[[], object], str]] = [
            ("Export report or JSON", app.action_export, "write the current estimate as HTML, Markdown or JSON"),
            ("This machine: devices and calibration", app.action_machine, "local CPU/GPUs, run a calibration"),
            ("GPU database", app.action_database, "every GPU with its specs and prices"),
            ("Toggle settings", partial(app.estimate_action, "toggle_settings"), "show or hide the settings"),
            ("Re-estimate", partial(app.estimate_action, "estimate"), "run the estimate again"),
        ]
        commands += [(f"Sort by {key}", partial(app.sort_by, key), f"order the devices by {key}") for key in SORT_KEYS]
        commands += [(f"Precision: {p}", partial(app.set_precision, p), f"re-estimate in {p}") for p in PRECISIONS]
        return commands

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
