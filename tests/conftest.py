"""Shared fixtures: small hand-written hardware databases in temporary directories."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

# The trace cache (advisor/profile/trace_cache.py) stays off in the tests, and in the commands they run, so
# that every test traces what it checks; tests/test_trace_cache.py turns it on in a folder of its own.
os.environ["GPU_ADVISOR_TRACE_CACHE"] = "off"
# Likewise the input pipeline is not timed unless a test asks (PlanRequest(input_pipeline=True)): a timed
# pipeline makes figures vary from run to run; tests/test_pipeline.py times it in a cache of its own.
os.environ["GPU_ADVISOR_INPUT_PIPELINE"] = "off"
# And the hardware database and reference calibrations are parsed from their files in every test
# (advisor/pickled.py's loaded(); tests/test_pickled.py turns it on in a folder of its own).
os.environ["GPU_ADVISOR_DATA_CACHE"] = "off"

SOURCES = {
    "sources": [
        {"id": "S1", "grade": "A", "title": "Test datasheet", "url": "https://example.invalid/s1"},
        {"id": "X", "grade": "X", "title": "not read", "url": ""},
    ]
}

TINY_GPU = {
    "id": "tiny-gpu",
    "name": "Tiny GPU",
    "vendor": "nvidia",
    "segment": "datacenter",
    "memory_gb": 16,
    "bandwidth_gbps": 500,
    "sm_count": 10,
    "peak_tflops": {"fp32": 10.0, "bf16_tensor": 40.0},
    "sources": ["S1"],
}

TINY_OFFER = {
    "gpu": "tiny-gpu",
    "provider": "testcloud",
    "instance": "t1.small",
    "gpus_per_instance": 1,
    "usd_per_gpu_hour": 1.25,
    "spot_usd_per_gpu_hour": 0.5,
    "region": "test-1",
    "source": "S1",
}


def write_yaml(path: Path, document: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def tiny_db_dir(tmp_path: Path) -> Path:
    """A complete minimal database: one source file, one GPU, one offer, defaults."""
    root = tmp_path / "base"
    write_yaml(root / "sources.yaml", SOURCES)
    write_yaml(root / "gpus" / "tiny.yaml", {"gpus": [dict(TINY_GPU)]})
    write_yaml(root / "prices" / "cloud.yaml", {"date": "2026-01-02", "offers": [dict(TINY_OFFER)]})
    write_yaml(root / "prices" / "defaults.yaml", {"electricity_usd_per_kwh": 0.2, "electricity_source": "S1"})
    return root


@pytest.fixture(autouse=True)
def isolated_user_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's ~/.config/gpu-advisor or $GPU_ADVISOR_HWDB."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg")))
    monkeypatch.delenv("GPU_ADVISOR_HWDB", raising=False)


@pytest.fixture(autouse=True)
def no_kept_worker() -> Iterator[None]:
    """No test inherits the child an earlier test's estimate kept for the next (memory.plan.keep_worker)."""
    yield
    kept = sys.modules.get("advisor.memory.plan")
    if kept is not None:
        kept.close_kept_worker()
