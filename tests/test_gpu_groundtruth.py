"""benchmarks/gpu_groundtruth.py: its dry run on this CPU (the same code as a GPU run, tiny sizes) writes
the layout a real run writes, every number where it belongs, and a second run skips what is done; an
out-of-memory is a row, not a crash; kernels are attributed as CUDA's profiler events would be; on a
machine with CUDA, one real row and one out-of-memory row."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from advisor.calibration.reference import family_for, load_families
from advisor.hardware.loader import load_hwdb
from advisor.paths import shipped_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_groundtruth as gt  # noqa: E402

pytestmark = pytest.mark.slow  # a dry run of the harness (seconds): `python -m pytest -m "not slow"` skips it

MODELS = "mlp,resnet50,gpt2_small,moe"
"""A CNN (two layouts, convolutions), attention, an MLP and the MoE: 40 rows, a few seconds each model."""


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def positive(row: dict[str, str], *columns: str) -> bool:
    return all(row[c] not in ("", None) and float(row[c]) > 0 for c in columns)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One whole dry run (every part) of four models; its folder and what it printed."""
    out = tmp_path_factory.mktemp("groundtruth")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg")))
        printed = _main(["--dry-run", "--out", str(out), "--models", MODELS, "--budget-s", "0"], expected=0)
    return out, printed


def _main(argv: list[str], expected: int) -> str:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = gt.main(argv)
    assert code == expected, buffer.getvalue()
    return buffer.getvalue()


def test_dry_run_writes_every_file_with_its_columns(dry_run: tuple[Path, str]) -> None:
    out, printed = dry_run
    assert sorted(p.name for p in out.iterdir()) == sorted(gt.FILES)
    environment = json.loads((out / "environment.json").read_text())
    for key in ("date", "gpu_name", "gpu_id", "driver", "cuda", "torch", "python", "precisions", "settings"):
        assert key in environment
    assert environment["dry_run"] is True and environment["gpu_name"].startswith("DRY RUN")
    progress = json.loads((out / "progress.json").read_text())["parts"]
    assert {part: progress[part]["status"] for part in gt.PARTS} == dict.fromkeys(gt.PARTS, "done")
    for name, columns in (("steps.csv", gt.STEP_COLUMNS), ("kernels.csv", gt.KERNEL_COLUMNS),
                          ("comparison.csv", gt.COMPARISON_COLUMNS), ("probes.csv", gt.PROBE_COLUMNS)):
        with (out / name).open() as handle:
            assert tuple(next(csv.reader(handle))) == columns, name
    assert "median |error| step time, ours" in printed and "bare roofline" in printed


def test_dry_run_times_the_probes_with_the_time_models_thin_gemms_beside(dry_run: tuple[Path, str]) -> None:
    out, printed = dry_run
    probes = read(out / "probes.csv")
    # reuse at 2 sizes, batch norm forward and backward at 2 batches in 2 dtypes, each hot and cold; 2 GEMMs;
    # attention forward and backward without a mask, causal and padded, as PyTorch picks the kernels
    assert len(probes) == 2 * (2 + 2 * 2 * 2) + 2 + 2 * 3
    cached = [r for r in probes if r["kind"] in ("reuse", "bn_forward", "bn_backward")]
    assert {(r["kind"], r["state"]) for r in cached} == {(k, s) for k in ("reuse", "bn_forward", "bn_backward")
                                                         for s in ("hot", "cold")}
    assert all(positive(r, "seconds", "bytes", "elements") for r in probes)
    thin = [r for r in probes if r["kind"] == "thin_gemm"]
    # 64x4 @ 4x64 in bf16: a, b and the product, 2 * (64*64 + 64*4 + 64*4) = 9,216 bytes
    assert [(r["shape"], int(r["bytes"])) for r in thin] == [("64x4x64", 9216), ("64x64x4", 9216)]
    assert all(positive(r, "predicted_s") for r in thin)  # predicted for the dry run's stand-in, h100-sxm
    assert "reuse (z = y + 1, fp32): hot / cold" in printed and "elements per second per block" in printed
    assert "thin GEMMs, bf16, operands from DRAM: measured, the time model's for h100-sxm" in printed
    attention = [r for r in probes if r["kind"].startswith("attention")]
    assert {(r["kind"], r["state"]) for r in attention} == {
        (kind, f"{mask}/default") for mask in ("none", "causal", "padding") for kind in ("attention", "attention_backward")}
    assert all(positive(r, "seconds", "elements", "predicted_s") for r in attention)
    assert "attention, TFLOP/s (forward, backward), the time model's for h100-sxm" in printed


def test_dry_run_rows_hold_positive_numbers(dry_run: tuple[Path, str]) -> None:
    out, _ = dry_run
    steps = read(out / "steps.csv")
    specs = [s for s in gt.model_specs() if s.name in MODELS.split(",")]
    # 4 precisions x 2 batches, CNNs also channels-last: mlp 8 + resnet50 16 + gpt2 8 + moe 8
    assert len(steps) == len(gt.planned_rows(specs, dry=True)) == 40
    assert {r["layout"] for r in steps if r["model"] == "resnet50"} == {"nchw", "channels_last"}
    ran = [r for r in steps if r["status"] == "ok"]
    assert len(ran) == 40, [r["message"] for r in steps if r["status"] != "ok"]
    for row in ran:
        assert positive(row, "step_time_median_s", "step_time_min_s", "samples_per_s", "peak_allocated_bytes",
                        "steady_peak_allocated_bytes", "peak_reserved_bytes", "params"), row
        assert float(row["step_time_min_s"]) <= float(row["step_time_median_s"]) <= float(row["step_time_max_s"])
        assert int(row["timed_steps"]) == gt.DRY.min_timed_steps and float(row["step_time_spread"]) >= 0
        assert row["device_used_bytes"] == ""  # a CPU has no such figure
    comparison = read(out / "comparison.csv")
    assert len(comparison) == len(ran)
    for row in comparison:
        assert positive(row, "measured_step_s", "predicted_step_s", "bare_step_s", "calibrated_step_s",
                        "predicted_allocated_bytes", "predicted_reserved_bytes", "predicted_peak_bytes"), row
        assert row["predicted_fits"] == "True" and row["calibration"].startswith("hopper")


def test_dry_run_kernels_name_convolutions_attention_and_matmuls(dry_run: tuple[Path, str]) -> None:
    out, _ = dry_run
    kernels = read(out / "kernels.csv")
    categories = {(r["model"], r["category"]) for r in kernels}
    assert {("resnet50", "conv"), ("gpt2_small", "attention"), ("gpt2_small", "matmul"), ("moe", "matmul")} <= categories
    # one profiled step per model/precision/layout, each with forward and backward kernels
    groups = {(r["model"], r["precision"], r["layout"]) for r in kernels}
    assert len(groups) == 4 * (1 + 2 + 1 + 1)
    assert {r["phase"] for r in kernels} >= {"forward", "backward", "optimizer"}
    assert all(float(r["device_time_us"]) >= 0 and int(r["calls"]) > 0 for r in kernels)
    conv = [r for r in kernels if r["category"] == "conv" and r["phase"] == "backward"]
    assert conv and all("convolution" in r["op"] for r in conv)


def test_dry_run_calibration_loads_as_a_measured_reference(dry_run: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = dry_run
    document = json.loads((out / "calibration.json").read_text())
    assert document["applies_to"] == {"gpu_ids": [gt.DRY_GPU_ID]} and document["profile"]["status"] == "measured"
    reference = tmp_path / "reference"
    shutil.copytree(shipped_dir("calibration", "suite.yaml") / "reference", reference)
    (reference / "measured" / f"{gt.DRY_GPU_ID}.json").write_text(json.dumps(document))
    db = load_hwdb([])
    families = load_families(db, reference)  # the loader `advisor calibrate --references` lists from
    family = family_for(db.gpu(gt.DRY_GPU_ID), families)
    assert family.id == gt.DRY_GPU_ID and family.measured is not None
    assert family.measured.software["torch"] == torch.__version__


def test_install_refuses_a_dry_run(dry_run: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = dry_run
    assert gt.main(["--install-profile", str(out)]) == 2
    assert "is a dry run" in capsys.readouterr().err


def test_a_real_runs_profile_installs_where_the_loader_reads_it(dry_run: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = dry_run
    real = tmp_path / "2026-01-01-h100-sxm"
    shutil.copytree(out, real)
    environment = json.loads((real / "environment.json").read_text()) | {"dry_run": False}
    (real / "environment.json").write_text(json.dumps(environment))
    measured = tmp_path / "measured"
    measured.mkdir()
    assert gt.install_profile(real, measured) == measured / "h100-sxm.json"
    assert json.loads((measured / "h100-sxm.json").read_text()) == json.loads((out / "calibration.json").read_text())


def test_a_second_run_skips_what_is_done_and_measures_a_torn_row_again(dry_run: tuple[Path, str]) -> None:
    out, _ = dry_run
    kept = {name: (out / name).read_bytes() for name in ("tests.txt", "calibration.json", "steps.csv",
                                                        "kernels.csv", "comparison.csv", "probes.csv")}
    _main(["--dry-run", "--out", str(out), "--models", MODELS], expected=0)
    assert {name: (out / name).read_bytes() for name in kept} == kept
    commands = json.loads((out / "progress.json").read_text())["commands"]
    # tests, calibration, rows, predictions, the probes
    assert [c["units"] for c in commands][-2:] == [2 + 40 + 40 + 1, 0]
    # a command killed while writing its last row leaves half a line: it is dropped and measured again
    steps = (out / "steps.csv").read_text()
    lines = steps.splitlines(keepends=True)
    (out / "steps.csv").write_text("".join(lines[:-1]) + lines[-1][:25])
    last = list(csv.DictReader(lines[:1] + lines[-1:]))[0]
    _main(["--dry-run", "--out", str(out), "--models", MODELS, "--part", "steps"], expected=0)
    rows = read(out / "steps.csv")
    assert len(rows) == 40 and (rows[-1]["model"], rows[-1]["batch"]) == (last["model"], last["batch"])
    assert rows[-1]["status"] == "ok"


def test_out_of_memory_is_a_row_and_the_larger_batch_is_not_tried(tmp_path: Path, monkeypatch) -> None:
    real_step = gt.Training.step

    def step(self: gt.Training) -> None:
        if self.autocast is torch.bfloat16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        real_step(self)

    monkeypatch.setattr(gt.Training, "step", step)
    _main(["--dry-run", "--out", str(tmp_path), "--part", "steps:mlp"], expected=gt.EXIT_MORE)
    rows = {(r["batch"], r["precision"]): r for r in read(tmp_path / "steps.csv")}
    assert rows[("2", "amp-bf16")]["status"] == "oom" and "out of memory" in rows[("2", "amp-bf16")]["message"]
    assert rows[("4", "amp-bf16")]["status"] == "oom" and rows[("4", "amp-bf16")]["message"].startswith("not run")
    assert {r["status"] for k, r in rows.items() if k[1] != "amp-bf16"} == {"ok"}
    monkeypatch.setattr(gt.Training, "step", real_step)
    printed = _main(["--dry-run", "--out", str(tmp_path), "--part", "compare", "--models", "mlp"], expected=gt.EXIT_MORE)
    notes = {(r["batch"], r["precision"]): r["note"] for r in read(tmp_path / "comparison.csv")}
    assert notes[("2", "amp-bf16")] == "ran out of memory, predicted to fit"  # tiny on an H100: the row says so
    assert "OOM" in printed


def _event(name: str, parent=None, kernels=(), self_us: float = 0.0) -> SimpleNamespace:
    event = SimpleNamespace(name=name, cpu_parent=parent, cpu_children=[], device_type="DeviceType.CPU",
                            kernels=[SimpleNamespace(name=k, duration=d) for k, d in kernels],
                            self_cpu_time_total=self_us)
    if parent is not None:
        parent.cpu_children.append(event)
    return event


def test_cuda_kernels_go_to_the_outermost_convolution_attention_or_matmul_op() -> None:
    forward = _event("gt.forward")
    linear = _event("aten::linear", forward, self_us=1.0)
    addmm = _event("aten::addmm", linear, [("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n", 30.0)], self_us=5.0)
    sdpa = _event("aten::scaled_dot_product_attention", forward)
    _event("aten::_scaled_dot_product_flash_attention", sdpa, [("pytorch_flash::flash_fwd_kernel", 50.0)])
    relu = _event("aten::relu", forward, [("vectorized_elementwise_kernel", 10.0)])
    norm = _event("aten::batch_norm", forward)
    _event("aten::native_batch_norm", norm, [("batch_norm_collect_statistics_kernel", 7.0),
                                             ("batch_norm_transform_input_kernel", 3.0)])
    backward = _event("autograd::engine::evaluate_function: ConvolutionBackward0")
    conv = _event("aten::convolution_backward", backward,
                  [("sm90_xmma_dgrad_implicit_gemm", 60.0), ("sm90_xmma_wgrad_implicit_gemm", 40.0)])
    events = [forward, linear, addmm, sdpa, *sdpa.cpu_children, relu, norm, *norm.cpu_children, backward, conv]
    rows = {(r["phase"], r["category"], r["op"], r["kernel"]): r for r in gt.kernel_rows(events, cuda=True)}
    assert rows[("forward", "matmul", "aten::linear", "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n")]["calls"] == 1
    assert ("forward", "attention", "aten::scaled_dot_product_attention", "pytorch_flash::flash_fwd_kernel") in rows
    assert rows[("forward", "other", "aten::relu", "(all kernels)")]["device_time_us"] == 10.0
    assert rows[("forward", "norm", "aten::batch_norm", "batch_norm_collect_statistics_kernel")]["calls"] == 1
    dgrad = rows[("backward", "conv", "aten::convolution_backward", "sm90_xmma_dgrad_implicit_gemm")]
    assert dgrad["share_of_step"] == pytest.approx(60 / 200, abs=1e-4)  # of 30+50+10+7+3+60+40 = 200 us
    # on a CPU (dry run) each aten op stands for a kernel, for the time outside its children
    cpu = {r["kernel"]: r for r in gt.kernel_rows(events, cuda=False) if r["category"] == "matmul"}
    assert cpu["aten::addmm"]["device_time_us"] == 5.0 and cpu["aten::linear"]["op"] == "aten::linear"


def test_cuda_kernels_not_linked_to_ops_keep_their_names() -> None:
    kernel = SimpleNamespace(name="sm90_xmma_fprop_implicit_gemm_f16f16", device_type="DeviceType.CUDA",
                             time_range=SimpleNamespace(start=10.0, end=35.0))
    (row,) = gt.kernel_rows([_event("aten::conv2d"), kernel], cuda=True)
    assert (row["category"], row["kernel"], row["device_time_us"]) == ("conv", kernel.name, 25.0)


def test_bundled_dependencies_are_plain_folders(tmp_path: Path) -> None:
    pytest.importorskip("fvcore")
    assert gt.bundle_deps(tmp_path / ".deps") == 0
    assert (tmp_path / ".deps" / ".gitignore").read_text() == "*\n"  # the folder keeps itself out of git
    for package in ("fvcore", "iopath", "yacs", "termcolor"):
        assert (tmp_path / ".deps" / package / "__init__.py").is_file(), package


def test_the_tests_part_selects_the_tests_behind_a_cuda_condition() -> None:
    ids = gt.gpu_test_ids()
    assert "tests/test_calibration.py::test_tiny_calibration_on_a_gpu" in ids
    assert "tests/test_gpu_groundtruth.py::test_one_row_and_an_out_of_memory_on_cuda" in ids
    assert not any("bad_device" in i for i in ids)  # parametrized with "cuda:x": no CUDA condition


def test_a_missing_dependency_is_one_sentence() -> None:
    code = ("import runpy, sys; sys.modules['scipy'] = None; sys.argv = ['gpu_groundtruth.py', '--dry-run']; "
            "runpy.run_path('benchmarks/gpu_groundtruth.py', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "needs scipy" in done.stderr and "--bundle-deps" in done.stderr


def test_a_missing_test_dependency_blocks_only_the_tests_part(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(gt.FOR_TESTS, "no_such_module_for_gt", "no-such-dist")
    assert gt.main(["--dry-run", "--out", str(tmp_path), "--part", "tests"]) == gt.EXIT_MORE
    assert "the tests part needs no-such-dist" in capsys.readouterr().err
    assert json.loads((tmp_path / "progress.json").read_text())["parts"]["tests"]["status"] == "blocked"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_row_and_an_out_of_memory_on_cuda() -> None:
    """The real path before the long run: CUDA events, the allocator's peaks, CUDA kernels by name, and an
    allocation far beyond the card recorded as out of memory with the memory given back."""
    device = gt.CudaDevice(0)
    key = gt.RowKey("resnet50", 2, "amp-fp16", "channels_last")
    result = gt.measure_row(gt.EXAMPLES["resnet50"], key, device, gt.DRY, dry=True, profile_kernels=True)
    assert result.status == "ok", result.message
    assert all(t > 0 for t in result.times_s)
    memory = result.memory
    assert 0 < memory.steady_allocated <= memory.peak_allocated <= memory.peak_reserved < memory.device_used
    conv = [k for k in result.kernels if k["category"] == "conv"]
    assert conv and not any(k["kernel"].startswith("aten::") for k in conv)
    huge = gt.ModelSpec("oom_probe", "mlp", "test", lambda dry: (
        lambda: torch.nn.Linear(4, 4), lambda batch: torch.randn(batch, 4),
        lambda output, inputs: output.sum() + torch.empty(2**40, device=output.device).sum()), (2, 4), "sgd")
    result = gt.measure_row(huge, gt.RowKey("oom_probe", 2, "fp32", "contiguous"), device, gt.DRY, True, False)
    assert result.status == "oom", result.message
    assert torch.cuda.memory_allocated() < 2**20


def test_the_long_sequence_llm_runs_checkpointed_in_its_own_precisions(tmp_path: Path, monkeypatch) -> None:
    """hf_llama_1b_ckpt (universal-llm-trainer's recipe on a 1B model): pure bf16 and amp-bf16 only, the model
    checkpointed as transformers' users run it, each row predicted from a trace checkpointed as
    `advisor estimate --checkpointing` traces it."""
    pytest.importorskip("transformers")
    spec = next(s for s in gt.model_specs() if s.name == "hf_llama_1b_ckpt")
    model = gt.build_training(spec, gt.RowKey(spec.name, 2, "bf16", "contiguous"), gt.CpuDevice(), dry=True).model
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    _main(["--dry-run", "--out", str(tmp_path / "gt"), "--part", "steps:hf_llama_1b_ckpt"], expected=gt.EXIT_MORE)
    rows = read(tmp_path / "gt" / "steps.csv")
    assert sorted((r["precision"], r["batch"]) for r in rows) == [("amp-bf16", "2"), ("amp-bf16", "4"),
                                                                  ("bf16", "2"), ("bf16", "4")]
    assert {r["status"] for r in rows} == {"ok"}
    real_trace, checkpointed = gt.trace_training_step, []

    def trace(*args, **kwargs):
        checkpointed.append(kwargs["checkpointing"])
        return real_trace(*args, **kwargs)

    monkeypatch.setattr(gt, "trace_training_step", trace)
    _main(["--dry-run", "--out", str(tmp_path / "gt"), "--part", "compare", "--models", "hf_llama_1b_ckpt"],
          expected=gt.EXIT_MORE)
    assert checkpointed and all(checkpointed)
    assert all(r["predicted_step_s"] for r in read(tmp_path / "gt" / "comparison.csv"))


def test_the_padded_long_sequence_llm_makes_attention_compute_every_score() -> None:
    """hf_llama_1b_ckpt_padded passes universal-llm-trainer's padded attention mask: transformers hands SDPA a
    4-D mask, so the trace counts all s x s scores, where the unpadded model's causal kernels skip half."""
    pytest.importorskip("transformers")
    import groundtruth_models as models

    def attention_flops(parts) -> float:
        build, make_input, loss = parts(True)
        trace = gt.trace_training_step(build, make_input, 2, "bf16", "adamw", loss, checkpointing=True,
                                       attention="cuda")
        return sum(r.flops for r in trace.records if r.op == "_scaled_dot_product_flash_attention_for_cpu")

    mask = models._hf_llama_long_padded(True)[1](2)["attention_mask"]
    # dry: 32 tokens, --padding-mask's ones over the first 75%: round(32 * 0.75) = 24
    assert mask.shape == (2, 32) and mask.sum().item() == 2 * 24 and mask[:, :24].all()
    # 2 x 4 heads, 32 x 32 scores, head dim 16: 2 * 8 * 32 * 32 * (16 + 16) = 524,288 FLOPs a call, 4 calls (2
    # layers, forward and checkpointed recompute) = 2,097,152; causal: x (32 + 1) / (2 * 32) = 1,081,344
    assert attention_flops(models._hf_llama_long_padded) == pytest.approx(4 * 524_288)
    assert attention_flops(models._hf_llama_long) == pytest.approx(4 * 524_288 * 33 / 64)


def test_a_csv_written_before_columns_were_added_reads_with_them_empty(tmp_path: Path) -> None:
    # steps.csv of the 2026-11-27 H100 run has no alloc_retries: read with it empty (the file left as it is:
    # accuracy.py --part gpu reads the repository's runs), rewritten when a row is added; a file whose
    # columns differ otherwise is another version's
    path = tmp_path / "steps.csv"
    path.write_text("a,b\n1,2\n")
    table = gt.CsvTable(path, ("a", "b", "c"))
    assert table.rows() == [{"a": "1", "b": "2", "c": ""}]
    assert path.read_text() == "a,b\n1,2\n"
    table.append([{"a": 3, "b": 4, "c": 5}])
    assert path.read_text().splitlines()[0] == "a,b,c"
    assert [r["c"] for r in table.rows()] == ["", "5"]
    path.write_text("a,x\n1,2\n")
    with pytest.raises(gt.UsageError):
        table.rows()
