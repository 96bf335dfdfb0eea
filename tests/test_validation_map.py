"""Every GPU label in ../shared/validation maps to a database id (the accuracy benchmark needs it)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from advisor.hardware.loader import load_hwdb

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT.parent / "shared" / "validation"


def load_map() -> dict[str, str]:
    return yaml.safe_load((ROOT / "benchmarks" / "validation_gpus.yaml").read_text(encoding="utf-8"))["labels"]


def test_every_mapped_id_exists() -> None:
    db = load_hwdb(include_user_layers=False)
    assert [f"{label} -> {gpu_id}" for label, gpu_id in load_map().items() if not db.has(gpu_id)] == []


@pytest.mark.skipif(not VALIDATION.is_dir(), reason="../shared/validation is not beside this checkout")
def test_every_validation_label_is_mapped() -> None:
    labels = set()
    for name in ("published-throughput.csv", "published-memory.csv", "published-throughput-newer.csv"):
        with open(VALIDATION / name, newline="", encoding="utf-8") as handle:
            labels |= {row["gpu"] for row in csv.DictReader(handle)}
    assert labels - set(load_map()) == set()
