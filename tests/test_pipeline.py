"""The input pipeline (issue #27): the supply model's arithmetic, the pipelines chosen, the measurement
on real DataLoaders, the stored mechanics, and the input-bound step in every interface."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from advisor.cli.main import main
from advisor.errors import UserError
from advisor.hardware.loader import load_hwdb
from advisor.hardware.specs import HardwareDB
from advisor.pipeline import machine
from advisor.pipeline.datasets import InMemory, JPEGFolder, TokenFile, pipeline_for
from advisor.pipeline.machine import LoaderMechanics
from advisor.pipeline.measure import SampleTiming, loader_throughput, measure_samples
from advisor.pipeline.links import host_link_rate
from advisor.pipeline.storage import StorageRate, block_for, storage_rate
from advisor.pipeline.supply import (Feed, Host, PipelineProfile, effective_workers, input_supply, storage_share,
                                     usable_workers)

MECHANICS = LoaderMechanics(batch_s=1e-3, byte_s=1e-9, contention=0.25, coherency=0.0, cpus=2,
                            measured_workers=(1, 2), stored=True, note="test")
LOCAL = Host("this machine", 2, True)


def profile(sample_s: float = 2e-3, collate_s: float = 0.5e-3, sample_bytes: float = 1e5) -> PipelineProfile:
    timing = SampleTiming(sample_s, collate_s, 10, sample_bytes, (sample_s,) * 5)
    return PipelineProfile("file", "test pipeline", timing, MECHANICS)


@pytest.fixture(scope="module")
def db() -> HardwareDB:
    return load_hwdb(include_user_layers=False)


def fixed_rate(samples_per_s: float) -> PipelineProfile:
    """A pipeline whose one worker on LOCAL delivers `samples_per_s` (no DataLoader costs, one CPU)."""
    mechanics = LoaderMechanics(0.0, 0.0, 0.0, 0.0, 1, (1,), True, "test")
    timing = SampleTiming(1 / samples_per_s, 0.0, 10, 0.0, (1 / samples_per_s,) * 5)
    return PipelineProfile("file", "fixed", timing, mechanics)


def test_one_worker_prepares_a_batch_in_its_samples_collation_and_transfer() -> None:
    # 10 x (2 + 0.5) ms + 1 ms per batch + 1 ns x 10 x 100 kB = 25 + 1 + 1 = 27 ms per batch of 10
    assert profile().batch_cycle_s(10) == pytest.approx(0.027)
    assert profile().throughput(1, LOCAL, 10) == pytest.approx(10 / 0.027)
    # no workers: the main process alone, 1 / 2.5 ms
    assert profile().throughput(0, LOCAL, 10) == pytest.approx(400)


def test_workers_side_by_side() -> None:
    # this machine: min(3, 2) / (1 + 0.25 x (2 - 1)) = 1.6 workers' worth, whatever the count beyond its CPUs
    assert effective_workers(2, LOCAL, MECHANICS) == pytest.approx(1.6)
    assert effective_workers(3, LOCAL, MECHANICS) == pytest.approx(1.6)
    assert MECHANICS.second_worker_yield == pytest.approx(0.6)
    # 12 vCPUs per GPU = 6 cores; 11 workers + the training process = 12 threads:
    # (6 + 0.25 x (12 - 6)) x 11 / 12 = 6.875
    cloud = Host("p4d", 12, False)
    assert effective_workers(11, cloud, MECHANICS) == pytest.approx(6.875)
    # 4 workers on 6 cores: 4; the training process keeps one vCPU: at most 11 run
    assert effective_workers(4, cloud, MECHANICS) == pytest.approx(4)
    assert effective_workers(20, cloud, MECHANICS) == pytest.approx(6.875)
    assert usable_workers(cloud) == 11 and usable_workers(LOCAL) == 2 and usable_workers(Host("x", 1, False)) == 1


def test_scaling_law_fitted_over_worker_counts() -> None:
    # worker counts measured: powers of two up to the CPUs (at most 8) and the CPU count itself
    assert machine.worker_counts(1) == (1,) and machine.worker_counts(2) == (1, 2)
    assert machine.worker_counts(6) == (1, 2, 4, 6) and machine.worker_counts(32) == (1, 2, 4, 8)
    # two counts: contention alone; 2 / (1 + a) = 1.6 -> a = 0.25
    assert machine.fit_scaling({1: 1.0, 2: 1.6}) == pytest.approx((0.25, 0.0), abs=1e-6)
    # four counts made from a = 0.05, b = 0.01: N / (1 + 0.05 (N - 1) + 0.01 N (N - 1)) -> both found
    made = {n: machine.usl(n, 0.05, 0.01) for n in (1, 2, 4, 8)}
    assert made[8] == pytest.approx(8 / (1 + 0.35 + 0.56))  # 4.19
    assert machine.fit_scaling(made) == pytest.approx((0.05, 0.01), abs=1e-4)
    # faster than linear (noise) is clipped to no contention; one count: nothing to fit
    assert machine.fit_scaling({1: 1.0, 2: 2.1})[0] == pytest.approx(0.0, abs=1e-9)
    assert machine.fit_scaling({1: 1.0}) == (0.0, 0.0)


def test_supply_against_demand() -> None:
    cloud = Host("p4d", 12, False)
    one = profile().throughput(1, cloud, 10)  # 370.4/s per worker alone
    supply = input_supply(profile(), cloud, 10, 10, gpu_step_s=0.01)  # 10 samples per 10 ms: 1,000/s
    # 2 workers 740.7/s, 3 workers 1,111/s: 3 keep up; 11 workers give 6.875 x 370.4 = 2,546/s
    assert supply.workers == 11 and supply.workers_needed == 3
    assert supply.supply_samples_per_s == pytest.approx(6.875 * one)
    assert not supply.limits and supply.stall_fraction == 0
    starved = input_supply(profile(), cloud, 10, 10, gpu_step_s=0.0025)  # 4,000/s
    # 2,546 of 4,000: the GPU waits 1 - 2546/4000 = 36.3% of the time; no worker count keeps up
    assert starved.limits and starved.workers_needed is None
    assert starved.stall_fraction == pytest.approx(1 - 6.875 * one / 4000)
    assert set(starved.to_dict()) >= {"supply_samples_per_s", "demand_samples_per_s", "workers_needed",
                                      "vcpus_per_gpu", "stall_fraction"}


def test_storage_limits_the_epochs_it_serves() -> None:
    # CPU side 1,000/s (a 10-sample batch in 10 ms), storage 500/s, a GPU step of 5 ms per 10 samples (2,000/s)
    feed = Feed(storage_samples_per_s=500.0, storage_share=0.25, read_bytes_per_sample=1e5)
    supply = input_supply(fixed_rate(1000.0), LOCAL, 10, 10, gpu_step_s=0.005, feed=feed)
    assert supply.cpu_samples_per_s == pytest.approx(1000.0) and supply.storage_limits
    # from storage (a quarter of the samples): 10 / 500 - 0.005 = 15 ms; from the page cache 10 / 1000 - 0.005 = 5 ms
    assert supply.wait_s == pytest.approx(0.25 * 0.015 + 0.75 * 0.005)  # 7.5 ms per step
    # 1 / (0.25 / 500 + 0.75 / 1000) = 800/s over the job; the GPU waits 7.5 / (5 + 7.5) = 60% of its steps
    assert supply.supply_samples_per_s == pytest.approx(800.0) and supply.stall_fraction == pytest.approx(0.6)
    # a storage faster than the CPU side changes nothing
    quick = input_supply(fixed_rate(1000.0), LOCAL, 10, 10, 0.005, feed=Feed(storage_samples_per_s=5000.0))
    assert not quick.storage_limits and quick.wait_s == pytest.approx(0.005)


def test_a_dataset_that_fits_in_memory_is_read_from_storage_once() -> None:
    # 1.28 M JPEGs of 110 KB = 141 GB; half of 1,152 GiB = 618 GB holds it: the first of 90 epochs reads storage
    assert storage_share(1_281_167, 90, 110e3, 1152 * 2**30) == pytest.approx(1 / 90)
    # on 128 GiB (64 GiB for the page cache) every epoch reads it; a job in steps or an unknown host: every sample
    assert storage_share(1_281_167, 90, 110e3, 128 * 2**30) == 1.0
    assert storage_share(None, None, 110e3, 1152 * 2**30) == 1.0 and storage_share(10, 5, 1e3, None) == 1.0
    # a single epoch, or less, reads everything once
    assert storage_share(1000, 1, 1e3, 2**30) == 1.0 and storage_share(1000, 0.5, 1e3, 2**30) == 1.0


def test_the_batch_crosses_the_slower_of_the_gpus_and_the_hosts_pcie(db: HardwareDB) -> None:
    a100 = db.gpu("a100-sxm4-80gb")
    # PCIe 4.0 x16, measured 25.9 GB/s: 154 MB (256 fp32 images of 3 x 224 x 224) in 154.1e6 / 25.9e9 = 5.95 ms
    assert host_link_rate(db, a100, None).copy_s(256 * 3 * 224 * 224 * 4) == pytest.approx(5.953e-3, rel=1e-3)
    # behind a Cascade Lake Xeon (PCIe 3.0 root ports, as on p4d): the 3.0 rate, 12.4 GB/s
    capped = host_link_rate(db, a100, 3)
    assert capped.host_to_device_bytes_per_s == 12.4e9 and "host CPU's generation" in capped.describe
    # an x8 card gets half the x16 rate: 25.9 / 2; Grace Hopper's chip-to-chip link: 346 GB/s
    assert host_link_rate(db, db.gpu("rtx-4060-ti-16gb"), 5).host_to_device_bytes_per_s == pytest.approx(12.95e9)
    assert host_link_rate(db, db.gpu("gh200"), None).host_to_device_bytes_per_s == 346e9
    # PCIe 6.0 (B200) has no measured rate: the fastest measured one, and it says so
    assert "no measured 6.0 link" in host_link_rate(db, db.gpu("b200"), None).describe


def test_storage_is_read_bypassing_the_page_cache_and_stored(tmp_path: Path) -> None:
    # a 110 KB JPEG is read as 27 blocks of 4 KiB; reads are at least a block, at most 4 MiB
    assert block_for(110_000) == 110_592 and block_for(10) == 4096 and block_for(1e9) == 4 * 2**20
    measured = storage_rate(tmp_path, 110_000, 2)
    assert measured.read_bytes_per_s > 0 and measured.block_bytes == 110_592 and measured.depth == 2
    assert len(measured.rounds) == 3 and not list(tmp_path.glob(".storage-test-*"))  # the test file is gone
    if measured.stored:
        again = storage_rate(tmp_path, 110_000, 2)
        assert again == measured
    assert measured.samples_per_s(110_000) == pytest.approx(measured.read_bytes_per_s / 110_000)


class _Reads(torch.utils.data.Dataset):
    """Each sample reads a 10,000-byte file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.frombuffer(bytearray(self.path.read_bytes()), dtype=torch.uint8)[:4].float()


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="the kernel counts read bytes on Linux only")
def test_the_bytes_a_dataset_reads_are_counted(tmp_path: Path) -> None:
    data = tmp_path / "sample.bin"
    data.write_bytes(bytes(10_000))
    timing = measure_samples(_Reads(data), 4)
    # 10,000 bytes per sample, and a little of the file system's own (the counter file itself, ~100 bytes)
    assert 10_000 <= timing.read_bytes < 11_000


def test_the_inputs_choose_the_built_in_pipeline(tmp_path: Path) -> None:
    images = pipeline_for(None, lambda b: torch.randn(b, 3, 32, 48), "m.py", tmp_path)
    assert images.kind == "images" and images.read_bytes_per_sample > 50_000  # JPEGs of about 110 KB
    sample, label = images.make()[0]
    assert isinstance(images.make(), JPEGFolder) and sample.shape == (3, 32, 48) and sample.dtype == torch.float32
    tokens = pipeline_for(None, lambda b: {"input_ids": torch.zeros(b, 64, dtype=torch.long)}, "m.py", tmp_path)
    assert tokens.kind == "tokens" and tokens.read_bytes_per_sample == 2 * 65  # 65 uint16 tokens
    x, y = tokens.make()[3]
    assert isinstance(tokens.make(), TokenFile) and x.shape == y.shape == (64,) and torch.equal(x[1:], y[:-1])
    other = pipeline_for(None, lambda b: (torch.randn(b, 7), torch.randn(b)), "m.py", tmp_path)
    assert other.kind == "tensors" and isinstance(other.make(), InMemory)
    assert other.make()[0][0].shape == (7,)


class _Slow(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.zeros(10)


def test_a_file_dataset_is_checked(tmp_path: Path) -> None:
    for made, message in ((lambda: [1, 2], "returned list, not a map-style"),
                          (lambda: torch.utils.data.TensorDataset(torch.zeros(0, 2)), "returned an empty dataset")):
        pipeline = pipeline_for(made, lambda b: torch.zeros(b), "m.py", tmp_path)
        with pytest.raises(UserError, match=message):
            pipeline.make()


def test_samples_are_timed_on_one_thread() -> None:
    threads = torch.get_num_threads()
    timing = measure_samples(_Slow(), batch=8)
    assert torch.get_num_threads() == threads
    assert 0.002 <= timing.sample_s < 0.05  # a 2 ms sleep each
    assert timing.sample_bytes == 40  # ten float32 zeros, collated
    assert len(timing.rounds_s) == 5 and timing.spread >= 0


def test_the_real_dataloader_is_counted() -> None:
    # one worker sleeping 2 ms per sample: at most 500 samples/s
    rate = loader_throughput(_Slow(), batch=4, workers=1, batches=5)
    assert 50 < rate <= 500


def test_mechanics_are_stored_for_this_machine_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    machine.store(tmp_path, MECHANICS)
    assert machine.load(tmp_path) == MECHANICS
    path = tmp_path / "loader-mechanics.json"
    document = json.loads(path.read_text())
    document["body"]["mechanics"]["contention"] = 0.1  # edited: the checksum no longer matches
    path.write_text(json.dumps(document))
    assert machine.load(tmp_path) is None
    machine.store(tmp_path, MECHANICS)
    monkeypatch.setattr(machine, "fingerprint", lambda: "another machine")
    assert machine.load(tmp_path) is None


SLOW_FILE = """
import time, torch
SAMPLE_UNIT = "rows"
def build_model():
    return torch.nn.Linear(64, 1)
def example_input(batch_size):
    return torch.randn(batch_size, 64)
class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, index):
        time.sleep(0.004)
        return torch.zeros(64)
def dataset():
    return Slow()
"""


def _estimate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict | None, str]:
    code = main(["estimate", *argv, "--json", "--plans", "never"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_an_input_bound_gpu_waits_for_its_batches(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPU_ADVISOR_INPUT_PIPELINE", "on")
    machine.store(tmp_path / "cache" / "pipeline", MECHANICS)  # no synthetic DataLoader runs in the test
    model = tmp_path / "slow.py"
    model.write_text(SLOW_FILE)
    code, document, err = _estimate_json(capsys, str(model), "--gpu", "h100-sxm", "--vcpus-per-gpu", "4",
                                         "--batch-size", "32")
    assert code == 0, err
    result = document["results"][0]
    feeding = result["input_pipeline"]
    # a 64 -> 1 linear layer on an H100 wants far more rows/s than 3 workers sleeping 4 ms a row give
    assert feeding["vcpus_per_gpu"] == 4 and feeding["workers"] == 3 and feeding["workers_needed"] is None
    assert result["bound"] == "input" and feeding["stall_fraction"] > 0.9
    assert result["throughput_samples_per_s"] == pytest.approx(feeding["supply_samples_per_s"])
    # the input part: the wait, 32 / supply - 32 / demand, and the batch's copy (32 x 64 fp32 + labels over PCIe 5.0)
    assert feeding["host_to_device_s"] > 0 and "PCIe 5.0 x16" in feeding["host_link"]
    assert feeding["wait_s"] == pytest.approx(32 / feeding["supply_samples_per_s"] - 32 / feeding["demand_samples_per_s"])
    assert result["time_breakdown_s"]["input"] == pytest.approx(feeding["wait_s"] + feeding["host_to_device_s"])
    assert document["input_pipeline"]["kind"] == "file"
    code, document, _ = _estimate_json(capsys, str(model), "--gpu", "h100-sxm", "--no-input-pipeline")
    assert document["results"][0]["input_pipeline"] is None and document["results"][0]["bound"] != "input"


def test_input_pipeline_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in ((["--workers", "0"], "--workers: must be at least 1"),
                          (["--vcpus-per-gpu", "0.5"], "vCPUs per GPU must be at least 1"),
                          (["--no-input-pipeline", "--workers", "3"], "drop --no-input-pipeline")):
        code = main(["estimate", "mlp", "--gpu", "t4", *argv])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_steady_pipeline_timing_is_stored_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from advisor.pipeline import profile as pipeline_profile
    from advisor.pipeline.stored import checksum
    from advisor.profile.model_file import load_model_file

    monkeypatch.setenv("GPU_ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    machine.store(tmp_path / "cache" / "pipeline", MECHANICS)
    model_path = tmp_path / "slow.py"
    model_path.write_text(SLOW_FILE)
    model = load_model_file(str(model_path))
    first = pipeline_profile.measure_pipeline(model)
    timings = list((tmp_path / "cache" / "pipeline" / "timings").glob("*.json"))
    assert len(timings) == 1 and first.timing.sample_s >= 0.004  # time.sleep(0.004) per sample
    pipeline_profile._MEASURED.clear()  # a new process: read from the cache, not measured again
    calls: list[int] = []
    monkeypatch.setattr(pipeline_profile, "measure_samples", lambda *args: calls.append(1) or first.timing)
    assert pipeline_profile.measure_pipeline(model).timing == first.timing and calls == []
    # older than a day (a model file's own dataset()): measured again
    document = json.loads(timings[0].read_text())
    document["body"]["measured_at"] -= 2 * 86_400
    document["checksum"] = checksum(document["body"])
    timings[0].write_text(json.dumps(document))
    pipeline_profile._MEASURED.clear()
    pipeline_profile.measure_pipeline(model)
    assert calls == [1]
    # edited without its checksum: measured again too
    document = json.loads(timings[0].read_text())
    document["body"]["timing"]["sample_s"] = 1e-9
    timings[0].write_text(json.dumps(document))
    pipeline_profile._MEASURED.clear()
    pipeline_profile.measure_pipeline(model)
    assert calls == [1, 1]


def test_an_instance_thread_runs_at_its_cpus_score_against_this_machines() -> None:
    from advisor.hardware.loader import load_hwdb
    from advisor.pipeline import hosts

    db = load_hwdb()
    # by name, the longest match wins; by CPUID family where a VM hides the name; else unknown
    cpu, by_name = hosts.identify(db, "Intel(R) Xeon(R) Platinum 8275CL CPU @ 3.00GHz", "GenuineIntel/6")
    assert cpu is not None and cpu.id == "xeon-8275cl" and by_name
    cpu, by_name = hosts.identify(db, "AMD EPYC", "AuthenticAMD/26")
    assert cpu is not None and cpu.id == "epyc-9b45" and not by_name
    assert hosts.identify(db, "Some CPU", None) == (None, False)
    # an unknown instance CPU: this machine's rate
    assert hosts.thread_speed(db, None)[0] == 1.0
    # p4d's 8275CL (2,167) on a host whose CPU is a 9B45 (3,466): 2167 / 3466 = 0.625 of its per-thread rate
    local = db.host_cpu("epyc-9b45")
    hosts._this_cpu_identity.cache_clear()
    try:
        import unittest.mock as mock
        with mock.patch.object(hosts, "_this_cpu_identity", return_value=("AMD EPYC 9B45", None)):
            speed, words = hosts.thread_speed(db, "xeon-8275cl")
    finally:
        hosts._this_cpu_identity.cache_clear()
    assert local is not None and speed == pytest.approx(2167 / 3466) and "0.63x" in words
    # the supply scales with it: 6.875 thread-equivalents x 0.625
    slow = Host("p4d", 12, False, thread_speed=speed)
    assert profile().throughput(11, slow, 10) == pytest.approx(profile().throughput(11, Host("p4d", 12, False), 10)
                                                               * 2167 / 3466)
