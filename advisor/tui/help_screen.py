"""The help screen: what the app does, its keys and where the numbers come from."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# gpu-advisor

Predicts training time, memory and cost of a PyTorch model on every GPU in the database (and on this
machine), from one training step traced on fake tensors and each device's calibrated efficiency.

| key | action |
|---|---|
| `s` | show or hide the settings |
| `Enter` (Devices tab) | detail of the device: memory bar, top ops, cloud offers, buying |
| `1` `2` `3` `4` | the Devices, Detail, Time-vs-cost and Plans tabs (Plans: the fit advisor's ways to make it fit, or cheaper or faster ones) |
| `o` / click a column header | sort: time, cost, throughput, memory, name (also on the GPU list) |
| `Escape` | back (from the GPU list, this machine, help, export) |
| `r` | re-estimate now |
| `x` | export the current view: HTML or Markdown report, or JSON |
| `m` | this machine: local CPU and GPUs, calibration, run a calibration |
| `g` | the GPU database |
| `ctrl+p` | command palette |
| `?` | this help |
| `q` | quit |

Settings take effect on `Enter` in a text field, or at once for lists and switches; the estimate
runs in the background and the status line shows its progress.

Times: per op, FLOPs or bytes against the device's peak and calibrated efficiency, plus per-op
overhead. Memory: weights, gradients, optimizer state, activations at the peak, allocator and CUDA
context overhead. Money: cloud price per GPU-hour x hours, or the card's price plus electricity.

Several GPUs: set "GPUs per job" (the batch is then each GPU's) and the parallelism (auto: the
fastest of DDP, ZeRO-1/2 and FSDP that fits). Each GPU's memory and the collectives' time over its
links come from the one traced step; whole instances are priced. With one GPU, the GPUs column
names the fewest that fit where one is too small.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Markdown(HELP)
