"""An estimate imports what it uses: the benchmark runner (--local), the custom ops of quantized weights,
float8 and Mamba's fused scan, and yaml (nothing to parse when the data cache holds it) are loaded by the
estimates that need them, not by every one (issue #24: they were about 40 ms of each fresh estimate)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAZY = ("advisor.calibration.runner", "advisor.probe.nvml", "advisor.profile.quantized", "advisor.profile.float8",
        "yaml")
OPS = ("selective_scan", "dequantize_blockwise", "adamw8bit_step_", "float8_cast_transpose")


def loaded_after(request: str, env: dict[str, str], gpu: str = "rtx-4090") -> dict[str, list[str]]:
    """Which of LAZY are imported and which of OPS registered after plan(PlanRequest(<request>)) in a new
    process."""
    code = ("import sys, json, torch\nfrom advisor.app.plan import plan\nfrom advisor.app.request import PlanRequest\n"
            "from advisor.hardware.loader import load_hwdb\n"
            f"plan(PlanRequest({request}, gpus=({gpu!r},), plans='never'), load_hwdb())\n"
            f"print(json.dumps({{'modules': [m for m in {LAZY!r} if m in sys.modules], "
            f"'ops': [o for o in {OPS!r} if hasattr(torch.ops.advisor, o)]}}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "GPU_ADVISOR_CACHE_DIR": str(tmp_path), "GPU_ADVISOR_DATA_CACHE": "on",
            "PYTHONPATH": str(REPO)}


def test_an_estimate_imports_no_runner_no_custom_op_and_once_cached_no_yaml(env: dict[str, str]) -> None:
    first = loaded_after("model='mlp'", env)
    assert first == {"modules": ["yaml"], "ops": []}  # yaml parsed the database and filled the cache
    assert loaded_after("model='mlp'", env) == {"modules": [], "ops": []}


def test_the_estimates_that_need_them_load_them(env: dict[str, str]) -> None:
    # a LoRA on nf4 weights with the 8-bit optimizer: the quantized module and both its ops; fp8: float8's op
    quantized = loaded_after("model='gpt2_small', lora=8, base_weights='nf4', optimizer='adamw8bit', "
                             "batch_size=1, seq_len=64", env)
    assert "advisor.profile.quantized" in quantized["modules"]
    assert {"dequantize_blockwise", "adamw8bit_step_"} <= set(quantized["ops"])
    fp8 = loaded_after("model='mlp', precision='fp8'", env, gpu="h100-sxm")
    assert "advisor.profile.float8" in fp8["modules"] and "float8_cast_transpose" in fp8["ops"]
