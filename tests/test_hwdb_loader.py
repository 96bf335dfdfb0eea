"""The YAML loader on small fixtures: conversions, validation messages, layering."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from advisor.hardware.loader import HwdbError, load_directories
from tests.conftest import TINY_GPU, TINY_OFFER, write_yaml


def test_tiny_database_converts_to_si_units(tiny_db_dir: Path) -> None:
    db = load_directories([tiny_db_dir])
    gpu = db.gpu("tiny-gpu")
    # memory_gb 16 -> 16 * 2**30 = 17,179,869,184 bytes (vendor GB of device memory are binary)
    assert gpu.memory_bytes == 17_179_869_184
    # bandwidth_gbps 500 -> 500e9 bytes/s (decimal)
    assert gpu.bandwidth_bytes_per_s == 500e9
    # peak_tflops.bf16_tensor 40 -> 40e12 FLOP/s
    assert gpu.peaks.bf16_tensor == 40e12
    assert gpu.peaks.fp16_tensor is None
    assert db.defaults.electricity_usd_per_kwh == 0.2
    offer = db.cheapest_offer("tiny-gpu")
    assert offer is not None and offer.usd_per_gpu_hour == 1.25
    assert offer.date == dt.date(2026, 1, 2), "an offer without its own date takes the file's date"
    assert db.cheapest_offer("tiny-gpu", spot=True).spot_usd_per_gpu_hour == 0.5


def _with_gpu(tiny_db_dir: Path, **changes: object) -> Path:
    gpu = {**TINY_GPU, **changes}
    write_yaml(tiny_db_dir / "gpus" / "tiny.yaml", {"gpus": [{k: v for k, v in gpu.items() if v is not None}]})
    return tiny_db_dir


def _error(directories: list[Path]) -> str:
    with pytest.raises(HwdbError) as info:
        load_directories(directories)
    return str(info.value)


def test_negative_bandwidth_names_file_entry_and_key(tiny_db_dir: Path) -> None:
    message = _error([_with_gpu(tiny_db_dir, bandwidth_gbps=-900)])
    assert "tiny.yaml" in message and "'tiny-gpu'" in message and "'bandwidth_gbps'" in message
    assert "positive" in message


def test_misspelled_key_is_named_with_a_suggestion(tiny_db_dir: Path) -> None:
    gpu = {**TINY_GPU, "bandwith_gbps": 500}
    del gpu["bandwidth_gbps"]
    write_yaml(tiny_db_dir / "gpus" / "tiny.yaml", {"gpus": [gpu]})
    message = _error([tiny_db_dir])
    assert "'bandwith_gbps'" in message and "did you mean: bandwidth_gbps" in message and "'tiny-gpu'" in message


def test_duplicate_id_in_one_layer_is_an_error(tiny_db_dir: Path) -> None:
    write_yaml(tiny_db_dir / "gpus" / "copy.yaml", {"gpus": [dict(TINY_GPU)]})
    message = _error([tiny_db_dir])
    assert "duplicate GPU" in message and "'tiny-gpu'" in message and "key 'id'" in message
    assert "copy.yaml" in message and "tiny.yaml" in message


@pytest.mark.parametrize(
    ("changes", "key", "phrase"),
    [
        ({"memory_gb": None}, "memory_gb", "is required"),
        ({"memory_gb": 24_000}, "memory_gb", "not plausible"),
        ({"memory_gb": "24GB"}, "memory_gb", "must be a number"),
        ({"vendor": "nvdia"}, "vendor", "not one of"),
        ({"sources": ["S9"]}, "sources", "unknown source 'S9'"),
        ({"peak_tflops": {"fp32": 10, "bf16_tensr": 5}}, "peak_tflops.bf16_tensr", "did you mean: bf16_tensor"),
        ({"peak_tflops": {"fp32": 0}}, "peak_tflops.fp32", "positive"),
        ({"id": "Tiny GPU"}, "id", "lowercase"),
        ({"derived": {"tdp_w": "guess"}}, "derived", "does not have"),
        ({"unverified": ["sm_count"]}, "unverified", "source X"),
        ({"compute_capability": "eight"}, "compute_capability", "8.6"),
        ({"street_price_usd": 500}, "street_price_date", "date"),
        ({"nvlink": False, "nvlink_gbps": 100}, "nvlink_gbps", "nvlink is false"),
        ({"sustained_clock_mhz": 2000}, "boost_clock_mhz", "sustained clock needs the boost clock"),
        ({"boost_clock_mhz": 1800, "sustained_clock_mhz": 20_000}, "sustained_clock_mhz", "not plausible"),
    ],
)
def test_impossible_or_contradictory_gpu_values(tiny_db_dir: Path, changes: dict, key: str, phrase: str) -> None:
    message = _error([_with_gpu(tiny_db_dir, **changes)])
    assert f"key '{key}'" in message and phrase in message and "tiny.yaml" in message


def test_a_sustained_clock_runs_compute_faster_but_leaves_mfu_to_the_datasheet(tiny_db_dir: Path) -> None:
    from advisor.calibration.reference import load_families, reference_profile
    from advisor.hardware.loader import load_hwdb

    db = load_directories([_with_gpu(tiny_db_dir, boost_clock_mhz=1800, sustained_clock_mhz=1980)])
    gpu = db.gpu("tiny-gpu")
    assert gpu.sustained_clock_hz == 1980e6 and gpu.clock_ratio == pytest.approx(1.1)  # 1980 / 1800
    profile = reference_profile(gpu, load_families(load_hwdb([])))  # the shipped families: 'default' here
    # bf16 GEMMs against 40 TFLOP/s x 1.1 = 44 TFLOP/s; the profile's peaks (MFU's denominator) stay at 40
    assert profile.get("gemm", "bf16").peak == pytest.approx(44e12)
    assert profile.peaks.flops["bf16"] == 40e12
    plain = load_directories([_with_gpu(tiny_db_dir, boost_clock_mhz=1800, sustained_clock_mhz=None)]).gpu("tiny-gpu")
    assert plain.clock_ratio == 1.0


def test_offer_for_unknown_gpu_suggests_ids(tiny_db_dir: Path) -> None:
    write_yaml(tiny_db_dir / "prices" / "cloud.yaml", {"date": "2026-01-02", "offers": [{**TINY_OFFER, "gpu": "tiny-gpus"}]})
    message = _error([tiny_db_dir])
    assert "cloud.yaml" in message and "key 'gpu'" in message and "did you mean: tiny-gpu" in message


def test_spot_above_on_demand_is_contradictory(tiny_db_dir: Path) -> None:
    write_yaml(
        tiny_db_dir / "prices" / "cloud.yaml",
        {"date": "2026-01-02", "offers": [{**TINY_OFFER, "spot_usd_per_gpu_hour": 2.0}]},
    )
    message = _error([tiny_db_dir])
    assert "key 'spot_usd_per_gpu_hour'" in message and "above the on-demand" in message


def test_offer_needs_a_date(tiny_db_dir: Path) -> None:
    write_yaml(tiny_db_dir / "prices" / "cloud.yaml", {"offers": [dict(TINY_OFFER)]})
    assert "needs a date" in _error([tiny_db_dir])


def test_unknown_top_level_key_and_broken_yaml(tiny_db_dir: Path) -> None:
    write_yaml(tiny_db_dir / "extra.yaml", {"gpu": []})
    assert "extra.yaml: key 'gpu': unknown top-level key (did you mean: gpus" in _error([tiny_db_dir])
    (tiny_db_dir / "extra.yaml").write_text("gpus: [\n", encoding="utf-8")
    assert "extra.yaml: not valid YAML" in _error([tiny_db_dir])


def test_later_layer_replaces_entry_and_reports_it(tiny_db_dir: Path, tmp_path: Path) -> None:
    user = tmp_path / "user"
    write_yaml(user / "mine.yaml", {"gpus": [{**TINY_GPU, "memory_gb": 32}]})
    db = load_directories([tiny_db_dir, user])
    assert db.gpu("tiny-gpu").memory_bytes == 32 * 2**30
    assert len(db.overrides) == 1
    assert "tiny-gpu" in db.overrides[0].message() and "mine.yaml" in db.overrides[0].message()


def test_user_layer_can_add_gpus_offers_and_sources(tiny_db_dir: Path, tmp_path: Path) -> None:
    user = tmp_path / "user"
    write_yaml(
        user / "lab.yaml",
        {
            "date": "2026-02-03",
            "sources": [{"id": "LAB", "grade": "A", "title": "our invoice", "url": ""}],
            "gpus": [{**TINY_GPU, "id": "lab-gpu", "sources": ["LAB"]}],
            "offers": [{**TINY_OFFER, "gpu": "lab-gpu", "provider": "ourcluster", "source": "LAB"}],
        },
    )
    db = load_directories([tiny_db_dir, user])
    assert db.ids() == ["tiny-gpu", "lab-gpu"]
    assert db.providers() == ["ourcluster", "testcloud"]
    assert db.overrides == ()


def test_missing_electricity_default_is_reported(tiny_db_dir: Path) -> None:
    (tiny_db_dir / "prices" / "defaults.yaml").unlink()
    assert "electricity_usd_per_kwh" in _error([tiny_db_dir])


HOST_CPU = {"id": "slow-cpu", "name": "Slow CPU", "microarchitecture": "Old", "single_thread_score": 1500,
            "sources": ["S1"], "match": ["SLOW 1234"]}


def test_host_cpus_and_an_offers_host_cpu(tiny_db_dir: Path) -> None:
    write_yaml(tiny_db_dir / "host-cpus.yaml", {"host_cpus": [HOST_CPU]})
    write_yaml(tiny_db_dir / "prices" / "cloud.yaml",
               {"date": "2026-01-02", "offers": [{**TINY_OFFER, "host_cpu": "slow-cpu", "vcpus": 8}]})
    db = load_directories([tiny_db_dir])
    assert db.host_cpu("slow-cpu").single_thread_score == 1500
    assert db.cheapest_offer("tiny-gpu").host_cpu == "slow-cpu"
    # an offer naming a CPU the database lacks: file, entry, key and the closest id
    write_yaml(tiny_db_dir / "prices" / "cloud.yaml",
               {"date": "2026-01-02", "offers": [{**TINY_OFFER, "host_cpu": "slow-cpus"}]})
    message = _error([tiny_db_dir])
    assert "cloud.yaml" in message and "'host_cpu'" in message and "did you mean: slow-cpu" in message
    # a score that is no number, a cpuid family of the wrong shape
    write_yaml(tiny_db_dir / "prices" / "cloud.yaml", {"date": "2026-01-02", "offers": [dict(TINY_OFFER)]})
    write_yaml(tiny_db_dir / "host-cpus.yaml", {"host_cpus": [{**HOST_CPU, "single_thread_score": "fast"}]})
    assert "'single_thread_score'" in _error([tiny_db_dir])
    write_yaml(tiny_db_dir / "host-cpus.yaml", {"host_cpus": [{**HOST_CPU, "cpuid_family": "AMD 26"}]})
    assert "AuthenticAMD/26" in _error([tiny_db_dir])


LINK = {"id": "pcie-4", "pcie_gen": 4, "lanes": 16, "host_to_device_gbps": 25.9, "sources": ["S1"]}


def test_host_links_and_a_gpus_named_link(tiny_db_dir: Path) -> None:
    write_yaml(tiny_db_dir / "host-links.yaml", {"host_links": [LINK, {"id": "c2c", "host_to_device_gbps": 346,
                                                                       "sources": ["S1"]}]})
    db = load_directories([tiny_db_dir])
    # 25.9 GB/s = 25.9e9 bytes/s over 16 lanes
    assert db.host_links[0].host_to_device_bytes_per_s == 25.9e9 and db.host_links[0].lanes == 16
    assert db.host_links[1].pcie_gen is None and db.host_links[1].lanes is None
    gpus = tiny_db_dir / "gpus" / "tiny.yaml"
    write_yaml(gpus, {"gpus": [{**TINY_GPU, "host_link": "c2c"}]})
    assert load_directories([tiny_db_dir]).gpu("tiny-gpu").host_link == "c2c"
    # a link the database lacks: file, entry, key and the closest id
    write_yaml(gpus, {"gpus": [{**TINY_GPU, "host_link": "c2d"}]})
    message = _error([tiny_db_dir])
    assert "tiny.yaml" in message and "'host_link'" in message and "did you mean: c2c" in message
    # a PCIe link gives its generation and lanes together; a rate in TB/s is a unit mistake
    write_yaml(gpus, {"gpus": [dict(TINY_GPU)]})
    write_yaml(tiny_db_dir / "host-links.yaml", {"host_links": [{**LINK, "lanes": None}]})
    assert "both pcie_gen and lanes" in _error([tiny_db_dir])
    write_yaml(tiny_db_dir / "host-links.yaml", {"host_links": [{**LINK, "host_to_device_gbps": 0.0259}]})
    assert "'host_to_device_gbps'" in _error([tiny_db_dir])
