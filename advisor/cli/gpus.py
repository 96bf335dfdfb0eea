"""`advisor gpus`: the GPU database with peaks and prices, filtered and sorted."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from typing import Any

from advisor import units
from advisor.cli.arguments import bounded_float, examples
from advisor.limits import MAX_MEMORY_GB
from advisor.cli.table import Column, render_table
from advisor.hardware.specs import CloudOffer, HardwareDB
from advisor.present.gpu_rows import SORT_KEYS, GPURow, select_rows, sort_rows
from advisor.probe.local import LocalMachine, probe_local


def add_parser(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "gpus",
        parents=parents,
        help="list the GPU database with peaks and prices",
        **examples(("advisor gpus", "every GPU, largest memory first"),
                   ("advisor gpus --min-memory-gib 40 --sort price", "40 GiB or more, cheapest to rent first"),
                   ("advisor gpus --provider lambda --json", "one provider's offers, as JSON"),
                   ("advisor gpus --local", "also this machine's CPU and NVIDIA GPUs")),
        description="The GPU database: memory, bandwidth, peak throughput, cloud and purchase prices.",
    )
    parser.add_argument("--min-memory-gb", "--min-memory-gib", dest="min_memory_gb",
                        type=bounded_float(MAX_MEMORY_GB, allow_zero=True), metavar="X",
                        help="only GPUs with at least X GiB of memory (the figure the card is sold by: 80 for an "
                             "A100 80GB, which holds 80 GiB)")
    parser.add_argument("--provider", metavar="P", help="only GPUs rented by provider P, with P's prices")
    parser.add_argument("--sort", choices=sorted(SORT_KEYS), default="memory", help="sort key (default: memory)")
    parser.add_argument("--reverse", action="store_true", help="reverse the sort order")
    parser.add_argument("--local", action="store_true", help="also show this machine's CPU and NVIDIA GPUs")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def _fmt(value: float | None, scale: float, digits: int, marked: bool = False) -> str:
    if value is None:
        return "-"
    text = f"{value / scale:,.{digits}f}"
    return text + ("~" if marked else "")


def _price(offer: CloudOffer | None, spot: bool = False) -> str:
    if offer is None:
        return "-"
    price = offer.spot_usd_per_gpu_hour if spot else offer.usd_per_gpu_hour
    return f"{price:.2f} {offer.provider}"


def render_gpu_table(rows: list[GPURow], max_width: int | None = None) -> str:
    """The table; without the Name column when the full table is wider than `max_width`."""
    columns = [
        Column("ID"),
        Column("Name"),
        Column("Mem GiB", True),
        Column("BW GB/s", True),
        Column("FP32 TF", True),
        Column("BF16 TF", True),
        Column("FP16 TF", True),
        Column("Cloud $/GPU-h", True),
        Column("Spot $/GPU-h", True),
        Column("Buy $", True),
    ]
    body = []
    for row in rows:
        gpu, peaks = row.gpu, row.gpu.peaks
        body.append([
            gpu.id,
            gpu.name,
            _fmt(gpu.memory_bytes, units.GIB, 0, gpu.is_unverified("memory_gb")),
            _fmt(gpu.bandwidth_bytes_per_s, units.GB, 0, gpu.is_unverified("bandwidth_gbps")),
            _fmt(peaks.fp32, units.TERA, 1, gpu.is_unverified("peak_tflops.fp32")),
            _fmt(peaks.bf16_tensor, units.TERA, 1, gpu.is_unverified("peak_tflops.bf16_tensor")),
            _fmt(peaks.fp16_tensor, units.TERA, 1, gpu.is_unverified("peak_tflops.fp16_tensor")),
            _price(row.cheapest),
            _price(row.cheapest_spot, spot=True),
            _fmt(gpu.purchase_usd, 1, 0, gpu.is_unverified("launch_msrp_usd")),
        ])
    table = render_table(columns, body)
    if max_width is not None and max(len(line) for line in table.splitlines()) > max_width:
        del columns[1]
        table = render_table(columns, [row[:1] + row[2:] for row in body])
    return table


def render_local(machine: LocalMachine) -> str:
    cpu = machine.cpu
    clock = f"{cpu.clock_hz / 1e9:.2f} GHz" if cpu.clock_hz else "clock unknown"
    memory = f"{cpu.memory_total_bytes / units.GIB:.1f} GiB RAM" if cpu.memory_total_bytes else "RAM unknown"
    lines = [
        f"This machine ({machine.hostname}, {machine.os}, Python {machine.python}, torch {machine.torch or 'not installed'})",
        f"  local-cpu    {cpu.model}: {cpu.physical_cores} cores ({cpu.usable_cores} usable), {clock}, "
        f"{cpu.vector_width_bits}-bit vectors [{' '.join(cpu.vector_extensions) or 'none'}], {memory}",
    ]
    nvidia = machine.nvidia
    if not nvidia.gpus:
        lines.append(f"  no NVIDIA GPU: {nvidia.reason}")
    for gpu in nvidia.gpus:
        match = f"matches '{gpu.matched_id}'" if gpu.matched_id else "no database match"
        lines.append(
            f"  {gpu.local_id:<12} {gpu.name}: {gpu.memory_total_bytes / units.GIB:.1f} GiB "
            f"({gpu.memory_free_bytes / units.GIB:.1f} free), {match}"
        )
    if nvidia.available:
        lines.append(f"  driver {nvidia.driver_version}, CUDA {nvidia.cuda_driver_version}")
    return "\n".join(lines)


def run(args: argparse.Namespace, db: HardwareDB) -> int:
    rows = sort_rows(select_rows(db, args.min_memory_gb, args.provider), args.sort, args.reverse)
    machine = probe_local(db) if args.local else None
    if args.json:
        document: dict[str, Any] = {
            "gpus": [row.to_dict() for row in rows],
            "providers": db.providers() if args.provider is None else [args.provider],
            "electricity_usd_per_kwh": db.defaults.electricity_usd_per_kwh,
            "sources": [source.to_dict() for source in db.sources],
        }
        if machine is not None:
            document["local"] = machine.to_dict()
        print(json.dumps(document, indent=2))
        return 0
    if machine is not None:
        print(render_local(machine))
        print()
    if not rows:
        print("No GPU matches these filters.")
        return 0
    print(render_gpu_table(rows, shutil.get_terminal_size().columns if sys.stdout.isatty() else None))
    dates = sorted({offer.date.isoformat() for row in rows for offer in row.offers})
    print()
    print(f"{len(rows)} GPUs. Peaks are dense TFLOP/s; BF16/FP16 with fp32 accumulate (what autocast uses).")
    print("Cloud: cheapest on-demand price per GPU-hour and its provider"
          + (f", prices as of {dates[-1]}" if dates else "") + "; Buy: street price or launch MSRP.")
    print("~ marks a figure not yet verified against a source; `advisor gpus --json` lists sources per GPU.")
    return 0
