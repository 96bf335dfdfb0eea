"""The database screen: every GPU with memory, bandwidth, peaks and prices, sortable by column."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from advisor import units
from advisor.present.gpu_rows import SORT_KEYS, GPURow, select_rows
from advisor.hardware.specs import HardwareDB

COLUMNS = (  # keys are `advisor gpus --sort` keys
    ("id", "ID"),
    ("memory", "Mem GiB"),
    ("bandwidth", "BW GB/s"),
    ("fp32", "FP32 TF"),
    ("bf16", "BF16 TF"),
    ("price", "Cloud $/h"),
    ("purchase", "Buy $"),
)


def _cells(row: GPURow) -> tuple[object, ...]:
    """Raw numbers (so sorting is numeric); None shows as '-'."""
    gpu = row.gpu
    return (
        gpu.id,
        round(gpu.memory_bytes / units.GIB),
        round(gpu.bandwidth_bytes_per_s / units.GB),
        round(gpu.peaks.fp32 / units.TERA, 1) if gpu.peaks.fp32 else None,
        round(gpu.peaks.bf16_tensor / units.TERA, 1) if gpu.peaks.bf16_tensor else None,
        row.cheapest.usd_per_gpu_hour if row.cheapest else None,
        gpu.purchase_usd,
    )


def _sort_key(value: object, descending: bool) -> tuple[int, object]:
    """Missing values ('-') last; numbers largest first when `descending`."""
    if value == "-":
        return (1, 0)
    if descending and isinstance(value, (int, float)):
        return (0, -value)
    return (0, value)


class DatabaseScreen(Screen):
    """All GPUs of the database in a table; `o` cycles the sort column (as on the estimate screen),
    Escape goes back to the estimate."""

    BINDINGS = [Binding("o", "cycle_sort", "Sort"), Binding("escape,b", "app.pop_screen", "Back"),
                Binding("q", "app.quit", "Quit")]

    def __init__(self, db: HardwareDB) -> None:
        super().__init__()
        self.db = db
        self.sort_index = 1

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="summary")
        yield DataTable(id="gpus", zebra_stripes=True, cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        for row in select_rows(self.db, None, None):
            table.add_row(*(cell if cell is not None else "-" for cell in _cells(row)), key=row.gpu.id)
        self.action_cycle_sort()

    def action_cycle_sort(self) -> None:
        key, label = COLUMNS[self.sort_index]
        table = self.query_one(DataTable)
        descending = SORT_KEYS[key][1]  # larger is better: same direction as `advisor gpus --sort`
        table.sort(key, key=lambda value: _sort_key(value, descending))
        self.query_one("#summary", Static).update(
            f"{table.row_count} GPUs, {len(self.db.offers)} cloud offers from {len(self.db.providers())} providers; "
            f"sorted by {label}"
        )
        self.sort_index = (self.sort_index + 1) % len(COLUMNS)
