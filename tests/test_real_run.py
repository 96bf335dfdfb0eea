"""The step run for real on CPU tensors, for models that branch on values computed from their weights
(advisor/profile/real_run.py), and the one seed every trace draws its random numbers from."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from advisor.errors import UserError
from advisor.profile import real_run
from advisor.profile.trace import trace_training_step


class KeepsPositiveRows(nn.Module):
    """A detection head in miniature: scores from the weights decide which rows go on
    (`torch.where(keep)`, as torchvision's remove_small_boxes), so the shapes downstream depend on them."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(8, 1)
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.where(self.score(x).squeeze(1) > 0)[0]
        return self.head(x[keep])


def rows(batch: int) -> torch.Tensor:
    return torch.randn(batch, 8)


def kept_rows(trace) -> int:
    (head,) = [r for r in trace.records if r.phase == "forward" and r.module == "head" and r.op == "addmm"]
    return head.gemm[1]  # (batch, m, n, k): m rows went through the head


def test_weight_dependent_shapes_come_from_a_real_step() -> None:
    trace = trace_training_step(KeepsPositiveRows, rows, 64)
    assert trace.values == "real"
    # score Linear(8, 1): 9, head Linear(8, 8): 72 -> 81 parameters
    assert trace.params == 81
    kept = kept_rows(trace)
    assert 0 < kept < 64  # a fresh model keeps some rows: about half of 64 random ones
    (score,) = [r for r in trace.records if r.phase == "forward" and r.module == "score" and r.op == "addmm"]
    assert score.flops == 2 * 64 * 1 * 8  # addmm 64x8 @ 8x1: 2*64*1*8 = 1,024 FLOPs
    assert trace.memory is not None and trace.memory.peak().bytes > 0


def test_the_real_step_is_the_same_on_every_run() -> None:
    first, second = (trace_training_step(KeepsPositiveRows, rows, 64) for _ in range(2))
    assert kept_rows(first) == kept_rows(second)
    assert [r.op for r in first.records] == [r.op for r in second.records]
    assert first.memory.peak().bytes == second.memory.peak().bytes


def test_traces_leave_the_callers_random_numbers_alone() -> None:
    torch.manual_seed(123)
    random.seed(123)
    expected = (torch.rand(1).item(), random.random())
    torch.manual_seed(123)
    random.seed(123)
    trace_training_step(KeepsPositiveRows, rows, 4)
    assert (torch.rand(1).item(), random.random()) == expected


def test_random_numbers_a_model_reads_are_the_same_on_every_trace() -> None:
    class LayerDrop(nn.Module):  # Hugging Face's layerdrop: `if torch.rand([]) < p: skip the layer`
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(12))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                if torch.rand([]) >= 0.5:
                    x = layer(x)
            return x

    ops = {len(trace_training_step(LayerDrop, lambda b: torch.randn(b, 4), 2).records) for _ in range(3)}
    assert len(ops) == 1


def test_weights_too_large_for_a_real_run_are_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real_run, "available_memory_bytes", lambda: 4 * 1000)  # budget 4000 // 4 = 1,000 B
    # 81 parameters x 4 B = 324 B; weights, gradients and Adam's two moments: 4 x 324 = 1,296 B > 1,000 B
    with pytest.raises(real_run.RealRunTooLarge, match=r"^m.py branches on values computed from its weights "
                                                       r"\(aten.nonzero.default\), and running its step for real "
                                                       r"on this CPU would need about 0.0 GiB for weights"):
        trace_training_step(KeepsPositiveRows, rows, 64, source="m.py")


def test_activations_that_outgrow_the_budget_stop_the_real_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real_run, "available_memory_bytes", lambda: 4 * 20_000)  # budget 20,000 B
    # weights fit (1,296 B); batch 1024 inputs alone are 1024 x 8 x 4 B = 32 KiB > 20,000 B
    with pytest.raises(UserError, match=r"its step run for real on this CPU at batch 1024 outgrew 1/4 of the "
                                        r"available memory .*; try a smaller --batch-size"):
        trace_training_step(KeepsPositiveRows, rows, 1024)
    # at batch 8 the whole step stays far under it
    assert trace_training_step(KeepsPositiveRows, rows, 8).values == "real"


class MatchedByNumPy(nn.Module):
    """A set-prediction loss in miniature (DETR's and Mask2Former's Hungarian matcher): the predictions' costs go
    to NumPy (scipy's linear_sum_assignment there) to choose which prediction each target is compared with."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def matched_loss(out: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    best = int(out.detach().sum(0).numpy().argmax())  # the prediction column the target is matched to
    return out[:, best].square().mean()


def test_a_loss_that_hands_predictions_to_numpy_runs_for_real() -> None:
    """A fake tensor has no values for NumPy: the step runs for real rather than failing as the model's error."""
    trace = trace_training_step(MatchedByNumPy, rows, 16, loss_fn=matched_loss)
    assert trace.values == "real"
    (head,) = [r for r in trace.records if r.phase == "forward" and r.op == "addmm"]
    assert head.flops == 2 * 16 * 4 * 8  # addmm 16x8 @ 8x4: 2*16*4*8 = 1,024 FLOPs
    assert trace.params == 36  # Linear(8, 4): 32 + 4


WIDE_HEAD_FILE = '''
import torch
from torch import nn


class KeepsPositiveRows(nn.Module):
    def __init__(self):
        super().__init__()
        self.score = nn.Linear(64, 1)
        self.head = nn.Linear(64, 4096)

    def forward(self, x):
        keep = torch.where(self.score(x).squeeze(1) > -1e9)[0]  # every row, known only from the weights' values
        return self.head(x[keep])


def build_model():
    return KeepsPositiveRows()


def example_input(batch_size):
    return torch.randn(batch_size, 64)
'''


def test_twice_the_batch_outgrowing_a_real_run_takes_the_memory_line_through_half_it(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory line against batch size needs a second step; where the model runs for real and twice the
    batch outgrows this machine's share, half the batch gives the line, where the estimate used to fail."""
    from advisor.memory.estimate import BatchMemoryModel, StepMemory
    from advisor.memory.plan import MemorySettings, trace_both_batches
    from advisor.profile.model_file import load_model_file

    path = tmp_path / "wide_head.py"
    path.write_text(WIDE_HEAD_FILE)
    model = load_model_file(str(path))
    traces = {b: trace_training_step(model.build_model, model.example_input, b) for b in (32, 64, 128)}
    peaks = {b: trace.memory.peak().bytes for b, trace in traces.items()}
    assert peaks[32] < peaks[64] < peaks[128]
    # the real run may hold more than batch 64's step, less than batch 128's
    monkeypatch.setattr(real_run, "real_run_budget_bytes", lambda: (peaks[64] + peaks[128]) // 2)
    first, second = trace_both_batches(model, MemorySettings(64, "fp32", "adamw"), parallel=False)
    assert (first.values, first.batch_size, second.batch_size) == ("real", 64, 32)
    line = BatchMemoryModel(StepMemory.of_trace(first), StepMemory.of_trace(second))
    # the line through batches 64 and 32 predicts batch 128's tensors within 1% (a dense head: linear in the batch)
    predicted = max(a + b * 128 for a, b in line.lines().values())
    assert abs(predicted - StepMemory.of_trace(traces[128]).tensor_peak) < 0.01 * predicted


def test_a_batch_of_one_whose_second_step_outgrows_a_real_run_says_why(tmp_path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """At batch 1 there is no half batch: the error says batch 1 runs and what the second step is for, not
    'try a smaller --batch-size'."""
    from advisor.memory.plan import MemorySettings, trace_both_batches
    from advisor.profile.model_file import load_model_file

    path = tmp_path / "wide_head.py"  # a sample of 256 rows: its activations outweigh the weights' share
    path.write_text(WIDE_HEAD_FILE.replace("torch.randn(batch_size, 64)", "torch.randn(batch_size * 256, 64)"))
    model = load_model_file(str(path))
    peaks = {b: trace_training_step(model.build_model, model.example_input, b).memory.peak().bytes for b in (1, 2)}
    monkeypatch.setattr(real_run, "real_run_budget_bytes", lambda: (peaks[1] + peaks[2]) // 2)
    with pytest.raises(real_run.RealRunTooLarge, match="batch 1 runs for real on this CPU, but the memory line") as error:
        trace_both_batches(model, MemorySettings(1, "fp32", "adamw"), parallel=False)
    assert "smaller --batch-size" not in str(error.value)


class MaskedByItsPadding(nn.Module):
    """Longformer in miniature: an attention-sized mask from the input's padding alone (batch x s x s), and a
    branch on it (`.any()`): input values, not the weights', which the real-inputs fallback answers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids[:, None, :] > 0) & (ids[:, :, None] > 0)  # batch x 2,048 x 2,048 booleans
        hidden = self.embed(ids)
        return hidden * 2 if bool(mask.any()) else hidden


def test_a_large_mask_from_the_inputs_keeps_its_real_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    """At batch 8 the mask has 8 x 2,048 x 2,048 = 33.5 M elements (33.5 MB of booleans): over the 2**24 elements
    a real twin was capped at, which ran the step for real as if it read its weights' values; under 1/16 of a
    4 GiB real-run budget (256 MiB), so it keeps its twin and the step traces on fake tensors."""
    from advisor.profile import trace as trace_module

    monkeypatch.setattr(trace_module, "real_run_budget_bytes", lambda: 4 * 2**30)
    ids = lambda batch: torch.randint(1, 16, (batch, 2048))  # noqa: E731
    trace = trace_training_step(MaskedByItsPadding, ids, 8, loss_fn=lambda out, _: out.float().mean())
    assert trace.values == "fake+real-inputs"
