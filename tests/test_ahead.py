"""Layouts re-played ahead by the child that traced the second batch (advisor/estimate/ahead.py): what it
sends is used, the one it is on is waited for while this process makes the next one it has not started,
one it has not reached is made here and skipped there, and the estimate is the same with it or without."""

from __future__ import annotations

import json

import pytest

from advisor.estimate.ahead import LayoutsAhead
from advisor.memory.plan import close_kept_worker
from advisor.parallel.strategy import Layout
from advisor.profile.background import can_fork

FSDP2, ZERO2, FSDP4 = Layout("fsdp", 2, 8), Layout("zero2", 2, 8), Layout("fsdp", 4, 8)


def item(kind: str, layout: Layout) -> tuple:
    return kind, (layout.strategy, layout.dp > 1, layout.shards, layout.tp)


class ScriptedChild:
    """A Served whose messages are given by the test, one list per poll."""

    def __init__(self, script: list[list[tuple]]) -> None:
        self.script = script
        self.skipped: list[tuple] = []
        self.alive = True

    def poll(self, timeout_s: float = 0.0) -> list[tuple]:
        return self.script.pop(0) if self.script else []

    def skip(self, key: tuple) -> None:
        self.skipped.append(key)

    def close(self) -> None:
        self.alive = False


class Tables:
    """The LayoutMemory side: what is made, and where (here, or sent)."""

    def __init__(self) -> None:
        self.made: dict[tuple, str] = {}

    def has(self, key: tuple) -> bool:
        return key in self.made

    def absorb(self, key: tuple, value: object) -> None:
        self.made.setdefault(key, f"sent {value}")

    def make(self, kind: str, layout: Layout) -> None:
        self.made[item(kind, layout)] = "here"


def ahead_of(script: list[list[tuple]]) -> tuple[LayoutsAhead, ScriptedChild, Tables]:
    child, tables = ScriptedChild(script), Tables()
    wanted = [("step", FSDP2), ("step", ZERO2), ("step", FSDP4), ("line", FSDP2)]
    return LayoutsAhead(child, tables, wanted), child, tables  # type: ignore[arg-type]


def test_an_item_sent_is_used_and_one_not_reached_is_made_here_and_skipped_there() -> None:
    ahead, child, tables = ahead_of([[("starting", item("step", FSDP2), None), ("item", item("step", FSDP2), 1)]])
    ahead.await_item(item("step", FSDP2))
    assert tables.made == {item("step", FSDP2): "sent 1"} and ahead.sent == 1
    ahead.await_item(item("step", FSDP4))  # the child has not started it: made by the caller, skipped there
    assert child.skipped == [item("step", FSDP4)] and not tables.has(item("step", FSDP4))


def test_while_the_child_makes_the_item_asked_for_the_next_unstarted_one_is_made_here() -> None:
    # the child is on ZeRO-2's step; asked for it, this process makes FSDP-4's step (the next nobody started),
    # then FSDP-2's line (its step was sent), and is then given ZeRO-2's
    ahead, child, tables = ahead_of([[("starting", item("step", FSDP2), None), ("item", item("step", FSDP2), 1),
                                      ("starting", item("step", ZERO2), None)],
                                     [], [], [("item", item("step", ZERO2), 2)]])
    ahead.await_item(item("step", ZERO2))
    assert tables.made == {item("step", FSDP2): "sent 1", item("step", FSDP4): "here", item("line", FSDP2): "here",
                           item("step", ZERO2): "sent 2"}
    assert child.skipped == [item("step", FSDP4), item("line", FSDP2)]


def test_a_line_waits_for_its_step_before_it_is_made_here_while_waiting() -> None:
    # nothing sent yet and the child on FSDP-2's step: its line cannot be made before it, FSDP-4's step can
    ahead, child, tables = ahead_of([[("starting", item("step", FSDP2), None)], [],
                                     [("item", item("step", FSDP2), 1)]])
    ahead.await_item(item("step", FSDP2))
    assert tables.made == {item("step", ZERO2): "here", item("step", FSDP4): "here", item("step", FSDP2): "sent 1"}


def test_a_line_the_child_went_past_and_this_process_makes_is_skipped_there() -> None:
    # the child went past FSDP-2's line (its step was being made here: it makes such a line last) and is on
    # ZeRO-2's step; asked for the line, this process makes it and tells the child to skip it
    child, tables = ScriptedChild([[("starting", item("step", ZERO2), None)]]), Tables()
    tables.made[item("step", FSDP2)] = "here"
    ahead = LayoutsAhead(child, tables, [("line", FSDP2), ("step", ZERO2)])  # type: ignore[arg-type]
    ahead.await_item(item("line", FSDP2))
    assert child.skipped == [item("line", FSDP2)]


def test_while_the_child_still_traces_this_process_makes_the_steps_it_has_not_started() -> None:
    # waiting for the second trace three times: FSDP-2's and ZeRO-2's steps are made here and skipped there;
    # then the trace arrives (waiting() is False) and FSDP-4's step is left to the child
    ahead, child, tables = ahead_of([])
    answers = iter([True, True, False])
    assert ahead.steps_while(lambda: next(answers)) == 2
    assert tables.made == {item("step", FSDP2): "here", item("step", ZERO2): "here"}
    assert child.skipped == [item("step", FSDP2), item("step", ZERO2)]


def test_while_waiting_no_line_is_made_here_nor_a_step_the_child_started() -> None:
    # the child is on FSDP-2's step: this process makes ZeRO-2's and FSDP-4's and stops before FSDP-2's line
    # (a line needs the second trace it waits for), though still waiting
    ahead, child, tables = ahead_of([[("starting", item("step", FSDP2), None)]])
    assert ahead.steps_while(lambda: True) == 2
    assert tables.made == {item("step", ZERO2): "here", item("step", FSDP4): "here"}
    assert child.skipped == [item("step", ZERO2), item("step", FSDP4)]


def test_a_child_that_failed_leaves_every_item_to_the_caller() -> None:
    ahead, child, tables = ahead_of([[("starting", item("step", FSDP2), None), ("failed", None, None)]])
    ahead.await_item(item("step", FSDP2))
    assert not tables.has(item("step", FSDP2)) and not child.alive


@pytest.mark.skipif(not can_fork(), reason="needs fork, two CPUs and no other thread")
def test_the_estimate_is_the_same_with_the_child_replaying_layouts_or_without(monkeypatch) -> None:
    # the 7B example on GPUs that cannot hold it alone: each is sized at the fewest GPUs that do, FSDP, ZeRO
    # and DDP re-played at several counts, by the child or here (the RTX 4090s no machine offered holds)
    import advisor.estimate.plan as estimate_plan
    from advisor.app.plan import plan
    from advisor.app.request import PlanRequest
    from advisor.hardware.loader import load_hwdb
    from advisor.profile import background

    if not can_fork():
        pytest.skip("a backward ran in this process on a torch build with autograd device threads")
    started: list[LayoutsAhead | None] = []
    start = LayoutsAhead.start
    monkeypatch.setattr(estimate_plan.LayoutsAhead, "start", lambda *args: started.append(start(*args)) or started[-1])
    request = PlanRequest(model="llama", gpus=("rtx-4090", "a100-sxm4-40gb", "h100-sxm"), plans="never",
                          input_pipeline=False)
    db = load_hwdb()
    ahead = plan(request, db)
    assert started and started[0] is not None  # the child was sent the layouts
    monkeypatch.setattr(background, "can_fork", lambda: False)
    monkeypatch.setattr(estimate_plan.LayoutsAhead, "start", lambda *args: pytest.fail("no child to send to"))
    monkeypatch.setattr("advisor.memory.plan.can_fork", lambda: False)
    close_kept_worker()  # the child the first estimate kept would trace and serve the next
    alone = plan(request, db)
    assert sum(r.scale_out is not None for r in alone.results) == 2
    assert json.dumps(ahead.to_dict(), sort_keys=True, default=str) == \
        json.dumps(alone.to_dict(), sort_keys=True, default=str)


@pytest.mark.skipif(not can_fork(), reason="needs fork, two CPUs and no other thread")
def test_the_next_estimate_of_a_model_is_traced_by_the_child_kept_and_is_the_same(monkeypatch) -> None:
    # the child that traced and served one estimate traces the next estimate's larger batch without a fork
    # (memory.plan.keep_worker); another model stops it and forks its own
    from dataclasses import replace

    import advisor.memory.plan as memory_plan
    from advisor.app.plan import plan
    from advisor.app.request import PlanRequest
    from advisor.hardware.loader import load_hwdb
    from advisor.profile import background

    if not can_fork():
        pytest.skip("a backward ran in this process on a torch build with autograd device threads")
    forked: list[bool] = []
    init = background.ForkedCall.__init__
    monkeypatch.setattr(background.ForkedCall, "__init__",
                        lambda self, *args, **kwargs: forked.append(True) or init(self, *args, **kwargs))
    request = PlanRequest(model="gpt2_small", gpus=("h100-sxm", "rtx-4090"), plans="never", input_pipeline=False)
    db = load_hwdb()
    plan(request, db)
    assert len(forked) == 1 and len(memory_plan._kept) == 1
    kept = memory_plan._kept[0][1]
    larger = replace(request, batch_size=16)
    again = plan(larger, db)  # traced at 16 here and at 32 by the kept child
    assert len(forked) == 1 and memory_plan._kept == [(memory_plan._kept[0][0], kept)]
    assert again.second is not None and again.second.batch_size == 32
    plan(replace(request, model="mlp"), db)  # kept beside it (KEPT_WORKERS: two)
    assert len(forked) == 2 and kept._process.is_alive() and len(memory_plan._kept) == 2
    monkeypatch.setattr(memory_plan, "KEPT_WORKERS", 1)
    plan(replace(request, model="mlp"), db)  # the oldest is stopped
    assert len(forked) == 2 and not kept._process.is_alive() and len(memory_plan._kept) == 1
    monkeypatch.setattr(background, "can_fork", lambda: False)
    monkeypatch.setattr("advisor.memory.plan.can_fork", lambda: False)
    close_kept_worker()
    alone = plan(larger, db)  # both steps traced here
    assert len(forked) == 2
    assert json.dumps(again.to_dict(), sort_keys=True, default=str) == \
        json.dumps(alone.to_dict(), sort_keys=True, default=str)


def test_no_tensor_parallel_layout_is_listed_for_a_model_it_cannot_split() -> None:
    # the MLP has no layers a tensor-parallel plan splits: the estimate says so (exit 2), and the child is sent no
    # tp layout, which this process might otherwise re-play while it waits (an assertion, exit 1, once in CI)
    from advisor.calibration.reference import load_families
    from advisor.estimate.costs import Job
    from advisor.estimate.parallel import LayoutMemory
    from advisor.estimate.plan import EstimateSettings, likely_layouts
    from advisor.estimate.targets import database_targets
    from advisor.hardware.loader import load_hwdb
    from advisor.memory.estimate import StepMemory
    from advisor.memory.plan import MemorySettings, trace_both_batches
    from advisor.profile.model_file import load_model_file

    db = load_hwdb([])
    targets = database_targets(db, [db.gpu("h100-sxm")], load_families(db))
    memory = MemorySettings(8, "fp32", "adamw")
    first, second = trace_both_batches(load_model_file("mlp"), memory, parallel=False)
    layouts = LayoutMemory(first, second)
    assert isinstance(layouts.plan, str)
    for parallel, expected in (("tp", 0), ("auto", 6)):
        settings = EstimateSettings(memory, Job(samples=800, epochs=1), num_gpus=8, parallel=parallel)
        listed = likely_layouts(db, targets, settings, layouts, StepMemory.of_trace(first))
        # auto: 4 strategies' steps, the lines of the 2 likeliest to be chosen (ZeRO-2's, FSDP's)
        assert sum(layout.gpus == 8 for _, layout in listed) == expected


def test_a_step_made_here_is_given_to_the_child_which_then_skips_it() -> None:
    # a line the child makes needs its step: one made here goes to it (Served.share), not made there again
    from advisor.estimate.ahead import layouts_job
    from advisor.profile.background import JobChannel

    class Pipe:  # the child's end: the parent's notes, then what the child sends
        def __init__(self, notes):
            self.notes, self.sent = list(notes), []

        def poll(self, timeout=0):
            return bool(self.notes)

        def recv(self):
            return self.notes.pop(0)

        def send(self, message):
            self.sent.append(message)

    from advisor.estimate.parallel import LayoutMemory

    class Memory:  # LayoutMemory's side, as layouts_job uses it
        key = staticmethod(LayoutMemory.key)

        def __init__(self, *args):
            self.absorbed, self.steps = [], {}

        def absorb(self, item, value):
            self.absorbed.append(item)
            self.steps[item[1]] = value

        def has(self, found):
            return found[0] == "step" and found[1] in self.steps

        def step(self, layout):
            return self.steps.get(item("step", layout)[1], "made in the child")

        def batch_model(self, layout):
            return ("line of", self.step(layout))

    step_key = item("step", FSDP2)
    pipe = Pipe([("made", step_key, "made here")])
    import advisor.estimate.ahead as ahead
    real, ahead.LayoutMemory = ahead.LayoutMemory, Memory
    try:
        layouts_job(None, "the first step", [("step", FSDP2), ("line", FSDP2)], {}, JobChannel(pipe))
    finally:
        ahead.LayoutMemory = real
    line = item("line", FSDP2)
    assert pipe.sent == [("starting", line, None), ("item", line, ("line of", "made here"))]

    class LatePipe(Pipe):  # the parent took FSDP-2's step; it comes made once the child sent two messages
        def poll(self, timeout=0):
            return bool(self.notes) and (self.notes[0][0] == "skip" or len(self.sent) >= 2)

    pipe = LatePipe([("skip", step_key), ("made", step_key, "made here")])
    ahead.LayoutMemory = Memory
    try:  # FSDP-2's line waits for its step, made there, while ZeRO-2's line is made: no step made twice
        layouts_job(None, "the first step", [("step", FSDP2), ("line", FSDP2), ("line", ZERO2)], {},
                    JobChannel(pipe))
    finally:
        ahead.LayoutMemory = real
    zero2 = item("line", ZERO2)
    assert pipe.sent == [("starting", zero2, None), ("item", zero2, ("line of", "made in the child")),
                         ("starting", line, None), ("item", line, ("line of", "made here"))]


def test_the_child_is_sent_the_first_step_only_where_an_item_reads_it() -> None:
    # a line of a step this process re-played needs only the second step (Llama-3-70B over every GPU: one GPU's
    # line alone); a step, a line of a step not made here, or a tensor-parallel line reads the first
    from advisor.estimate.ahead import needs_first
    from advisor.estimate.parallel import LayoutMemory

    one = Layout("ddp", 1, 1)
    made = {LayoutMemory.key(one), LayoutMemory.key(FSDP2)}
    assert not needs_first([("line", one)], made)
    assert not needs_first([("line", one), ("line", FSDP2)], made)
    assert needs_first([("line", one), ("step", FSDP4)], made)
    assert needs_first([("line", FSDP4)], made)
    assert needs_first([("line", Layout("fsdp", 4, 8, 2))], made | {LayoutMemory.key(Layout("fsdp", 4, 8, 2))})


def test_the_child_is_sent_the_first_steps_ops_only_for_a_tensor_parallel_layout() -> None:
    # data-parallel layouts read the step's memory and parameters; a tensor-parallel plan reads its ops
    from advisor.estimate.ahead import memory_of
    from advisor.memory.plan import MemorySettings, trace_for_memory
    from advisor.profile.model_file import load_model_file

    trace = trace_for_memory(load_model_file("mlp"), MemorySettings(8, "fp32", "adamw"), 8)
    sent = memory_of(trace, [("step", FSDP2), ("line", ZERO2)])
    assert sent.records == () and trace.records
    assert sent.memory is trace.memory and sent.params_by_module == trace.params_by_module
    assert memory_of(trace, [("step", FSDP2), ("step", Layout("fsdp", 4, 8, 2))]) is trace


@pytest.mark.skipif(not can_fork(), reason="needs fork, two CPUs and no other thread")
def test_one_gpus_line_made_by_the_child_without_the_first_step_is_the_one_made_here(monkeypatch) -> None:
    # GPT-2 small fits one H100: the child is asked for one GPU's line alone and sent no first step (None in
    # the job's arguments); the estimate is the one made with no child
    from advisor.app.plan import plan
    from advisor.app.request import PlanRequest
    from advisor.hardware.loader import load_hwdb
    from advisor.profile import background

    if not can_fork():
        pytest.skip("a backward ran in this process on a torch build with autograd device threads")
    sent: list[tuple] = []
    submit = background.Served.submit
    monkeypatch.setattr(background.Served, "submit", lambda self, *args: sent.append(args) or submit(self, *args))
    request = PlanRequest(model="gpt2_small", gpus=("h100-sxm",), plans="never", input_pipeline=False)
    db = load_hwdb()
    ahead = plan(request, db)
    assert len(sent) == 1
    _, first, wanted, made = sent[0]
    assert first is None and [kind for kind, _ in wanted] == ["line"] and len(made) == 1
    monkeypatch.setattr(background, "can_fork", lambda: False)
    monkeypatch.setattr("advisor.memory.plan.can_fork", lambda: False)
    close_kept_worker()
    alone = plan(request, db)
    assert ahead.results[0].memory.max_batch_size == alone.results[0].memory.max_batch_size > 8
    assert json.dumps(ahead.to_dict(), sort_keys=True, default=str) == \
        json.dumps(alone.to_dict(), sort_keys=True, default=str)
