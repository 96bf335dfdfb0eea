"""Long traces report progress and stop at --trace-timeout (advisor/profile/watch.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from advisor.cli.main import main
from advisor.errors import UserError
from advisor.profile import watch as watch_module
from advisor.profile.trace import trace_training_step
from advisor.profile.watch import REPORT_EVERY_S, TraceWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_every_few_seconds_and_a_sentence_past_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(watch_module.time, "monotonic", clock)
    heard: list[str] = []
    watch = TraceWatch(timeout_s=30, progress=heard.append, source="scan.py")
    for _ in range(64):  # the clock is read every 64th op
        watch.tick("forward", lambda: "mixer.layers.3")
    assert heard == []
    clock.now += REPORT_EVERY_S
    for _ in range(64):
        watch.tick("forward", lambda: "mixer.layers.3")
    assert heard == ["tracing: 128 ops in 5 s (forward, in mixer.layers.3)"]
    clock.now += 26  # 31 s in
    with pytest.raises(UserError, match=r"scan.py: tracing stopped at --trace-timeout 30 s after 192 ops "
                                        r"\(backward, in the model itself\)"):
        for _ in range(64):
            watch.tick("backward", lambda: "")


class Scan(nn.Module):
    """A reference scan: one small op per time step, in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = torch.zeros_like(x[:, 0])
        for step in range(x.shape[1]):
            state = torch.tanh(self.cell(state) + x[:, step])
        return state


def test_a_trace_past_its_timeout_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(watch_module.time, "monotonic", lambda: clock.now)
    original = TraceWatch.tick

    def slow_tick(self: TraceWatch, phase, module) -> None:
        clock.now += 0.01  # every op takes 10 ms of the fake clock
        original(self, phase, module)

    monkeypatch.setattr(TraceWatch, "tick", slow_tick)
    with pytest.raises(UserError, match="tracing stopped at --trace-timeout 1 s after"):
        trace_training_step(Scan, lambda b: torch.randn(b, 200, 4), 2, timeout_s=1)
    trace = trace_training_step(Scan, lambda b: torch.randn(b, 200, 4), 2, timeout_s=None)  # no limit
    assert trace.params == 20


def test_the_command_line_takes_a_timeout(capsys) -> None:
    assert main(["memory", "mlp", "--gpu", "t4", "--trace-timeout", "0", "--json"]) == 0
    assert main(["memory", "mlp", "--gpu", "t4", "--trace-timeout", "-1"]) == 2
    assert "--trace-timeout" in capsys.readouterr().err
