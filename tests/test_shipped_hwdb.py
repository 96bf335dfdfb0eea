"""Every shipped file loads, required GPUs exist with the figures the estimator needs, every figure
is sourced, and the shipped data keeps the conventions the reference settled."""

from __future__ import annotations

import pytest

from advisor import units
from advisor.calibration.reference import load_families
from advisor.hardware.loader import load_hwdb
from advisor.hardware.specs import HardwareDB

REQUIRED_IDS = """
rtx-3060 rtx-3060-ti rtx-3070 rtx-3080 rtx-3080-ti rtx-3090 rtx-3090-ti rtx-4060-ti-16gb rtx-4070
rtx-4070-ti-super rtx-4080-super rtx-4090 rtx-5090 rtx-a4000 rtx-a4500 rtx-a5000 rtx-a5500 rtx-a6000
rtx-6000-ada quadro-rtx-5000 quadro-rtx-6000 quadro-rtx-8000 titan-rtx titan-v gtx-1080-ti rtx-2080-ti
t4 v100-sxm2-16gb v100-sxm2-32gb v100-pcie-16gb a10 a10g a40 l4 l40s a100-pcie-40gb a100-sxm4-40gb
a100-pcie-80gb a100-sxm4-80gb h100-pcie h100-sxm h100-nvl gh200 h200-sxm b200 mi300x
""".split()


@pytest.fixture(scope="module")
def db() -> HardwareDB:
    return load_hwdb(include_user_layers=False)


def test_every_required_id_exists_with_memory_bandwidth_and_a_peak(db: HardwareDB) -> None:
    for gpu_id in REQUIRED_IDS:
        gpu = db.gpu(gpu_id)
        assert gpu.memory_bytes > 0 and gpu.bandwidth_bytes_per_s > 0, gpu_id
        assert gpu.peaks.fp32 or gpu.peaks.best_low_precision_tensor(), gpu_id


def test_prices_from_at_least_five_providers(db: HardwareDB) -> None:
    assert {"aws", "gcp", "azure", "lambda", "runpod"} <= set(db.providers())


def test_every_source_cited_exists_and_every_source_is_cited(db: HardwareDB) -> None:
    known = {s.id for s in db.sources}
    cited = {s for gpu in db.gpus for s in gpu.sources} | {o.source for o in db.offers}
    cited |= {s for overhead in db.memory_overheads for s in overhead.sources}
    cited |= {s for cpu in db.host_cpus for s in cpu.sources}
    cited |= {s for link in db.host_links for s in link.sources}
    cited |= {s for link in db.interconnects for s in link.sources}
    cited |= {s for family in load_families(db) for s in family.sources}  # calibration/reference/
    cited.add(db.defaults.electricity_source)
    assert cited <= known
    assert known - cited == set(), "sources listed but never cited"


def test_every_offer_host_cpu_exists(db: HardwareDB) -> None:
    named = {o.host_cpu for o in db.offers} - {None}
    assert named and named <= {cpu.id for cpu in db.host_cpus}
    # the instances of the example: p4d hosts A100s on Cascade Lake Xeons
    p4d = next(o for o in db.offers if o.instance == "p4d.24xlarge")
    assert p4d.host_cpu == "xeon-8275cl"


def test_every_gpu_has_a_host_link(db: HardwareDB) -> None:
    # the batch's copy to the GPU needs its PCIe generation, or a named link (Grace Hopper's NVLink-C2C)
    for gpu in db.gpus:
        assert gpu.pcie_gen is not None or gpu.host_link is not None, gpu.id
    assert db.gpu("gh200").host_link == "nvlink-c2c"
    # every x86 CPU of a GPU offer says its PCIe generation
    named = {o.host_cpu for o in db.offers} - {None}
    assert all(db.host_cpu(cpu_id).pcie_gen in (3, 4, 5) for cpu_id in named)


def test_unverified_figures_are_marked_with_source_x(db: HardwareDB) -> None:
    for gpu in db.gpus:
        assert bool(gpu.unverified) <= ("X" in gpu.sources), gpu.id


def test_geforce_fp32_accumulate_rate_is_half_of_fp16_accumulate(db: HardwareDB) -> None:
    for gpu in db.gpus:
        peaks = gpu.peaks
        if gpu.segment in ("geforce", "laptop") and peaks.fp16_tensor_fp16_acc and gpu.id != "titan-rtx":
            assert peaks.fp16_tensor == pytest.approx(peaks.fp16_tensor_fp16_acc / 2, rel=0.01), gpu.id


def test_tensor_peaks_are_dense_figures(db: HardwareDB) -> None:
    # H100 SXM: 132 SM x 1.83 GHz x 4096 FLOP/clk/SM = 989.4 TFLOPS dense (1,978.9 is the sparse figure).
    assert db.gpu("h100-sxm").peaks.bf16_tensor == pytest.approx(989.4e12)
    # H200 computes like an H100 SXM: its 1,979 "listed" figure is sparse.
    assert db.gpu("h200-sxm").peaks.bf16_tensor == db.gpu("h100-sxm").peaks.bf16_tensor
    # A100: 108 SM x 1.41 GHz x 2048 = 311.9 TFLOPS dense.
    assert db.gpu("a100-sxm4-80gb").peaks.fp16_tensor == pytest.approx(108 * 1.41e9 * 2048, rel=0.01)


def test_memory_in_binary_units(db: HardwareDB) -> None:
    # An "80 GB" A100 reports 81,920 MiB = 80 * 2**30 bytes.
    assert db.gpu("a100-sxm4-80gb").memory_bytes == 81_920 * 2**20
    assert db.gpu("rtx-3090").memory_bytes == 24 * units.GIB


def test_conflicts_settled_as_documented(db: HardwareDB) -> None:
    assert db.gpu("rtx-4090").l2_cache_bytes == 72 * 2**20
    assert db.gpu("l40s").tdp_watts == 350
    assert db.gpu("rtx-4060-ti-16gb").sm_count == 34
    runpod_l40s = db.offers_for("l40s", "runpod")[0]
    assert (runpod_l40s.usd_per_gpu_hour, runpod_l40s.spot_usd_per_gpu_hour) == (0.86, 0.43)


def test_spot_never_above_on_demand_and_per_gpu_prices(db: HardwareDB) -> None:
    for offer in db.offers:
        assert offer.spot_usd_per_gpu_hour is None or offer.spot_usd_per_gpu_hour <= offer.usd_per_gpu_hour
    p5 = next(o for o in db.offers if o.instance == "p5.48xlarge")
    # p5.48xlarge: 98.32 $/h for 8 GPUs = 12.29 $/GPU-h
    assert p5.instance_usd_per_hour == pytest.approx(98.32)


def test_every_gpu_architecture_has_a_memory_overhead(db: HardwareDB) -> None:
    architectures = {o.architecture for o in db.memory_overheads}
    assert "default" in architectures
    for gpu in db.gpus:
        assert gpu.architecture in architectures, gpu.id
        overhead = db.memory_overhead(gpu)
        assert 100 * 2**20 < overhead.cuda_context_bytes < 2 * 2**30, gpu.id


def test_hopper_uses_the_32_mib_cublas_workspace(db: HardwareDB) -> None:
    # CublasHandlePool.cpp: sm90 4096 KiB x 8 = 32 MiB; before it 4096 KiB x 2 + 16 KiB x 8 = 8,519,680 B
    assert db.memory_overhead(db.gpu("h100-sxm")).cublas_workspace_bytes == 32 * 2**20
    assert db.memory_overhead(db.gpu("a100-sxm4-80gb")).cublas_workspace_bytes == 8_519_680
