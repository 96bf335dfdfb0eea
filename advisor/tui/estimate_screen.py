"""The main screen: settings on the left, the ranked devices, the selected device's detail and the
time/cost chart on the right. Every change of a setting re-estimates in a worker thread; the UI stays
live and shows progress."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import (
    DataTable,
    Footer,
    Header,
    Input,
    Label,
    ProgressBar,
    Select,
    Static,
    Switch,
    TabbedContent,
    TabPane,
)
from textual.worker import Worker, WorkerState, get_current_worker

from advisor import units
from advisor.present.ranking import SORT_KEYS, sort_results
from advisor.present.format import duration, mfu_cell, money, plan_duration, throughput_cell, throughput_header
from advisor.present.pipeline import input_bound
from advisor.errors import UserError
from advisor.estimate.plan import DeviceEstimate, Estimate
from advisor.hardware.specs import HardwareDB
from advisor.profile.background import ForkedCall
from advisor.profile.model_file import builtin_examples
from advisor.profile.choices import BASE_WEIGHTS, OPTIMIZER_CHOICES, PRECISIONS
from advisor.app.fit import FitPlan
from advisor.app.plan import TracePair, advise, advisor_runs, plan
from advisor.app.request import PARALLEL_CHOICES, PLAN_MODES, PlanRequest
from advisor.present.parallel import gpus_cell
from advisor.present.notes import estimate_notes
from advisor.present.plans import plan_lines
from advisor.tui.chart import points_of, scatter
from advisor.tui.detail import DeviceDetail
from advisor.profile.watch import DEFAULT_TRACE_TIMEOUT_S
from advisor.tui.request import parse_number

MIN_WIDTH, MIN_HEIGHT = 80, 24
TRACES_KEPT = 8
"""Traced steps the screen keeps for re-estimates that change only devices, prices or the job (issue #24):
two traces each, kilobytes to a few MB of op records."""
ESTIMATE_STAGES = 4
"""Progress messages of one estimate (load, trace, trace again, estimate): the bar advances one per
message. A determinate bar, not Textual's pulsing one, whose 60 fps animation competes with the
worker thread for the GIL (the first ResNet-50 estimate took twice as long under it)."""
PREFETCH_TIMEOUT_S = 120.0
"""How long the first estimate waits for the traces started before the app (a 7B model traces in about
6 s here); past it, the child is killed and the worker traces itself."""
SETTINGS_BESIDE_WIDTH = 110
"""Below this width the settings start hidden (`s` shows them), leaving the table the screen."""
NO_SELECTION = getattr(Select, "NULL", None) or Select.BLANK
"""A Select with nothing chosen (Textual 8 calls it Select.NULL, earlier versions Select.BLANK)."""
COLUMNS = (  # (key, label, sort key when its header is clicked, drop order in a narrow table: 1 first)
    ("rank", "#", "time", None), ("device", "Device", "name", None), ("memory", "Peak/Mem GiB", "memory", None),
    ("step", "Step", "time", 4), ("throughput", "Samples/s", "throughput", 3), ("mfu", "MFU", "mfu", 2),
    ("train", "Train", "time", None), ("bound", "Bound", "time", 1), ("cost", "Cheapest $", "cost", None),
    ("buy", "Buy $", "name", 5), ("gpus", "GPUs", "time", 6),
)
CELL_PADDING = 2
"""Columns a DataTable adds around each cell (one each side)."""
SCROLLBAR_WIDTH = 2


class EstimateScreen(Screen):
    """Settings, ranked devices, detail and chart."""

    BINDINGS = [
        Binding("s", "toggle_settings", "Settings"),
        Binding("o", "cycle_sort", "Sort"),
        Binding("1", "show_tab('tab-devices')", "Devices", show=False),
        Binding("2", "show_tab('tab-detail')", "Detail", show=False),
        Binding("3", "show_tab('tab-chart')", "Chart", show=False),
        Binding("4", "show_tab('tab-plans')", "Plans", show=False),
        Binding("escape", "show_tab('tab-devices')", "Results", show=False),
        Binding("r", "estimate", "Re-estimate"),
        Binding("x", "app.export", "Export"),
        Binding("m", "app.machine", "This machine"),
        Binding("g", "app.database", "GPU list"),
        Binding("question_mark", "app.help", "Help"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, db: HardwareDB, request: PlanRequest,
                 prefetched: ForkedCall[TracePair] | None = None) -> None:
        super().__init__()
        self.db = db
        self.request = request
        self.first_request = request
        self.prefetched = prefetched
        """The first request's traces, started in a forked child before the app (see prefetch_traces)."""
        self.estimate: Estimate | None = None
        self.traces: dict[tuple[Any, ...], TracePair] = {}
        """Traced steps of this session by PlanRequest.trace_key, newest last (at most TRACES_KEPT)."""
        self.plans: tuple[FitPlan, ...] | None = None
        """The fit advisor's plans for the estimate shown; None while it has not run."""
        self.sort = "time"
        self.selected: str | None = None
        self.settings_shown: bool | None = None
        """None: by the terminal's width; True/False once the user toggled them."""

    # ---- layout -------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        request = self.request
        yield Header()
        with Horizontal(id="main"):
            with VerticalScroll(id="settings"):
                yield Label("Model file or example")
                yield Input(request.model or "", placeholder="resnet50 or path/to/model.py", id="model")
                yield Select([(name, name) for name in builtin_examples()], prompt="built-in example", id="example")
                yield Label("Batch size")
                yield Input(_text(request.batch_size), placeholder="model's default", type="integer", id="batch")
                yield Label("Precision")
                yield Select([(p, p) for p in PRECISIONS], value=request.precision or NO_SELECTION,
                             prompt="default", id="precision")
                yield Label("Optimizer")
                yield Select([(o, o) for o in OPTIMIZER_CHOICES], value=request.optimizer or NO_SELECTION,
                             prompt="default", id="optimizer")
                yield Label("LoRA rank")
                yield Input(_text(request.lora), placeholder="none", type="integer", id="lora")
                yield Label("LoRA targets (a, b, ...)")
                yield Input(", ".join(request.lora_targets), placeholder="attention defaults", id="lora_targets")
                yield Label("LoRA dropout")
                yield Input(_text(request.lora_dropout), placeholder="0", type="number", id="lora_dropout")
                yield Label("Frozen base weights")
                yield Select([(b, b) for b in BASE_WEIGHTS], value=request.base_weights or NO_SELECTION,
                             prompt="default", id="base_weights")
                yield _switch_row(request.checkpointing, "checkpointing", "checkpointing")
                yield _switch_row(request.compiled, "compiled", "torch.compile")
                yield _switch_row(request.sync_each_step, "sync_each_step", "loop reads a value back each step")
                yield Label("Micro-batch")
                yield Input(_text(request.micro_batch), placeholder="none", type="integer", id="micro_batch")
                yield Label("Samples per epoch")
                yield Input(_text(request.samples), placeholder="model's TRAIN_SAMPLES", type="integer", id="samples")
                yield Label("Epochs")
                yield Input(_text(request.epochs), placeholder="1", type="number", id="epochs")
                yield Label("Steps (not epochs)")
                yield Input(_text(request.steps), placeholder="none", type="integer", id="steps")
                yield Label("Tokens (the job)")
                yield Input(_text(request.tokens), placeholder="file's TRAIN_TOKENS", type="integer", id="tokens")
                yield Label("Sequence length")
                yield Input(_text(request.seq_len), placeholder="file's SEQ_LEN", type="integer", id="seq_len")
                yield _switch_row(request.padding_mask, "padding_mask", "padded batches (hf: models)")
                yield Label("Packed documents (tokens)")
                yield Input(_text(request.packing), placeholder="not packed", type="integer", id="packing")
                yield Label("Budget (USD)")
                yield Input(_text(request.budget_usd), placeholder="none", type="number", id="budget")
                yield Label("Max card price (USD)")
                yield Input(_text(request.max_price_usd), placeholder="none", type="number", id="max_price")
                yield Label("Deadline (hours)")
                yield Input(_text(request.deadline_hours), placeholder="none", type="number", id="deadline")
                yield Label("Provider")
                yield Select([(p, p) for p in self.db.providers()], prompt="all providers", value=request.provider
                             or NO_SELECTION, id="provider")
                yield _switch_row(request.spot, "spot", "spot prices")
                yield _switch_row(request.local, "local", "this machine")
                yield Label("GPU ids (a, b, ...)")
                yield Input(", ".join(request.gpus), placeholder="every GPU", id="gpus")
                yield Label("GPUs per job (batch per GPU)")
                yield Input(_text(request.num_gpus), placeholder="1, and the fewest that fit", type="integer",
                            id="num_gpus")
                yield Label("Parallelism")
                yield Select([(p, p) for p in PARALLEL_CHOICES], value=request.parallel, allow_blank=False,
                             id="parallel")
                yield Label("Tensor-parallel degree")
                yield Input(_text(request.tp), placeholder="1", type="integer", id="tp")
                yield Label("CUDA context (MiB)")
                yield Input(_text(request.cuda_context_mib), placeholder="the database's", type="number",
                            id="cuda_context_mib")
                yield _switch_row(request.input_pipeline, "input_pipeline", "input pipeline")
                yield Label("DataLoader workers per GPU")
                yield Input(_text(request.workers), placeholder="vCPUs per GPU - 1", type="integer", id="workers")
                yield Label("Host vCPUs per GPU")
                yield Input(_text(request.vcpus_per_gpu), placeholder="the instance's", type="number",
                            id="vcpus_per_gpu")
                yield Label("Host CPU")
                yield Input(request.host_cpu or "", placeholder="the instance's (e.g. xeon-8275cl)", id="host_cpu")
                yield Label("Fit advisor")
                yield Select([(mode, mode) for mode in PLAN_MODES], value=request.plans, allow_blank=False,
                             id="plans_mode")
                yield Label("Trace timeout s")
                yield Input(_text(request.trace_timeout_s), type="number", id="trace_timeout_s")
            with Vertical(id="results"):
                yield Static(id="status")
                yield ProgressBar(id="progress", total=ESTIMATE_STAGES, show_eta=False, show_percentage=False)
                with TabbedContent(id="tabs"):
                    with TabPane("Devices", id="tab-devices"):
                        yield DataTable(id="devices", cursor_type="row", zebra_stripes=True)
                    with TabPane("Detail", id="tab-detail"):
                        yield DeviceDetail(id="detail")
                    with TabPane("Time vs cost", id="tab-chart"):
                        yield Static(id="chart")
                    with TabPane("Plans", id="tab-plans"):
                        yield Static("The fit advisor searches when nothing fits (or always: Fit advisor in the "
                                     "settings).", id="plans")
        yield Static(id="too-small")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#devices", DataTable)
        self._check_size()
        table.focus()  # the results are what a person looks at first; `s` and Tab reach the form
        self.action_estimate()

    def on_resize(self) -> None:
        self._check_size()
        if self.estimate is not None:
            self.call_after_refresh(self._fill_table)  # the columns that fit the new width

    def _check_size(self) -> None:
        width, height = self.app.size
        small = width < MIN_WIDTH or height < MIN_HEIGHT
        self.set_class(small, "too-small")
        shown = self.settings_shown if self.settings_shown is not None else width >= SETTINGS_BESIDE_WIDTH
        self.set_class(not shown, "hide-settings")
        if small:
            self.query_one("#too-small", Static).update(
                f"gpu-advisor needs a terminal of at least {MIN_WIDTH}x{MIN_HEIGHT}; this one is {width}x{height}. "
                "Enlarge it (or press q to quit).")

    # ---- settings -> estimate -------------------------------------------------------------------------

    def read_request(self) -> PlanRequest:
        """The form as a request (UserError on a bad field)."""
        value = lambda widget_id: self.query_one(f"#{widget_id}", Input).value  # noqa: E731
        chosen = lambda widget_id: _chosen(self.query_one(f"#{widget_id}", Select).value)  # noqa: E731
        gpus = tuple(dict.fromkeys(g.strip() for g in value("gpus").split(",") if g.strip()))
        for gpu_id in gpus:
            self.db.gpu(gpu_id)  # an unknown id: the sentence with the closest ones
        return PlanRequest(
            model=value("model").strip() or None,
            batch_size=parse_number(value("batch"), int, "batch size"),
            precision=chosen("precision"),
            optimizer=chosen("optimizer"),
            checkpointing=self.query_one("#checkpointing", Switch).value,
            compiled=self.query_one("#compiled", Switch).value,
            sync_each_step=self.query_one("#sync_each_step", Switch).value,
            micro_batch=parse_number(value("micro_batch"), int, "micro-batch"),
            cuda_context_mib=parse_number(value("cuda_context_mib"), float, "CUDA context"),
            trace_timeout_s=parse_number(value("trace_timeout_s"), float, "trace timeout",
                                         default=DEFAULT_TRACE_TIMEOUT_S),
            gpus=gpus,
            local=self.query_one("#local", Switch).value,
            samples=parse_number(value("samples"), int, "samples"),
            epochs=parse_number(value("epochs"), float, "epochs"),
            steps=parse_number(value("steps"), int, "steps"),
            tokens=parse_number(value("tokens"), int, "tokens"),
            seq_len=parse_number(value("seq_len"), int, "sequence length"),
            padding_mask=self.query_one("#padding_mask", Switch).value,
            packing=parse_number(value("packing"), int, "packed documents"),
            provider=chosen("provider"),
            spot=self.query_one("#spot", Switch).value,
            budget_usd=parse_number(value("budget"), float, "budget"),
            deadline_hours=parse_number(value("deadline"), float, "deadline"),
            max_price_usd=parse_number(value("max_price"), float, "max card price"),
            lora=parse_number(value("lora"), int, "LoRA rank"),
            lora_targets=tuple(t.strip() for t in value("lora_targets").split(",") if t.strip()),
            lora_dropout=parse_number(value("lora_dropout"), float, "LoRA dropout"),
            base_weights=chosen("base_weights"),
            plans=str(chosen("plans_mode")),
            input_pipeline=self.query_one("#input_pipeline", Switch).value,
            workers=parse_number(value("workers"), int, "workers"),
            vcpus_per_gpu=parse_number(value("vcpus_per_gpu"), float, "vCPUs per GPU"),
            host_cpu=value("host_cpu").strip() or None,
            num_gpus=parse_number(value("num_gpus"), int, "number of GPUs"),
            parallel=str(chosen("parallel")),
            tp=parse_number(value("tp"), int, "tensor-parallel degree"),
        )

    @on(Input.Submitted)
    @on(Select.Changed, "#precision, #optimizer, #provider, #base_weights, #plans_mode, #parallel")
    @on(Switch.Changed)
    def _setting_changed(self) -> None:
        """Re-estimate when the form says something new (widgets also post Changed as they mount)."""
        try:
            changed = self.read_request() != self.request
        except UserError:
            changed = True  # let action_estimate report it
        if changed or self.estimate is None and not self.has_class("busy"):
            self.action_estimate()

    @on(Select.Changed, "#example")
    def _example_chosen(self, event: Select.Changed) -> None:
        if event.value is not NO_SELECTION:
            self.query_one("#model", Input).value = str(event.value)
            self.query_one("#batch", Input).value = ""
            self.action_estimate()

    def action_estimate(self) -> None:
        """Re-estimate with the form's settings (a bad field is reported, nothing runs)."""
        try:
            request = self.read_request()
        except UserError as exc:
            self._show_error(str(exc))
            return
        self.request = request
        self.set_class(True, "busy")
        self.query_one("#progress", ProgressBar).update(total=ESTIMATE_STAGES, progress=0)
        self._status(Text(f"estimating {request.model or 'resnet50'}…", style="bold"))
        self._run(request)

    @work(thread=True, exclusive=True, group="estimate", exit_on_error=True)
    def _run(self, request: PlanRequest) -> Estimate | UserError:
        """Trace and estimate off the UI thread; a user mistake comes back as the result."""
        worker = get_current_worker()

        def progress(message: str) -> None:
            if not worker.is_cancelled:
                self.app.call_from_thread(self._progress, message)

        key = request.trace_key()
        try:
            traces = self._cached_traces(key, progress) or self._prefetched_traces(request, progress)
            estimate = plan(request, self.db, progress, traces)
        except UserError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 -- our bug: shown in the app, its traceback kept for the exit
            self.app.internal_errors.append(exc)
            return UserError(f"internal error ({type(exc).__name__}: {exc}); this is a bug in gpu-advisor: "
                             "the traceback is printed when you quit; please report it")
        if estimate.second is not None:
            self._remember_traces(key, (estimate.trace, estimate.second))
        return estimate

    def _cached_traces(self, key: tuple[Any, ...], progress: Callable[[str], None]) -> TracePair | None:
        """The traces of an earlier estimate of the same step (PlanRequest.trace_key), when there is one."""
        traces = self.traces.get(key)
        if traces is not None:
            progress("the step is traced already (only devices, prices or the job changed)")
        return traces

    def _remember_traces(self, key: tuple[Any, ...], traces: TracePair) -> None:
        """Keep `traces` for a later estimate of the same step; the oldest go past TRACES_KEPT."""
        self.traces.pop(key, None)
        self.traces[key] = traces
        while len(self.traces) > TRACES_KEPT:
            self.traces.pop(next(iter(self.traces)))

    def _prefetched_traces(self, request: PlanRequest, progress: Callable[[str], None]) -> TracePair | None:
        """The traces started before the app, when this is still the request they were made for."""
        prefetched, self.prefetched = self.prefetched, None
        if prefetched is None:
            return None
        if request.traces_differ(self.first_request):
            prefetched.close()
            return None
        progress("tracing the training step (started with the app)")
        return prefetched.result(timeout_s=PREFETCH_TIMEOUT_S)

    @work(thread=True, exclusive=True, group="plans", exit_on_error=True)
    def _run_plans(self, request: PlanRequest, estimate: Estimate) -> tuple[FitPlan, ...] | UserError:
        """The fit advisor off the UI thread (each plan is a trace)."""
        worker = get_current_worker()

        def progress(message: str) -> None:
            if not worker.is_cancelled:
                self.app.call_from_thread(self._plans_text, Text(f"searching: {message}…", style="bold"))

        try:
            return advise(request, self.db, estimate, progress)
        except UserError as exc:
            return exc

    def _plans_text(self, text: Text) -> None:
        self.query_one("#plans", Static).update(text)

    def _show_plans(self, result: tuple[FitPlan, ...] | UserError) -> None:
        estimate = self.estimate
        if isinstance(result, UserError):
            self._plans_text(Text(str(result), style="bold red"))
            return
        assert estimate is not None
        self.plans = result
        lines = plan_lines(estimate, result)
        text = Text(lines[0] + "\n", style="bold")
        text.append("\n".join(lines[1:]))
        self._plans_text(text)
        if result and not estimate.fitting:
            ways = f"{len(result)} way{'' if len(result) == 1 else 's'}"
            self._status(Text(f"{estimate.model.name} fits on no device as asked; {ways} to make it fit: press 4",
                              style="bold red"))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group == "plans" and event.state == WorkerState.SUCCESS:
            self._show_plans(event.worker.result)
            return
        if event.worker.group != "estimate" or event.state != WorkerState.SUCCESS:
            return
        self.set_class(False, "busy")
        result = event.worker.result
        if isinstance(result, UserError):
            self._show_error(str(result))
            return
        assert isinstance(result, Estimate)
        self.estimate = result
        self._fill_table()
        self._fill_chart()
        self._summary()
        request = self.request
        self.plans = None
        if advisor_runs(request, result):
            self._plans_text(Text("searching for plans that fit…", style="bold"))
            self._run_plans(request, result)
        else:
            self._plans_text(Text("Everything asked for fits; choose Fit advisor: always for faster or cheaper "
                                  "ways."))
        if self.selected is not None and any(r.id == self.selected for r in result.results):
            self._show_detail(self.selected)

    # ---- results ---------------------------------------------------------------------------------------

    def _fill_table(self) -> None:
        estimate = self.estimate
        assert estimate is not None
        table = self.query_one("#devices", DataTable)
        rows = [(result.id, _cells(rank, result, estimate.settings.spot))
                for rank, result in enumerate(sort_results(estimate, self.sort), 1)]
        shown = _columns_that_fit([cells for _, cells in rows], self._table_width())
        cursor = table.cursor_row
        table.clear(columns=True)
        for index in shown:
            key, label, _, _ = COLUMNS[index]
            if key == "throughput":  # tokens/s for a sequence model, as the command line's table gives it
                label = throughput_header(estimate.settings.seq_len is not None)
            table.add_column(label, key=key)
        for device_id, cells in rows:
            table.add_row(*(cells[i] for i in shown), key=device_id)
        if rows:
            table.move_cursor(row=min(cursor, len(rows) - 1))

    def _table_width(self) -> int:
        """Columns the device table has: the screen less the settings beside it, when shown."""
        width = self.app.size.width
        if not self.has_class("hide-settings"):
            width -= self.query_one("#settings").outer_size.width or 30
        return width - SCROLLBAR_WIDTH

    def _fill_chart(self) -> None:
        estimate = self.estimate
        assert estimate is not None
        chart = self.query_one("#chart", Static)
        width = max(chart.size.width or self.app.size.width - 34, 40)
        height = max(chart.size.height or self.app.size.height - 8, 10)
        kind = "spot USD" if estimate.settings.spot else "USD"
        chart.update(scatter(points_of(estimate), width, height, kind))

    def _summary(self) -> None:
        estimate = self.estimate
        assert estimate is not None
        spot = estimate.settings.spot
        text = Text()
        text.append(f"{estimate.model.name}", style="bold")
        text.append(f" · {len(estimate.results)} devices, {len(estimate.fitting)} fit · sorted by {self.sort}")
        by_time, by_cost = estimate.by_time(), estimate.by_cost()
        if by_time:
            text.append(f"\nfastest {by_time[0].id} {plan_duration(by_time[0].time_to_train_s)}")
        if by_cost:
            text.append(f" · cheapest {by_cost[0].id} {money(by_cost[0].job_cost_usd(spot))} USD")
        request = self.request
        if request.budget_usd is not None:
            best = estimate.fastest_within_budget(request.budget_usd)
            text.append(f" · within {money(request.budget_usd)} USD: {best.id if best else 'no device'}")
        if request.deadline_s is not None:
            best = estimate.cheapest_within_deadline(request.deadline_s)
            text.append(f" · by {plan_duration(request.deadline_s)}: {best.id if best else 'no device'}")
        if request.max_price_usd is not None:
            best = estimate.fastest_to_buy_within(request.max_price_usd)
            text.append(f" · to buy within {money(request.max_price_usd)} USD: {best.id if best else 'no card'}")
        limited = input_bound(estimate)
        if limited:
            text.append(f"\nthe input pipeline cannot keep {len(limited)} of {len(estimate.fitting)} GPUs fed "
                        "(Bound: input; Detail says by how much)", style="yellow")
        if not estimate.fitting:
            text.append("\nthe model fits on no device as asked: the fit advisor is searching (Plans, key 4)",
                        style="bold red")
        for note in estimate_notes(estimate):
            text.append(f"\n{note}", style="yellow")
        self._status(text)

    def _progress(self, message: str) -> None:
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=max(bar.total or ESTIMATE_STAGES, bar.progress + 1), progress=bar.progress + 1)
        self._status(Text(message, style="bold"))

    def _status(self, text: Text) -> None:
        self.query_one("#status", Static).update(text)

    def _show_error(self, message: str) -> None:
        self.set_class(False, "busy")
        self._status(Text(message, style="bold red"))
        self.notify(message, title="Cannot estimate", severity="error")

    @on(DataTable.RowSelected, "#devices")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        assert event.row_key.value is not None
        self._show_detail(event.row_key.value)
        self.query_one(TabbedContent).active = "tab-detail"

    @on(DataTable.RowHighlighted, "#devices")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None and self.estimate is not None:
            self._show_detail(event.row_key.value)

    def _show_detail(self, device_id: str) -> None:
        assert self.estimate is not None
        self.selected = device_id
        self.query_one(DeviceDetail).show(self.estimate, self.estimate.result(device_id))

    @on(DataTable.HeaderSelected, "#devices")
    def _header_selected(self, event: DataTable.HeaderSelected) -> None:
        self.sort_by(next(sort for key, _, sort, _ in COLUMNS if key == event.column_key.value))

    def sort_by(self, key: str) -> None:
        assert key in SORT_KEYS, key
        self.sort = key
        if self.estimate is not None:
            self._fill_table()
            self._summary()

    def action_cycle_sort(self) -> None:
        self.sort_by(SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)])

    def action_show_tab(self, tab: str) -> None:
        """Show the Devices (1), Detail (2) or Time-vs-cost (3) tab."""
        self.query_one(TabbedContent).active = tab
        if tab == "tab-devices":
            self.query_one("#devices", DataTable).focus()

    def action_toggle_settings(self) -> None:
        self.settings_shown = self.has_class("hide-settings")
        self.set_class(not self.settings_shown, "hide-settings")
        if self.estimate is not None:
            self.call_after_refresh(self._fill_table)  # the table's width changed


def _chosen(value: object) -> str | None:
    """A Select's value as text, None when nothing is chosen (the default)."""
    return None if value is NO_SELECTION else str(value)


def _switch_row(value: bool, switch_id: str, label: str) -> Horizontal:
    """A switch with its label beside it (the form's on/off settings)."""
    return Horizontal(Switch(value, id=switch_id), Label(label), classes="switch-row")


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _columns_that_fit(rows: list[list[object]], width: int) -> list[int]:
    """Indices of COLUMNS to show in `width` columns: the narrowest table drops bound, MFU, throughput, step
    time and purchase price in that order, so time-to-train and cost always show whole figures."""
    def column_width(index: int) -> int:
        return max([len(COLUMNS[index][1])] + [len(str(row[index])) for row in rows]) + CELL_PADDING

    shown = list(range(len(COLUMNS)))
    droppable = sorted((drop, i) for i, (_, _, _, drop) in enumerate(COLUMNS) if drop is not None)
    while droppable and sum(column_width(i) for i in shown) > width:
        shown.remove(droppable.pop(0)[1])
    return shown


def _cells(rank: int, result: DeviceEstimate, spot: bool) -> list[object]:
    memory = f"{result.memory.peak_bytes / units.GIB:.1f}/{result.memory.capacity_bytes / units.GIB:.0f}"
    gpu = result.target.gpu
    buy = money(gpu.purchase_usd) if gpu is not None and gpu.purchase_usd is not None else "-"
    if not result.fits:
        short = Text(f"✗ {result.memory.missing_bytes / units.GIB:.1f} GiB short", style="red")
        return ["", Text(result.id, style="dim red"), Text(memory, style="red"), short, "", "", "", "", "", buy,
                gpus_cell(result)]
    return [str(rank), result.id, memory, duration(result.step_time_s),
            throughput_cell(result.throughput, result.throughput_tokens_per_s),
            mfu_cell(result.mfu), plan_duration(result.time_to_train_s), result.step.bound,
            money(result.job_cost_usd(spot)), buy, gpus_cell(result)]
