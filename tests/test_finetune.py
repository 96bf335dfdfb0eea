"""The LLM fine-tuning job (issue #26): models by name, LoRA, quantized frozen bases, 8-bit AdamW, the fit
advisor. Small models with hand-computable sizes; transformers-built ones skip without the extra."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from advisor.app.request import PlanRequest
from advisor.cli.main import main
from advisor.errors import UserError
from advisor.memory.estimate import StepMemory
from advisor.profile import hub
from advisor.profile.adapters import Adaptation
from advisor.profile.quantized import AdamW8bit, adamw8bit_state_bytes, weight_bytes
from advisor.profile.trace import trace_training_step


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class TwoProjections(nn.Module):
    """q_proj and v_proj, 64 -> 64 without bias, and an 8-way output layer: 2*4096 + 512 = 8,704 weights."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(64, 64, bias=False)
        self.v_proj = nn.Linear(64, 64, bias=False)
        self.out = nn.Linear(64, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.v_proj(self.q_proj(x)))


def trace(adaptation: Adaptation, precision: str = "amp-bf16", optimizer: str = "adamw"):
    return trace_training_step(TwoProjections, lambda batch: torch.randn(batch, 64), 4, precision, optimizer,
                               adaptation=adaptation)


# --- storage sizes --------------------------------------------------------------------------------------------


def test_quantized_weight_storage() -> None:
    # nf4: a [256, 128] weight = 32,768 codes of 4 bits = 16,384 B, absmax fp32 per 64: 512 * 4 = 2,048 B
    assert weight_bytes(256, 128, "nf4") == 16_384 + 2_048
    # nf4-dq: absmax as uint8 (512 B) and one fp32 constant per 256 absmax: 2 * 4 = 8 B
    assert weight_bytes(256, 128, "nf4-dq") == 16_384 + 512 + 8
    # int8: one byte per weight, one fp32 scale per output row: 32,768 + 256 * 4
    assert weight_bytes(256, 128, "int8") == 32_768 + 1_024


def test_adamw8bit_state_sizes() -> None:
    # 4,096 elements (the 8-bit threshold): 2 codes of 1 B each, 2 absmax per 256: 8,192 + 2 * 16 * 4
    assert adamw8bit_state_bytes(4096) == 8_192 + 128
    # 1,000 elements: 32-bit state, 2 * 4 B each
    assert adamw8bit_state_bytes(1000) == 8_000
    linear = nn.Linear(128, 64)  # weight 8,192 elements (8-bit), bias 64 (32-bit)
    optimizer = AdamW8bit(linear.parameters())
    linear(torch.randn(2, 128)).sum().backward()
    before = linear.weight.detach().clone()
    optimizer.step()
    state_bytes = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                      if isinstance(t, torch.Tensor))
    assert state_bytes == adamw8bit_state_bytes(8192) + adamw8bit_state_bytes(64)
    assert not torch.equal(before, linear.weight)  # the real kernel updates the weight


# --- LoRA and frozen bases ------------------------------------------------------------------------------------


def test_lora_trains_only_the_adapters() -> None:
    traced = trace(Adaptation(lora_rank=4))
    # q_proj and v_proj get A [4, 64] and B [64, 4]: 2 * (256 + 256) = 1,024 trainable
    assert traced.params == 1_024
    assert traced.total_params == 8_704 + 1_024
    assert "LoRA r=4 on 2 layers (q_proj, v_proj)" in traced.adapted


def test_lora_dropout_keeps_each_adapters_mask_and_dropped_input() -> None:
    plain = StepMemory.of_trace(trace(Adaptation(lora_rank=4), precision="fp32"))
    traced = trace(Adaptation(lora_rank=4, lora_dropout=0.1), precision="fp32")
    dropped = StepMemory.of_trace(traced)
    # each of q_proj's and v_proj's adapters keeps its dropped input (4 x 64 fp32: 1,024 B) and a bool mask
    # (256 B, in a 512-byte block) for the backward, as CUDA's native_dropout does: 2 x (1,024 + 512) = 3,072
    assert dropped.by_category["activations"] - plain.by_category["activations"] == 3_072
    assert [r.op for r in traced.records if "dropout" in r.op] == ["native_dropout", "native_dropout",
                                                                  "native_dropout_backward"]
    assert "dropout 0.1" in traced.adapted  # q_proj's input is the model's: no gradient flows back through it


def test_nf4_base_stores_the_frozen_linears_as_codes() -> None:
    traced = trace(Adaptation(lora_rank=4, base_weights="nf4"))
    weights = StepMemory.of_trace(traced).by_category["weights"]
    # q_proj, v_proj [64, 64] in nf4: 2,048 B of codes + 64 * 4 B of absmax each; out [8, 64]: 256 + 8 * 4;
    # adapters fp32: 1,024 * 4. Each storage takes whole 512-byte blocks of the caching allocator:
    # 2 * (2,048 + 512) + (512 + 512) + 4,096 = 10,240 (unrounded: 8,992)
    assert sum(weight_bytes(*shape, "nf4") for shape in ((64, 64), (64, 64), (8, 64))) + 4_096 == 8_992
    assert weights == 2 * (2_048 + 512) + (512 + 512) + 4_096
    ops = {(r.op, r.phase) for r in traced.records}
    assert ("dequantize_blockwise", "forward") in ops and ("dequantize_blockwise", "backward") in ops


def test_bf16_base_halves_the_frozen_weights() -> None:
    traced = trace(Adaptation(lora_rank=4, base_weights="bf16"))
    # 8,704 frozen weights in bf16 (2 B) and 1,024 adapter weights in fp32
    assert StepMemory.of_trace(traced).by_category["weights"] == 8_704 * 2 + 1_024 * 4


def test_unknown_lora_target_names_the_closest() -> None:
    with pytest.raises(UserError, match="did you mean q_proj"):
        trace(Adaptation(lora_rank=4, lora_targets=("q_prj",)))


def test_requests_check_the_adapter_options() -> None:
    with pytest.raises(UserError, match="--lora RANK"):
        PlanRequest(lora_targets=("q_proj",))
    with pytest.raises(UserError, match="needs 16-bit math"):
        PlanRequest(lora=8, base_weights="bf16", precision="fp32")
    with pytest.raises(UserError, match="LoRA rank must be at least 1"):
        PlanRequest(lora=0)
    with pytest.raises(UserError, match="--lora-dropout is the dropout of LoRA adapters"):
        PlanRequest(lora_dropout=0.1)
    with pytest.raises(UserError, match="a probability from 0 up to 1"):
        PlanRequest(lora=8, lora_dropout=1.0)
    assert PlanRequest(lora=8, lora_dropout=0.05).adaptation("bf16").lora_dropout == 0.05


# --- models by name -------------------------------------------------------------------------------------------


def test_the_catalog_answers_ids_names_and_aliases() -> None:
    assert hub.catalog_entry("meta-llama/Llama-3.1-8B")[0] == "meta-llama/Llama-3.1-8B"
    assert hub.catalog_entry("LLAMA-3.1-8B")[0] == "meta-llama/Llama-3.1-8B"
    assert hub.catalog_entry("gpt2")[0] == "openai-community/gpt2"
    for model_id, entry in hub.catalog().items():
        config = json.loads((hub.CATALOG_DIR / entry["file"]).read_text())
        assert "model_type" in config, model_id
        assert entry["source"].startswith("https://huggingface.co/"), model_id


def test_an_unknown_name_offline_is_one_sentence_with_suggestions(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(UserError, match=r"cannot resolve 'hf:meta-llama/Llama-3.1-8X'.*hf:meta-llama/Llama-3.1-8B"):
        hub.resolve_config("hf:meta-llama/Llama-3.1-8X")


def test_the_local_cache_comes_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    snapshot = tmp_path / "models--someone--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    (tmp_path / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "models--someone--tiny" / "refs" / "main").write_text("abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    found = hub.resolve_config("hf:someone/tiny")
    assert found.origin == "the local Hugging Face cache" and found.config["n_layer"] == 1


def test_default_sequence_length_is_capped_by_the_model() -> None:
    assert hub.default_seq_len({"max_position_embeddings": 131072}) == 2048
    assert hub.default_seq_len({"n_positions": 1024}) == 1024
    assert hub.default_seq_len({}) == 512  # T5: relative positions


TINY_GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
             "n_positions": 32, "vocab_size": 100}


def test_a_config_folder_traces_with_lora(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(TINY_GPT2))
    code, out, err = run(capsys, "estimate", str(tmp_path), "--gpu", "a10g", "--lora", "4", "--json")
    assert code == 0, err
    document = json.loads(out)
    # GPT-2's c_attn (Conv1D 64 -> 192) in 2 layers: A [4, 64] + B [192, 4] = 1,024 each
    assert document["model"]["trainable_params"] == 2_048
    assert document["settings"]["lora"] == 4 and document["settings"]["seq_len"] == 32
    # a language model: amp-bf16 assumed, and the frozen base in bf16 as fine-tuning scripts load it
    assert document["settings"]["precision"] == "amp-bf16" and document["settings"]["base_weights"] == "bf16"
    assert document["results"][0]["throughput_tokens_per_s"] > 0


# --- the fit advisor ------------------------------------------------------------------------------------------

WIDE = '''
import torch
from torch import nn

SAMPLE_UNIT = "rows"
BATCH_SIZE = 4

def build_model():
    # 2 x 40,000 x 40,000 = 3.2 G weights: fp32 AdamW needs 16 B each (51 GB), bf16 AdamW 8 B (26 GB)
    return nn.Sequential(nn.Linear(40000, 40000, bias=False), nn.Linear(40000, 40000, bias=False))

def example_input(batch_size):
    return torch.randn(batch_size, 40000)
'''


@pytest.mark.slow
def test_the_first_plan_fits_and_matches_a_direct_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "wide.py"
    model.write_text(WIDE)
    code, out, err = run(capsys, "estimate", str(model), "--gpu", "a100-sxm4-40gb", "--json", "--precision", "fp32")
    assert code == 0, err
    document = json.loads(out)
    assert not document["results"][0]["fits"]
    first = document["plans"][0]
    assert first["fits"] and first["peak_memory_bytes"] <= 40 * 1e9
    direct = ["--" + k.replace("_", "-") + ("" if v is True else f"={v}") for k, v in first["changes"].items()]
    code, out, err = run(capsys, "estimate", str(model), "--gpu", "a100-sxm4-40gb", "--json", "--precision", "fp32",
                         *direct)
    assert code == 0, err
    again = json.loads(out)["results"][0]
    assert again["fits"] and again["peak_memory_bytes"] == first["peak_memory_bytes"]
    assert math.isclose(again["time_to_train_s"], first["time_to_train_s"], rel_tol=1e-9)


@pytest.mark.slow
def test_ways_to_make_it_fit_are_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "wide.py"
    model.write_text(WIDE)
    code, out, err = run(capsys, "estimate", str(model), "--gpu", "a100-sxm4-40gb", "--precision", "fp32")
    assert code == 0, err
    assert "Ways to make it fit" in out and "\n1. --" in out
    assert "fits none of the 1 devices" in err
    code, out, err = run(capsys, "estimate", str(model), "--gpu", "a100-sxm4-40gb", "--precision", "fp32",
                         "--plans", "never")
    assert code == 2 and "Ways to make it fit" not in out


def test_the_built_in_adapter_has_peft_s_parameters(tmp_path: Path) -> None:
    """peft cannot wrap fake-tensor modules (its Module.to swaps fake parameters); the built-in adapter must
    train what peft's would: the same parameters, shape for shape, on a real tiny GPT-2."""
    peft = pytest.importorskip("peft")
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(TINY_GPT2))
    config = hub.resolve_config(str(tmp_path))
    wrapped = peft.get_peft_model(hub.build_function(config)(), peft.LoraConfig(r=4, target_modules=["c_attn"]))
    theirs = sorted(tuple(p.shape) for p in wrapped.parameters() if p.requires_grad)
    traced = trace_training_step(hub.build_function(config), hub.input_function(config.config), 1, "fp32",
                                 "adamw", hub.model_loss, adaptation=Adaptation(lora_rank=4))
    assert traced.params == sum(math.prod(shape) for shape in theirs) == 2_048


def test_the_micro_batch_tried_is_the_largest_divisor_that_fits() -> None:
    from advisor.app.fit import largest_micro_batch

    assert largest_micro_batch(8, 3) == 2  # 3 does not divide 8; 2 does
    assert largest_micro_batch(12, 5) == 4
    assert largest_micro_batch(8, None) == 1 and largest_micro_batch(8, 0) == 1
    assert largest_micro_batch(8, 100) == 8


@pytest.mark.slow
def test_the_report_has_the_ways_to_make_it_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "wide.py"
    model.write_text(WIDE)
    out = tmp_path / "plan.md"
    code, _, err = run(capsys, "report", str(model), "--gpu", "a100-sxm4-40gb", "--precision", "fp32", "-o", str(out))
    assert code == 0, err
    text = out.read_text()
    assert "## Ways to make it fit" in text and "\n1. " in text
    assert "Does not fit as asked; fits with" in text


def test_named_models_are_built_with_fp32_master_weights() -> None:
    pytest.importorskip("transformers")
    config = hub.resolve_config("hf:meta-llama/Llama-3.2-1B")
    assert config.config["torch_dtype"] == "bfloat16"  # the checkpoint's dtype, which from_config would use
    with torch.device("meta"):
        model = hub.build_function(config)()
    assert {p.dtype for p in model.parameters()} == {torch.float32}


class GatedMLP(nn.Module):
    """Llama's MLP, down(silu(gate(x)) * up(x)), 64 -> 128 -> 64: gate and up are siblings whose backward runs
    side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(64, 128, bias=False)
        self.up_proj = nn.Linear(64, 128, bias=False)
        self.down_proj = nn.Linear(128, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


TRACE_MODULES = """
import json, sys
import torch
sys.path.insert(0, {root!r})
from tests.test_finetune import GatedMLP
from advisor.profile.adapters import Adaptation
from advisor.profile.trace import trace_training_step
traced = trace_training_step(GatedMLP, lambda batch: torch.randn(batch, 64), 4, "amp-bf16", "adamw",
                             adaptation=Adaptation(lora_rank=4, lora_targets=("gate_proj", "up_proj", "down_proj")))
print(json.dumps([[r.phase, r.module, r.op] for r in traced.records]))
"""


def test_backward_ops_name_the_same_module_whatever_the_hash_seed() -> None:
    # in the backward, torch's ModuleTracker holds modules of one depth (gate_proj's lora_A, up_proj's
    # base_layer) in a set at once: which one names an op must not follow the set's order (the hash seed's)
    script = TRACE_MODULES.format(root=str(Path(__file__).resolve().parents[1]))
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                      env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout)
            for seed in range(6)]
    assert all(run == runs[0] for run in runs[1:])
    assert any(phase == "backward" and module.endswith("lora_A") for phase, module, _ in runs[0])


@pytest.mark.parametrize("argv, says", [(["--lora-dropout", "0.1"], "give their rank with --lora RANK"),
                                        (["--lora", "8", "--lora-dropout", "1.5"], "a probability from 0 up to 1")])
def test_a_wrong_lora_dropout_is_one_sentence_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                         says: str) -> None:
    code, _, err = run(capsys, "estimate", "mlp", *argv, "--gpu", "h100-sxm", "--no-input-pipeline")
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err
