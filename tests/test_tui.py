"""The `gpu-advisor` app driven with Textual's pilot."""

from __future__ import annotations

import asyncio

from textual.widgets import DataTable, Static

from advisor.hardware.loader import load_hwdb
from advisor.tui.app import AdvisorApp


def test_database_screen_lists_gpus_and_cycles_sort() -> None:
    async def scenario() -> None:
        db = load_hwdb(include_user_layers=False)
        app = AdvisorApp(db)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            table = app.screen.query_one(DataTable)
            assert table.row_count == len(db.gpus)
            first_by_memory = table.get_row_at(0)[0]
            assert first_by_memory == max(db.gpus, key=lambda g: g.memory_bytes).id
            await pilot.press("s")
            await pilot.pause()
            assert table.get_row_at(0)[0] == max(db.gpus, key=lambda g: g.bandwidth_bytes_per_s).id
            assert "sorted by BW" in str(app.screen.query_one("#summary", Static).render())
            await pilot.press("q")
        assert app.return_code in (0, None)

    asyncio.run(scenario())
