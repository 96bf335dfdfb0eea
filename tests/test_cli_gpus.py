"""`advisor gpus`: table, filters, sorting, JSON, overrides and errors through the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.cli.main import main
from tests.conftest import TINY_GPU, write_yaml
from tests.test_shipped_hwdb import REQUIRED_IDS


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_lists_every_required_id_and_five_providers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "gpus", "--json")
    assert code == 0 and err == ""
    document = json.loads(out)
    by_id = {g["id"]: g for g in document["gpus"]}
    assert set(REQUIRED_IDS) <= set(by_id)
    for gpu_id in REQUIRED_IDS:
        gpu = by_id[gpu_id]
        assert gpu["memory_bytes"] > 0 and gpu["bandwidth_bytes_per_s"] > 0
        assert any(v for v in gpu["peak"].values())
    providers = {offer["provider"] for g in document["gpus"] for offer in g["cloud"]}
    assert len(providers) >= 5


def test_table_is_aligned_and_sorted_by_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "gpus", "--min-memory-gb", "80")
    assert code == 0
    lines = out.splitlines()
    header, rule, rows = lines[0], lines[1], lines[2:]
    assert header.startswith("ID") and set(rule) <= {"-", " "}
    table_rows = rows[: rows.index("")]
    assert all(len(line) <= len(rule) for line in table_rows)
    ids = [line.split()[0] for line in table_rows]
    assert ids[0] == "mi300x" and "h100-sxm" in ids and "rtx-4090" not in ids


def test_provider_filter_and_price_sort(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "gpus", "--provider", "lambda", "--sort", "price", "--json")
    assert code == 0
    gpus = json.loads(out)["gpus"]
    prices = [g["cheapest_usd_per_gpu_hour"] for g in gpus]
    assert prices == sorted(prices) and len(prices) >= 5
    assert all(o["provider"] == "lambda" for g in gpus for o in g["cloud"])


def test_unknown_provider_is_one_sentence_with_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "gpus", "--provider", "lamda")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "did you mean: lambda" in err


def test_local_section_reports_cpu_and_missing_driver(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "gpus", "--local", "--json")
    assert code == 0
    local = json.loads(out)["local"]
    assert local["cpu"]["logical_cores"] >= 1
    assert isinstance(local["nvidia"]["available"], bool)
    if not local["nvidia"]["gpus"]:
        assert local["nvidia"]["reason"]


@pytest.mark.parametrize(
    ("document", "phrase"),
    [
        ({"gpus": [{**TINY_GPU, "sources": ["P23"]}, {**TINY_GPU, "sources": ["P23"]}]}, "duplicate GPU"),
        ({"gpus": [{**TINY_GPU, "bandwidth_gbps": -1, "sources": ["P23"]}]}, "key 'bandwidth_gbps'"),
        ({"gpus": [{**TINY_GPU, "memroy_gb": 1, "sources": ["P23"]}]}, "key 'memroy_gb'"),
    ],
)
def test_bad_override_directory_exits_2_naming_file_entry_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: dict, phrase: str
) -> None:
    write_yaml(tmp_path / "bad.yaml", document)
    code, out, err = run_cli(capsys, "gpus", "--hwdb", str(tmp_path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert "bad.yaml" in err and "'tiny-gpu'" in err and phrase in err


def test_override_replaces_shipped_entry_and_says_so_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    write_yaml(tmp_path / "mine.yaml", {"gpus": [{**TINY_GPU, "id": "rtx-3090", "memory_gb": 48, "sources": ["P23"]}]})
    code, out, err = run_cli(capsys, "gpus", "--hwdb", str(tmp_path), "--json")
    assert code == 0
    gpu = next(g for g in json.loads(out)["gpus"] if g["id"] == "rtx-3090")
    assert gpu["memory_bytes"] == 48 * 2**30
    assert err.count("advisor: note:") == 1 and "rtx-3090" in err and "replaces" in err


def test_environment_variable_and_config_dir_layers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "xdg" / "gpu-advisor" / "hwdb"
    write_yaml(config / "a.yaml", {"gpus": [{**TINY_GPU, "id": "config-gpu", "sources": ["P23"]}]})
    env_dir = tmp_path / "env"
    write_yaml(env_dir / "b.yaml", {"gpus": [{**TINY_GPU, "id": "env-gpu", "sources": ["P23"]}]})
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GPU_ADVISOR_HWDB", str(env_dir))
    code, out, _ = run_cli(capsys, "gpus", "--json")
    ids = {g["id"] for g in json.loads(out)["gpus"]}
    assert code == 0 and {"config-gpu", "env-gpu"} <= ids
    monkeypatch.setenv("GPU_ADVISOR_HWDB", str(tmp_path / "missing"))
    code, _, err = run_cli(capsys, "gpus")
    assert code == 2 and "GPU_ADVISOR_HWDB" in err


def test_hwdb_must_be_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "gpus", "--hwdb", str(tmp_path / "nope"))
    assert code == 2 and "not a directory" in err


def test_console_script_runs_from_another_directory(tmp_path: Path) -> None:
    """The installed `advisor` (or `python -m advisor`) finds its shipped data from any directory."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    env.pop("GPU_ADVISOR_HWDB", None)
    result = subprocess.run(
        [sys.executable, "-m", "advisor", "gpus", "--json"], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["gpus"]) >= len(REQUIRED_IDS)
