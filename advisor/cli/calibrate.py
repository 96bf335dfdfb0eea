"""`advisor calibrate`: measure this machine's CPU or a local GPU with the micro-benchmark suite, store
the profile in the user's cache; `--show` prints the stored one, `--references` the shipped ones."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.calibration.cache import CacheError, check_writable, load_profile, os_reason, store_profile
from advisor.calibration.profile import CalibrationProfile, SeriesProfile
from advisor.calibration.quality import ProfileQuality, assess, gate, refusal_message
from advisor.present.format import duration, percent, si
from advisor.cli.arguments import examples
from advisor.cli.table import Column, render_table
from advisor.errors import UserError
from advisor.hardware.specs import HardwareDB

if TYPE_CHECKING:  # torch: imported only when something is measured (`advisor --help` stays light)
    from advisor.calibration.runner import Target
    from advisor.calibration.suite import Suite

INTERRUPTED = 130
"""Exit code after Ctrl-C, as shells report SIGINT."""


def device_argument(text: str) -> str:
    """"cpu", "cuda" (= cuda:0) or "cuda:N"."""
    if text == "cpu":
        return text
    if text == "cuda":
        return "cuda:0"
    if re.fullmatch(r"cuda:\d+", text):
        return text
    raise argparse.ArgumentTypeError(f"expected cpu or cuda:N, got {text!r}")


def add_parser(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        parents=parents,
        help="micro-benchmark this machine's CPU or GPU; the estimates of --local use the result",
        **examples(("advisor calibrate --quick", "this machine's CPU in under a minute"),
                   ("advisor calibrate --device cuda:0", "a local NVIDIA GPU"),
                   ("advisor calibrate --show", "what is stored, with its quality")),
        description="Time GEMMs, convolutions, memory bandwidth, elementwise and normalisation kernels and "
                    "per-op overhead on a local device, fit efficiency curves with scipy, and store the "
                    "profile in the user's cache (re-used until the machine or software changes).",
    )
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter timing (under 30 s on a CPU)")
    parser.add_argument("--device", type=device_argument, default="cpu", metavar="cpu|cuda:N",
                        help="what to calibrate (default: cpu)")
    parser.add_argument("--show", action="store_true", help="print the stored profile instead of measuring")
    parser.add_argument("--references", action="store_true",
                        help="list the shipped reference profiles of GPU families (measured or documented default)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


class ProgressBar:
    """A one-line bar on stderr, redrawn in place; silent when stderr is not a terminal."""

    WIDTH = 28

    def __init__(self, title: str) -> None:
        self.title = title
        self.enabled = sys.stderr.isatty()
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled:
            return
        filled = int(self.WIDTH * done / max(total, 1))
        elapsed = time.perf_counter() - self.started
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = f"\r{self.title} [{bar}] {done}/{total} {elapsed:5.1f}s  {label}"
        print(f"{line[:110]:<110}", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr, flush=True)


def run(args: argparse.Namespace, db: HardwareDB) -> int:
    if args.references:
        return _references(db, args.json)
    from advisor.calibration.runner import cpu_target, cuda_target
    from advisor.calibration.suite import load_suite

    suite = load_suite()
    target = cpu_target(suite) if args.device == "cpu" else cuda_target(int(args.device.split(":")[1]), db, suite)
    if args.show:
        return _show(target, args.json)
    return _measure(target, suite, args.quick, args.json)


def _show(target: Target, as_json: bool) -> int:
    cached = load_profile(target.device, target.fingerprint)
    if cached.profile is None:
        raise UserError(cached.why_unusable(target.device))
    quality = assess(cached.profile, target.kind, target.cache_bytes)
    if as_json:
        print(json.dumps({"path": str(cached.path), **cached.profile.to_dict(), "quality": quality.to_dict()},
                         indent=2))
    else:
        print(render_calibration(cached.profile, str(cached.path), quality))
    return 0


def _measure(target: Target, suite: Suite, quick: bool, as_json: bool) -> int:
    previous = load_profile(target.device, target.fingerprint)
    check_writable(target.device)  # a folder that cannot take the result fails now, not after minutes
    from advisor.calibration.runner import calibrate

    bar = ProgressBar(f"calibrating {target.device}{' (quick)' if quick else ''}")
    try:
        profile = calibrate(target, suite, quick, bar)
    except KeyboardInterrupt:
        bar.close()
        kept = "left unchanged" if previous.problem != "none stored" else "none was stored before"
        print(f"advisor: calibration interrupted; nothing was stored ({previous.path}: {kept})", file=sys.stderr)
        return INTERRUPTED
    bar.close()
    verdict = gate(profile, target.kind, target.cache_bytes)
    if verdict.profile is None:
        kept = (f"{previous.path} is left as it was" if previous.problem != "none stored"
                else "nothing was stored before")
        raise UserError(f"{refusal_message(verdict.quality, quick)} ({kept})")
    profile, quality = verdict.profile, verdict.quality
    for dropped in quality.dropped:
        print(f"advisor: note: dropped {dropped.key} ({'; '.join(dropped.failures)}): estimates fall back for it",
              file=sys.stderr)
    try:
        path = store_profile(profile)
    except OSError as exc:  # the folder was writable a moment ago (a disk filling up): show what was measured
        _print_profile(profile, None, as_json, quality)
        directory, reason = previous.path.parent, os_reason(exc)
        raise CacheError(directory, reason, f"the calibration above was measured but cannot be stored in "
                         f"{directory} ({reason}); free space there or set $GPU_ADVISOR_CACHE_DIR to a folder "
                         "that can be written") from None
    if previous.problem not in (None, "none stored"):
        print(f"advisor: note: replaced the cached profile, which was {previous.problem}", file=sys.stderr)
    print(f"advisor: stored {path}", file=sys.stderr)
    _print_profile(profile, path, as_json, quality)
    return 0


def _print_profile(profile: CalibrationProfile, path: Path | None, as_json: bool, quality: ProfileQuality) -> None:
    if as_json:
        print(json.dumps({"path": None if path is None else str(path), **profile.to_dict(),
                          "quality": quality.to_dict()}, indent=2))
    else:
        print(render_calibration(profile, None if path is None else str(path), quality))


def _rate(value: float, axis: str) -> str:
    return si(value, "FLOP/s" if axis == "flops" else "B/s")


def _fit_summary(series: SeriesProfile) -> str:
    curve = series.fit.curve
    if curve.kind == "saturating":
        packing = series.pack_bandwidth_bytes_per_s
        packs = "" if packing is None else f", packs {si(packing, 'B/s')}"
        return f"{percent(curve.param('e_max'), 0)} large, half at {duration(curve.param('tau_half_s'))}{packs}"
    return (f"{percent(curve.param('e_far'), 0)} beyond {si(curve.param('capacity_bytes'), 'B')}, "
            f"{percent(curve.param('e_near'), 0)} within")


def _busy(series: SeriesProfile) -> str:
    """CPUs other programs (and steal) took while the series was measured, and the attempts it took:
    "0.01", "0.02 x2" (measured twice, the figure of its least disturbed attempt); "-" when unknown."""
    contention = series.contention
    if contention is None or contention.busy_cores is None:
        return "-"
    tries = f" x{contention.attempts}" if contention.attempts > 1 else ""
    return f"{contention.busy_cores:.2f}{tries}"


def _verdict(quality: ProfileQuality | None, key: str) -> str:
    found = None if quality is None else next((s for s in quality.series if s.key == key), None)
    if found is None:
        return "-"
    if found.passed:
        return "pass"
    return ("FAIL " if found.essential else "drop ") + ", ".join(f.split(":")[0] for f in found.failures)


def render_calibration(profile: CalibrationProfile, path: str | None = None,
                       quality: ProfileQuality | None = None) -> str:
    """The profile as text: provenance, peaks, overheads, one row per series, and the quality gates'
    verdict per series and overall."""
    lines = [f"Calibration of {profile.device}: {profile.device_name}"]
    if profile.is_default:
        lines.append("DOCUMENTED DEFAULT, not measured: " + "; ".join(profile.notes))
    else:
        software = profile.software
        lines.append(f"measured {profile.created} ({profile.mode} run, {profile.duration_s} s), torch "
                     f"{software.get('torch')}" + (f", CUDA {software['cuda']}, driver {software['driver']}"
                                                   if software.get("cuda") and profile.device != "cpu" else ""))
    if path:
        lines.append(f"stored in {path}")
    peaks = ", ".join(f"{dtype} {si(value, 'FLOP/s')}" for dtype, value in profile.peaks.flops.items())
    lines.append(f"theoretical peak: {peaks or 'unknown'}")
    lines.extend(f"  {note}" for note in (profile.peaks.notes if not profile.is_default else ()))
    lines.append(f"sustained memory bandwidth (largest copy/scale/triad): "
                 f"{si(profile.sustained_bandwidth_bytes_per_s, 'B/s')}")
    overheads = ", ".join(f"{name} {duration(seconds)}" for name, seconds in profile.overheads_s.items())
    lines.append(f"per-op host overhead: {overheads}")
    rows = []
    for series in profile.series:
        best = series.best_rate()
        rows.append([
            series.op,
            series.dtype,
            str(len(series.measurements)),
            _rate(best, series.axis) if best else "-",
            percent(best / series.peak, 0) if best else "-",
            _fit_summary(series),
            percent(series.fit.rms_log_residual, 1) if series.fit.points else "-",
            str(len(series.skipped)) if series.skipped else "",
            percent(statistics.median(m.spread for m in series.measurements), 0) if series.measurements else "-",
            _busy(series),
            _verdict(quality, series.key),
        ])
    columns = [Column("op"), Column("dtype"), Column("points", True), Column("best achieved", True),
               Column("of peak", True), Column("fitted efficiency"), Column("rms err", True),
               Column("skipped", True), Column("spread", True), Column("busy", True), Column("quality")]
    lines += ["", render_table(columns, rows)]
    lines.append("")
    lines.append("compute ops: fractions of the dtype's peak FLOP/s (of intensity x sustained bandwidth where "
                 "that is lower); memory ops: of the " + ("peak" if profile.peaks.bandwidth_bytes_per_s else
                                                          "sustained") + " memory bandwidth")
    skipped = [f"  {s.key} {k.label}: {k.reason}" for s in profile.series for k in s.skipped]
    if skipped:
        lines += ["skipped:", *skipped]
    if quality is not None:
        lines.append(f"quality: {quality.summary()}")
        lines += [f"  {s.key}: {failure}{'' if s.essential else ' (dropped)'}" for s in quality.series
                  for failure in s.failures]
        lines += [f"  warning: {warning}" for warning in quality.warnings]
    failed = {s.key for s in quality.series if s.failures} if quality is not None else set()
    lines += [f"  {note}" for note in profile.notes  # series dropped when this profile was stored
              if note.startswith("dropped ") and note.split(" ", 2)[1] not in failed]
    return "\n".join(lines)


def _references(db: HardwareDB, as_json: bool) -> int:
    from advisor.calibration.reference import family_for, load_families

    families = load_families(db)
    covered: dict[str, list[str]] = {family.id: [] for family in families}
    for gpu in db.gpus:
        covered[family_for(gpu, families).id].append(gpu.id)
    if as_json:
        print(json.dumps([{
            "id": f.id, "name": f.name, "status": "measured" if f.measured else "default",
            "created": f.created, "applies_to": f.applies_to.to_dict(), "gpus": covered[f.id],
            "sources": list(f.sources), "assumed": list(f.assumed), "origin": f.origin,
        } for f in families], indent=2))
        return 0
    rows = [[f.id, "measured" if f.measured else "default", f.created, str(len(covered[f.id])),
             ", ".join(f.sources) or "-", f.name] for f in families]
    columns = [Column("id"), Column("status"), Column("date"), Column("GPUs", True), Column("sources"),
               Column("family")]
    print(render_table(columns, rows))
    print("\ndefault: documented published figures, no measurement (sources in hwdb/sources.yaml); "
          "measured: `advisor calibrate` on the real GPU")
    return 0

