"""This machine: its CPU and NVIDIA GPUs (NVML), each device's calibration status, and the action to
measure a (quick) calibration with progress, in a worker thread."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Header, ProgressBar, Static
from textual.worker import Worker, WorkerState

from advisor import units
from advisor.calibration.cache import CacheError, cache_dir, check_writable, load_profile, os_reason, store_profile
from advisor.calibration.profile import CalibrationProfile
from advisor.calibration.quality import assess, gate, refusal_message
from advisor.calibration.runner import Target, calibrate, cpu_target, cuda_target
from advisor.calibration.suite import load_suite
from advisor.errors import UserError
from advisor.hardware.specs import HardwareDB
from advisor.probe.local import LocalMachine, probe_local


def calibration_targets(db: HardwareDB) -> list[Target]:
    """The CPU, then every CUDA device torch sees."""
    import torch

    suite = load_suite()
    targets = [cpu_target(suite)]
    if torch.cuda.is_available():
        targets += [cuda_target(index, db, suite) for index in range(torch.cuda.device_count())]
    return targets


def calibration_status(target: Target) -> str:
    """"measured (quick, DATE)" or why there is no usable profile."""
    cached = load_profile(target.device, target.fingerprint)
    if cached.profile is None:
        return f"not calibrated ({cached.problem})"
    quality = assess(cached.profile, target.kind, target.cache_bytes)
    if not quality.accepted:
        return f"refused by the quality gates ({'; '.join(quality.refused_by)})"
    return f"measured ({cached.profile.mode}, {cached.profile.created})"


class MachineScreen(Screen):
    """Local devices and their calibration."""

    BINDINGS = [Binding("c", "calibrate", "Calibrate (quick)"), Binding("escape,b", "app.pop_screen", "Back"),
                Binding("q", "app.quit", "Quit")]

    def __init__(self, db: HardwareDB) -> None:
        super().__init__()
        self.db = db
        self.machine: LocalMachine | None = None
        self.targets: list[Target] = []

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="machine"):
            yield Static(id="machine-summary")
            yield DataTable(id="local-devices", cursor_type="row", zebra_stripes=True)
            with Horizontal(id="calibrate-row"):
                yield Button("Calibrate selected device (quick)", id="calibrate", variant="primary")
                yield ProgressBar(id="calibration-progress", show_eta=False)
            yield Static(id="calibration-status")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#local-devices", DataTable)
        table.add_columns("device", "name", "memory", "calibration")
        self.machine = probe_local(self.db)
        self.targets = calibration_targets(self.db)
        machine = self.machine
        gpus = machine.nvidia.gpus
        summary = Text(f"{machine.hostname}", style="bold")
        summary.append(f" · {machine.os} · Python {machine.python} · torch {machine.torch or 'not installed'}\n")
        summary.append(f"NVIDIA: {len(gpus)} GPU(s)" if machine.nvidia.available
                       else f"NVIDIA: none ({machine.nvidia.reason or 'no driver'})")
        self.query_one("#machine-summary", Static).update(summary)
        self._fill()

    def _fill(self) -> None:
        assert self.machine is not None
        table = self.query_one("#local-devices", DataTable)
        table.clear()
        memory = {"cpu": self.machine.cpu.memory_total_bytes}
        memory |= {f"cuda:{g.index}": g.memory_total_bytes for g in self.machine.nvidia.gpus}
        for target in self.targets:
            size = memory.get(target.device)
            table.add_row(target.device, target.name, "-" if not size else f"{size / units.GIB:.1f} GiB",
                          calibration_status(target), key=target.device)

    def action_calibrate(self) -> None:
        table = self.query_one("#local-devices", DataTable)
        if not self.targets:
            return
        target = self.targets[min(table.cursor_row, len(self.targets) - 1)]
        self.query_one("#calibrate", Button).disabled = True
        self.query_one("#calibration-status", Static).update(f"calibrating {target.device} (quick)…")
        self._calibrate(target)

    @on(Button.Pressed, "#calibrate")
    def _pressed(self) -> None:
        self.action_calibrate()

    @work(thread=True, exclusive=True, group="calibrate")
    def _calibrate(self, target: Target) -> CalibrationProfile | UserError:
        """Measure and store; a cache that cannot be written comes back as the result, found before
        measuring where it can be."""
        try:
            check_writable(target.device)
        except UserError as exc:
            return exc
        bar = self.query_one("#calibration-progress", ProgressBar)

        def progress(done: int, total: int, label: str) -> None:
            self.app.call_from_thread(bar.update, total=total, progress=done)
            self.app.call_from_thread(self.query_one("#calibration-status", Static).update,
                                      f"calibrating {target.device}: {label}")

        verdict = gate(calibrate(target, load_suite(), quick=True, progress=progress), target.kind,
                       target.cache_bytes)
        if verdict.profile is None:
            return UserError(refusal_message(verdict.quality, quick=True))
        profile = verdict.profile
        try:
            store_profile(profile)
        except OSError as exc:  # writable a moment ago (a disk filling up)
            return CacheError(cache_dir(), os_reason(exc))
        return profile

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "calibrate" or event.state != WorkerState.SUCCESS:
            return
        profile = event.worker.result
        self.query_one("#calibrate", Button).disabled = False
        if isinstance(profile, UserError):
            self.query_one("#calibration-status", Static).update(Text(f"not stored: {profile}", style="bold red"))
            return
        assert isinstance(profile, CalibrationProfile)
        self.query_one("#calibration-status", Static).update(
            f"stored the calibration of {profile.device} ({profile.duration_s:.1f} s); estimates with "
            "'this machine' on use it")
        self._fill()
