"""Load hwdb YAML directories into a validated, frozen HardwareDB.

Every YAML file below a directory is one document whose top-level keys say what it holds
(`gpus`, `offers`, `sources`, cost defaults). Directories are layered: the shipped database first,
then the user's config directory, then `GPU_ADVISOR_HWDB`, then `--hwdb DIR`. A later layer's entry
with an existing key replaces the earlier one (and the tool says so once); inside one layer a
repeated key is an error. Every problem is reported as one HwdbError naming file, entry and key.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import reprlib
import stat
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from advisor import pickled, units
from advisor.errors import UserError, did_you_mean, shorten
from advisor.hardware.specs import (
    PEAK_MODES,
    CloudOffer,
    CostDefaults,
    GPUSpec,
    HardwareDB,
    HostCPU,
    HostLink,
    Interconnect,
    MemoryOverhead,
    Override,
    PeakThroughput,
    Source,
)
from advisor.paths import shipped_dir

ENV_VAR = "GPU_ADVISOR_HWDB"

DOCUMENT_KEYS = {
    "schema_version",
    "gpus",
    "offers",
    "sources",
    "memory_overheads",
    "host_cpus",
    "host_links",
    "interconnects",
    "date",
    "electricity_usd_per_kwh",
    "electricity_source",
    "electricity_notes",
}

GPU_REQUIRED = ("id", "name", "vendor", "segment", "memory_gb", "bandwidth_gbps", "peak_tflops", "sources")
GPU_OPTIONAL = (
    "architecture",
    "chip",
    "compute_capability",
    "memory_type",
    "sm_count",
    "boost_clock_mhz",
    "sustained_clock_mhz",
    "l2_cache_mb",
    "tdp_w",
    "form_factor",
    "pcie_gen",
    "pcie_lanes",
    "nvlink_gbps",
    "nvlink",
    "host_link",
    "launch_date",
    "launch_msrp_usd",
    "street_price_usd",
    "street_price_date",
    "derived",
    "unverified",
    "aliases",
    "notes",
)
OFFER_REQUIRED = ("gpu", "provider", "instance", "gpus_per_instance", "usd_per_gpu_hour", "region", "source")
OFFER_OPTIONAL = ("spot_usd_per_gpu_hour", "gpu_only", "notes", "date", "vcpus", "host_memory_gb", "host_cpu",
                  "interconnect", "network")
SOURCE_REQUIRED = ("id", "grade", "title", "url")
OVERHEAD_REQUIRED = ("id", "cuda_context_mib", "cublas_workspace_mib", "sources")
OVERHEAD_OPTIONAL = ("notes",)
HOST_CPU_REQUIRED = ("id", "name", "microarchitecture", "single_thread_score", "sources")
HOST_CPU_OPTIONAL = ("match", "cpuid_family", "pcie_gen", "notes")
HOST_LINK_REQUIRED = ("id", "host_to_device_gbps", "sources")
HOST_LINK_OPTIONAL = ("pcie_gen", "lanes", "notes")
INTERCONNECT_REQUIRED = ("id", "name", "scope", "busbw_gbps_by_message_mib", "sources")
INTERCONNECT_OPTIONAL = ("half_bandwidth_mib", "communicator_mib", "nccl_channels", "notes")
INTERCONNECT_SCOPES = ("node", "network")
MIN_FITTED_POINTS = 2
"""Measured message sizes that fix an interconnect's curve without half_bandwidth_mib."""
CPUID_FAMILY = re.compile(r"^(GenuineIntel|AuthenticAMD)/[0-9]{1,3}$")

VENDORS = ("nvidia", "amd", "intel", "apple", "other")
SEGMENTS = ("geforce", "workstation", "datacenter", "laptop", "other")
FORM_FACTORS = ("pcie-card", "sxm", "oam", "superchip", "laptop", "integrated", "other")
GRADES = ("A", "B", "C", "D", "X")
ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]*$")

# Plausible ranges (low, high) of every number in the database: no real device falls outside them, so a
# figure outside is a typo or a unit mistake (TB/s written where GB/s is meant, MB where GB). A low of 0
# means any positive figure. The shipped database spans memory 8-192 GiB, bandwidth 288-8,000 GB/s and
# peaks 0.18-4,500 TFLOP/s; the ranges leave room for older, smaller and future parts.
LIMITS: dict[str, tuple[float, float]] = {
    "memory_gb": (0.5, 4096),
    "bandwidth_gbps": (10, 100_000),
    "peak_tflops": (0.001, 100_000),
    "sm_count": (0, 10_000),
    "boost_clock_mhz": (0, 10_000),
    "sustained_clock_mhz": (0, 10_000),
    "l2_cache_mb": (0, 4096),
    "tdp_w": (0, 5000),
    "nvlink_gbps": (0, 100_000),
    "pcie_gen": (0, 16),
    "pcie_lanes": (0, 64),
    "launch_msrp_usd": (0, 1_000_000),
    "street_price_usd": (0, 1_000_000),
    "usd_per_gpu_hour": (0, 1000),
    "gpus_per_instance": (0, 1024),
    "vcpus": (1, 4096),
    "host_memory_gb": (0.5, 65_536),
    "single_thread_score": (1, 1_000_000),
    "host_to_device_gbps": (0.1, 100_000),
    "lanes": (0, 64),
    "busbw_gbps": (0.01, 100_000),
    "message_mib": (0, 1_048_576),
    "half_bandwidth_mib": (0, 1_048_576),
    "cuda_context_mib": (0, 65_536),
    "communicator_mib": (0, 65_536),
    "nccl_channels": (1, 1024),
    "cublas_workspace_mib": (0, 65_536),
    "electricity_usd_per_kwh": (0, 10),
}

# What one file may cost to read. The shipped files are under 20 KB and a few thousand values each; a
# file above these bounds is a mistake or an attack (a 50 MB catalog, a YAML alias bomb whose few
# hundred bytes expand to billions of values, ten thousand nested brackets that crash libyaml).
MAX_FILE_BYTES = 4 * 2**20
MAX_VALUES = 1_000_000
"""Values in one file once its aliases (*name) are expanded, as the validation walks them."""
MAX_DEPTH = 32
"""Nesting levels in one file; the database needs 4 (file, list, entry, peak_tflops)."""
SHOWN_CHARS = 60
"""The most characters of a value an error message shows."""

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxset = 2, 4, 3, 4
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = SHOWN_CHARS


def shown(value: Any) -> str:
    """`value` as an error message shows it: its repr cut to SHOWN_CHARS (never the whole of a huge value)."""
    return shorten(_REPR.repr(value), SHOWN_CHARS)


def _is_plain(value: Any) -> bool:
    """Short printable text, which a message may show as it is."""
    return isinstance(value, str) and value.isprintable() and len(value) <= SHOWN_CHARS


def _text(value: Any) -> str:
    """A name as a message shows it: short printable text as it is, anything else as shown()."""
    return value if _is_plain(value) else shown(value)


@lru_cache(maxsize=1)
def _loader() -> type:
    """yaml's safe loader (libyaml's parser where installed; only plain data, no Python objects), with
    a value its tag cannot hold (a date that does not exist, `!!float abc`, an integer of 5,000 digits)
    reported as a YAML error at its line instead of a bare ValueError. Made on first use: a database read
    back from the cache (load_directories) does not import yaml."""
    import yaml

    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep=deep)
            except (ValueError, TypeError, OverflowError) as exc:
                what = shown(node.value) if isinstance(node, yaml.ScalarNode) else "this value"
                raise yaml.constructor.ConstructorError(None, None, f"cannot read {what} ({exc})",
                                                        node.start_mark) from None

    return Loader


class HwdbError(UserError):
    """A problem in a hardware-database file: which file, which entry, which key, what is wrong."""

    def __init__(self, path: str | Path, message: str, entry: str | None = None, key: str | None = None):
        where = str(path) if str(path).isprintable() else repr(str(path))
        if entry is not None:
            where += f": entry {entry}"
        if key is not None:
            key = _text(key)
            where += f", key '{key}'" if entry is not None else f": key '{key}'"
        super().__init__(f"{where}: {message}")


@dataclass
class _Layer:
    """The raw entries of one directory, before merging."""

    directory: Path
    gpus: list[tuple[Path, str, dict[str, Any]]]
    offers: list[tuple[Path, str, dict[str, Any]]]
    sources: list[tuple[Path, str, dict[str, Any]]]
    memory_overheads: list[tuple[Path, str, dict[str, Any]]]
    host_cpus: list[tuple[Path, str, dict[str, Any]]]
    host_links: list[tuple[Path, str, dict[str, Any]]]
    interconnects: list[tuple[Path, str, dict[str, Any]]]
    defaults: dict[str, tuple[Path, Any]]
    dates: dict[Path, dt.date]


def shipped_hwdb_dir() -> Path:
    """The database that ships with the tool: hwdb/ in a checkout, advisor/_data/hwdb when installed."""
    return shipped_dir("hwdb", "sources.yaml")


def user_config_hwdb_dir() -> Path:
    """The user's override directory: $XDG_CONFIG_HOME/gpu-advisor/hwdb (~/.config by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpu-advisor" / "hwdb"


def override_dirs(cli_dirs: Sequence[str | Path] = ()) -> list[Path]:
    """User layers in the order they apply: config dir (if present), $GPU_ADVISOR_HWDB, --hwdb."""
    layers: list[Path] = []
    config = user_config_hwdb_dir()
    if config.is_dir():
        layers.append(config)
    env_value = os.environ.get(ENV_VAR, "")
    for part in filter(None, env_value.split(os.pathsep)):
        path = Path(part).expanduser()
        if not path.is_dir():
            raise UserError(f"{ENV_VAR} names '{part}', which is not a directory")
        layers.append(path)
    for part in cli_dirs:
        path = Path(part).expanduser()
        if not path.is_dir():
            raise UserError(f"--hwdb '{part}' is not a directory")
        layers.append(path)
    return layers


def load_hwdb(cli_dirs: Sequence[str | Path] = (), include_user_layers: bool = True) -> HardwareDB:
    """The shipped database plus the user's layers, validated. Raises HwdbError on bad data."""
    dirs = [shipped_hwdb_dir()]
    if include_user_layers:
        dirs += override_dirs(cli_dirs)
    return load_directories(dirs)


def load_directories(directories: Sequence[Path]) -> HardwareDB:
    """Load and merge the given directories, first = lowest priority. The files are read (and checked as
    _read_bytes does) at every call; parsed, validated and merged only when they (or this package's code)
    changed since a run kept the result (advisor.pickled.loaded)."""
    files = [(Path(d), [(path, _read_bytes(path)) for path in _yaml_files(Path(d))]) for d in directories]
    sources = [(str(path), data) for _, read in files for path, data in read]
    return pickled.loaded("hwdb", sources, ("hardware",), HardwareDB, lambda: _merged_db(directories, files))


def _merged_db(directories: Sequence[Path], files: list[tuple[Path, list[tuple[Path, bytes]]]]) -> HardwareDB:
    layers = [_read_layer(directory, read) for directory, read in files]
    overrides: list[Override] = []
    sources = _merge(layers, "sources", "source", overrides)
    source_records = tuple(_build_source(path, label, raw) for path, label, raw in sources.values())
    source_ids = {s.id for s in source_records}
    host_links = _merge(layers, "host_links", "host link", overrides)
    link_records = tuple(_build_host_link(path, label, raw, source_ids) for path, label, raw in host_links.values())
    link_ids = {link.id for link in link_records}
    interconnects = _merge(layers, "interconnects", "interconnect", overrides)
    interconnect_records = tuple(_build_interconnect(path, label, raw, source_ids)
                                 for path, label, raw in interconnects.values())
    gpus = _merge(layers, "gpus", "GPU", overrides)
    gpu_records = tuple(_build_gpu(path, label, raw, source_ids, link_ids) for path, label, raw in gpus.values())
    gpu_ids = {g.id for g in gpu_records}
    host_cpus = _merge(layers, "host_cpus", "host CPU", overrides)
    cpu_records = tuple(_build_host_cpu(path, label, raw, source_ids) for path, label, raw in host_cpus.values())
    cpu_ids = {cpu.id for cpu in cpu_records}
    offers = _merge(layers, "offers", "cloud offer", overrides)
    dates = {path: date for layer in layers for path, date in layer.dates.items()}
    scopes = {i.id: i.scope for i in interconnect_records}
    offer_records = tuple(
        _build_offer(path, label, raw, gpu_ids, source_ids, dates.get(path), cpu_ids, scopes)
        for path, label, raw in offers.values()
    )
    defaults = _build_defaults(layers, source_ids)
    overheads = _merge(layers, "memory_overheads", "memory overhead", overrides)
    overhead_records = tuple(_build_overhead(path, label, raw, source_ids) for path, label, raw in overheads.values())
    return HardwareDB(
        gpus=gpu_records,
        offers=offer_records,
        sources=source_records,
        defaults=defaults,
        overrides=tuple(overrides),
        directories=tuple(str(d) for d in directories),
        memory_overheads=overhead_records,
        host_cpus=cpu_records,
        host_links=link_records,
        interconnects=interconnect_records,
    )


# ----------------------------------------------------------------------------- reading


def _read_layer(directory: Path, files: list[tuple[Path, bytes]]) -> _Layer:
    layer = _Layer(directory, [], [], [], [], [], [], [], {}, {})
    for path, data in files:
        _read_document(path, _decoded(path, data), layer)
    return layer


def _yaml_files(directory: Path) -> list[Path]:
    """Every *.yaml / *.yml below `directory`, sorted; a folder that cannot be listed is an error (it may
    hold entries), links to folders are not followed (as rglob does)."""

    def unreadable(exc: OSError) -> None:
        raise HwdbError(exc.filename or directory, f"folder cannot be read ({exc.strerror or exc})")

    found = []
    for folder, _, names in os.walk(directory, onerror=unreadable):
        found += [Path(folder) / name for name in names if name.endswith((".yaml", ".yml"))]
    return sorted(found)


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, refused before it is parsed when it is not a plain file, cannot be read or is
    larger than MAX_FILE_BYTES."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block, a device never end
            raise HwdbError(path, "is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise HwdbError(path, f"is {info.st_size / 2**20:,.1f} MiB, above the limit of "
                                  f"{MAX_FILE_BYTES / 2**20:g} MiB for one hardware-database file")
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise HwdbError(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:  # it grew after stat()
        raise HwdbError(path, f"is above the limit of {MAX_FILE_BYTES / 2**20:g} MiB for one hardware-database file")
    return data


def _decoded(path: Path, data: bytes) -> str:
    """The file's text; refused when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise HwdbError(path, f"line {line}: byte 0x{data[exc.start]:02x} is not UTF-8; save the file as UTF-8 "
                              "text") from None


def _check_structure(path: Path, text: str) -> None:
    """Walk the YAML events (libyaml parses without recursion) before anything is built: refuse nesting
    deeper than MAX_DEPTH (libyaml's composer recurses and crashes on ten thousand levels), an alias
    inside the value it names, and more than MAX_VALUES values with the aliases expanded (an alias
    bomb). Linear in the file's size: each anchor's expanded size is recorded once."""
    import yaml

    try:
        _walk_events(path, text)
    except yaml.MarkedYAMLError as exc:  # PyYAML 6.0.4 and later refuse deep flow nesting while scanning
        if exc.problem is None or "nesting depth" not in exc.problem or exc.problem_mark is None:
            raise
        raise HwdbError(path, _too_deep(exc.problem_mark.line)) from None


def _too_deep(line_index: int) -> str:
    return f"line {line_index + 1}: values nested more than {MAX_DEPTH} levels deep; the database needs 4"


def _walk_events(path: Path, text: str) -> None:
    import yaml

    sizes: dict[str, int] = {}
    open_nodes: list[tuple[str | None, int]] = []
    total = 0
    for event in yaml.parse(text, Loader=_loader()):
        if isinstance(event, yaml.AliasEvent):
            size = sizes.get(event.anchor)
            if size is None:
                if any(anchor == event.anchor for anchor, _ in open_nodes):
                    raise HwdbError(path, f"line {event.start_mark.line + 1}: alias *{_text(event.anchor)} is "
                                          "inside the value it names (a value cannot contain itself)")
                continue  # an undefined alias: yaml's composer says so with its line
            total += size
        elif isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            total += 1
            open_nodes.append((event.anchor, total))
            if len(open_nodes) > MAX_DEPTH:
                raise HwdbError(path, _too_deep(event.start_mark.line))
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, start = open_nodes.pop()
            if anchor is not None:
                sizes[anchor] = total - start + 1
        if total > MAX_VALUES:
            raise HwdbError(path, f"holds more than {MAX_VALUES:,} values once its aliases (*name) are expanded; "
                                  "a hardware-database file needs a few thousand")


def _load_yaml(path: Path, text: str) -> Any:
    """The document in `path` (its `text`), built only after it passed _read_bytes, _decoded and
    _check_structure."""
    import yaml

    try:
        _check_structure(path, text)
        return yaml.load(text, Loader=_loader())  # noqa: S506 (a safe loader)
    except yaml.YAMLError as exc:
        raise HwdbError(path, f"not valid YAML{_yaml_problem(exc)}") from None


def _yaml_problem(exc: Any) -> str:
    """' at line L, column C: what yaml says' (`exc`: a yaml.YAMLError), cut to a readable length."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    else:
        what, where = _one_line(exc), ""
    what = shorten(" ".join(what.split()), 2 * SHOWN_CHARS)
    return f"{where}: {what}" if what else where


def _read_document(path: Path, text: str, layer: _Layer) -> None:
    document = _load_yaml(path, text)
    if document is None:
        return
    if not isinstance(document, dict):
        raise HwdbError(path, "the top level must be a mapping (gpus:, offers:, sources: ...)")
    for key in document:
        if key not in DOCUMENT_KEYS:
            raise HwdbError(path, f"unknown top-level key{_suggest(key, DOCUMENT_KEYS)}", key=str(key))
    if "date" in document:
        layer.dates[path] = _as_date(path, None, "date", document["date"])
    kinds = (("gpus", layer.gpus), ("offers", layer.offers), ("sources", layer.sources),
             ("memory_overheads", layer.memory_overheads), ("host_cpus", layer.host_cpus),
             ("host_links", layer.host_links), ("interconnects", layer.interconnects))
    for kind, bucket in kinds:
        entries = document.get(kind)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise HwdbError(path, "must be a list of entries", key=kind)
        for index, raw in enumerate(entries, start=1):
            label = _entry_label(kind, index, raw)
            if not isinstance(raw, dict):
                raise HwdbError(path, "must be a mapping of keys to values", entry=label)
            bucket.append((path, label, raw))
    for key in ("electricity_usd_per_kwh", "electricity_source", "electricity_notes"):
        if key in document:
            layer.defaults[key] = (path, document[key])


def _entry_label(kind: str, index: int, raw: Any) -> str:
    if isinstance(raw, dict):
        if kind == "offers" and {"gpu", "provider", "instance"} <= raw.keys():
            return f"#{index} ({_text(raw['provider'])} {_text(raw['instance'])} {_text(raw['gpu'])})"
        if "id" in raw:
            return f"'{raw['id']}'" if _is_plain(raw["id"]) else shown(raw["id"])
    return f"#{index}"


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _suggest(word: Any, candidates: Iterable[str]) -> str:
    """did_you_mean() for a key of any type and length (a long key is cut before it is compared)."""
    return did_you_mean(str(word)[: 2 * SHOWN_CHARS], candidates)


# ----------------------------------------------------------------------------- merging


def _entry_key(kind: str, raw: dict[str, Any]) -> str:
    if kind == "offers":
        return f"{raw.get('provider')}/{raw.get('instance')}/{raw.get('gpu')}"
    return str(raw.get("id"))


def _merge(
    layers: Sequence[_Layer], kind: str, noun: str, overrides: list[Override]
) -> dict[str, tuple[Path, str, dict[str, Any]]]:
    """Entries by key; a later layer replaces an earlier one, a repeat inside a layer is an error."""
    merged: dict[str, tuple[Path, str, dict[str, Any]]] = {}
    for layer in layers:
        seen: dict[str, Path] = {}
        for path, label, raw in getattr(layer, kind):
            key = _entry_key(kind, raw)
            if key in seen:
                field = "id" if kind != "offers" else "instance"
                raise HwdbError(path, f"duplicate {noun} (also defined in {seen[key]})", entry=label, key=field)
            seen[key] = path
            if key in merged:
                overrides.append(Override(noun, key, str(merged[key][0]), str(path)))
            merged[key] = (path, label, raw)
    return merged


# ----------------------------------------------------------------------------- building


def _check_keys(path: Path, label: str, raw: dict[str, Any], required: Iterable[str], optional: Iterable[str]) -> None:
    allowed = set(required) | set(optional)
    for key in raw:
        if key not in allowed:
            raise HwdbError(path, f"unknown key{_suggest(key, allowed)}", entry=label, key=str(key))
    for key in required:
        if raw.get(key) is None:
            raise HwdbError(path, "is required", entry=label, key=key)


def _as_str(path: Path, label: str | None, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise HwdbError(path, f"must be a non-empty string, got {shown(value)}", entry=label, key=key)
    return value


def _as_url(path: Path, label: str | None, key: str, value: Any) -> str:
    """An http(s) address, or "" where the source is not on the web: never javascript:, data: or file:,
    which the report would turn into a live link."""
    if not isinstance(value, str):
        raise HwdbError(path, f"must be a string, got {shown(value)}", entry=label, key=key)
    if value == "":
        return value
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError:
        parts = None
    if (parts is None or parts.scheme.lower() not in ("http", "https") or not parts.netloc
            or any(c.isspace() or not c.isprintable() for c in value)):
        raise HwdbError(path, f"must be an http:// or https:// address (or empty), got {shown(value)}",
                        entry=label, key=key)
    return value


def _as_number(path: Path, label: str | None, key: str, value: Any, limit_key: str | None = None) -> float:
    """A positive number inside LIMITS[limit_key or key] (every numeric key has its range there)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HwdbError(path, f"must be a number, got {shown(value)}", entry=label, key=key)
    if not value > 0:  # nan too
        raise HwdbError(path, f"must be positive, got {shown(value)}", entry=label, key=key)
    low, high = LIMITS[limit_key or key]
    if not low <= value <= high:  # inf too; checked before float(), which overflows on huge integers
        allowed = f"{low:,g} to {high:,g}" if low else f"up to {high:,g}"
        raise HwdbError(path, f"{shown(value)} is not plausible (allowed {allowed}); check the unit",
                        entry=label, key=key)
    return float(value)


def _as_int(path: Path, label: str, key: str, value: Any) -> int:
    number = _as_number(path, label, key, value)
    if number != int(number):
        raise HwdbError(path, f"must be a whole number, got {shown(value)}", entry=label, key=key)
    return int(number)


def _as_date(path: Path, label: str | None, key: str, value: Any) -> dt.date:
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise HwdbError(path, f"must be a date YYYY-MM-DD, got {shown(value)}", entry=label, key=key)


def _as_choice(path: Path, label: str, key: str, value: Any, choices: Sequence[str]) -> str:
    text = _as_str(path, label, key, value)
    if text not in choices:
        raise HwdbError(path, f"{shown(text)} is not one of {', '.join(choices)}", entry=label, key=key)
    return text


def _optional(raw: dict[str, Any], key: str, convert: Callable[[Any], Any]) -> Any:
    value = raw.get(key)
    return None if value is None else convert(value)


def _build_source(path: Path, label: str, raw: dict[str, Any]) -> Source:
    _check_keys(path, label, raw, SOURCE_REQUIRED, ())
    source_id = _as_str(path, label, "id", raw["id"])
    grade = _as_choice(path, label, "grade", raw["grade"], GRADES)
    url = _as_url(path, label, "url", raw["url"])
    return Source(source_id, grade, _as_str(path, label, "title", raw["title"]), url)


def _check_sources(path: Path, label: str, raw: dict[str, Any], source_ids: set[str]) -> tuple[str, ...]:
    sources = raw["sources"]
    if not isinstance(sources, list) or not sources:
        raise HwdbError(path, "must be a non-empty list of source ids", entry=label, key="sources")
    for source_id in sources:
        if not isinstance(source_id, str):
            raise HwdbError(path, f"must be a list of source ids, got {shown(source_id)} in it", entry=label,
                            key="sources")
        if source_id not in source_ids:
            hint = _suggest(source_id, source_ids)
            raise HwdbError(path, f"unknown source {shown(source_id)}{hint}", entry=label, key="sources")
    return tuple(str(s) for s in sources)


def _build_overhead(path: Path, label: str, raw: dict[str, Any], source_ids: set[str]) -> MemoryOverhead:
    _check_keys(path, label, raw, OVERHEAD_REQUIRED, OVERHEAD_OPTIONAL)
    return MemoryOverhead(
        architecture=_as_str(path, label, "id", raw["id"]),
        cuda_context_bytes=int(_as_number(path, label, "cuda_context_mib", raw["cuda_context_mib"]) * units.MIB),
        cublas_workspace_bytes=int(
            _as_number(path, label, "cublas_workspace_mib", raw["cublas_workspace_mib"]) * units.MIB),
        sources=_check_sources(path, label, raw, source_ids),
        notes=_optional(raw, "notes", lambda v: _as_str(path, label, "notes", v)),
    )


def _entry_id(path: Path, label: str, raw: dict[str, Any]) -> str:
    """The entry's `id`: lowercase letters, digits and dashes."""
    entry_id = _as_str(path, label, "id", raw["id"])
    if not ID_PATTERN.match(entry_id):
        raise HwdbError(path, "must be lowercase letters, digits and dashes", entry=label, key="id")
    return entry_id


def _build_host_cpu(path: Path, label: str, raw: dict[str, Any], source_ids: set[str]) -> HostCPU:
    _check_keys(path, label, raw, HOST_CPU_REQUIRED, HOST_CPU_OPTIONAL)
    cpu_id = _entry_id(path, label, raw)
    match = raw.get("match", [])
    if not isinstance(match, list) or not all(isinstance(m, str) and m.strip() for m in match):
        raise HwdbError(path, f"must be a list of model-name substrings, got {shown(match)}", entry=label, key="match")
    family = _optional(raw, "cpuid_family", lambda v: _as_str(path, label, "cpuid_family", v))
    if family is not None and not CPUID_FAMILY.match(family):
        raise HwdbError(path, f"must be vendor/family such as AuthenticAMD/26, got {shown(family)}", entry=label,
                        key="cpuid_family")
    return HostCPU(
        id=cpu_id,
        name=_as_str(path, label, "name", raw["name"]),
        microarchitecture=_as_str(path, label, "microarchitecture", raw["microarchitecture"]),
        single_thread_score=_as_number(path, label, "single_thread_score", raw["single_thread_score"]),
        sources=_check_sources(path, label, raw, source_ids),
        match=tuple(match),
        cpuid_family=family,
        pcie_gen=_optional(raw, "pcie_gen", lambda v: _as_int(path, label, "pcie_gen", v)),
        notes=_optional(raw, "notes", lambda v: _as_str(path, label, "notes", v)),
    )


def _build_interconnect(path: Path, label: str, raw: dict[str, Any], source_ids: set[str]) -> Interconnect:
    _check_keys(path, label, raw, INTERCONNECT_REQUIRED, INTERCONNECT_OPTIONAL)
    link_id = _entry_id(path, label, raw)
    key = "busbw_gbps_by_message_mib"
    measured = raw[key]
    if not isinstance(measured, dict) or not measured:
        raise HwdbError(path, "must map message sizes in MiB to bus bandwidths in GB/s, e.g. {64: 202}",
                        entry=label, key=key)
    points = tuple(sorted((_as_number(path, label, key, size, "message_mib") * units.MIB,
                           _as_number(path, label, key, busbw, "busbw_gbps") * units.GB)
                          for size, busbw in measured.items()))
    half = _optional(raw, "half_bandwidth_mib",
                     lambda v: _as_number(path, label, "half_bandwidth_mib", v) * units.MIB)
    if half is None and len(points) < MIN_FITTED_POINTS:
        raise HwdbError(path, f"{len(points)} measured sizes cannot fix the curve's shape: give "
                        f"half_bandwidth_mib or at least {MIN_FITTED_POINTS} sizes", entry=label, key=key)
    return Interconnect(
        id=link_id,
        name=_as_str(path, label, "name", raw["name"]),
        scope=_as_choice(path, label, "scope", raw["scope"], INTERCONNECT_SCOPES),
        busbw_points=points,
        half_bandwidth_bytes=half,
        communicator_bytes=_optional(raw, "communicator_mib",
                                     lambda v: int(_as_number(path, label, "communicator_mib", v) * units.MIB)),
        nccl_channels=_optional(raw, "nccl_channels", lambda v: _positive_int(path, label, "nccl_channels", v)),
        sources=_check_sources(path, label, raw, source_ids),
        notes=_optional(raw, "notes", lambda v: _as_str(path, label, "notes", v)),
    )


def _positive_int(path: Path, label: str, key: str, value: Any) -> int:
    """`value` as a whole number of at least 1, or an HwdbError naming the file, entry and key."""
    number = _as_number(path, label, key, value)
    if number < 1 or number != int(number):
        raise HwdbError(path, f"must be a whole number of at least 1, got {value!r}", entry=label, key=key)
    return int(number)


def _build_host_link(path: Path, label: str, raw: dict[str, Any], source_ids: set[str]) -> HostLink:
    _check_keys(path, label, raw, HOST_LINK_REQUIRED, HOST_LINK_OPTIONAL)
    link_id = _entry_id(path, label, raw)
    if (raw.get("pcie_gen") is None) != (raw.get("lanes") is None):
        raise HwdbError(path, "a PCIe link gives both pcie_gen and lanes, another link neither", entry=label,
                        key="lanes")
    return HostLink(
        id=link_id,
        pcie_gen=_optional(raw, "pcie_gen", lambda v: _as_int(path, label, "pcie_gen", v)),
        lanes=_optional(raw, "lanes", lambda v: _as_int(path, label, "lanes", v)),
        host_to_device_bytes_per_s=_as_number(path, label, "host_to_device_gbps", raw["host_to_device_gbps"])
        * units.GB,
        sources=_check_sources(path, label, raw, source_ids),
        notes=_optional(raw, "notes", lambda v: _as_str(path, label, "notes", v)),
    )


def _build_peaks(path: Path, label: str, raw: Any) -> PeakThroughput:
    if not isinstance(raw, dict) or not raw:
        raise HwdbError(path, "must map math modes to TFLOP/s, e.g. {fp32: 35.6}", entry=label, key="peak_tflops")
    values: dict[str, float] = {}
    for mode, tflops in raw.items():
        if mode not in PEAK_MODES:
            hint = _suggest(mode, PEAK_MODES)
            raise HwdbError(path, f"unknown math mode{hint}", entry=label, key=f"peak_tflops.{_text(mode)}")
        if tflops is None:
            continue
        values[mode] = _as_number(path, label, f"peak_tflops.{mode}", tflops, "peak_tflops") * units.TERA
    if not values:
        raise HwdbError(path, "needs at least one figure", entry=label, key="peak_tflops")
    return PeakThroughput(**values)


def _figure_names(raw: dict[str, Any]) -> set[str]:
    names = {key for key, value in raw.items() if value is not None}
    peaks = raw.get("peak_tflops")
    if isinstance(peaks, dict):  # anything else is reported by _build_peaks
        names |= {f"peak_tflops.{mode}" for mode, value in peaks.items() if value is not None}
    return names


def _build_gpu(path: Path, label: str, raw: dict[str, Any], source_ids: set[str], link_ids: set[str]) -> GPUSpec:
    _check_keys(path, label, raw, GPU_REQUIRED, GPU_OPTIONAL)
    gpu_id = _as_str(path, label, "id", raw["id"])
    if not ID_PATTERN.match(gpu_id):
        raise HwdbError(path, "ids use lowercase letters, digits and '-' (e.g. rtx-3090)", entry=label, key="id")
    sources = _check_sources(path, label, raw, source_ids)
    figures = _figure_names(raw)
    derived = raw.get("derived") or {}
    if not isinstance(derived, dict):
        raise HwdbError(path, "must map figure names to how they were derived", entry=label, key="derived")
    for figure, how in derived.items():
        if figure not in figures:
            raise HwdbError(path, f"names {shown(figure)}, which this entry does not have", entry=label,
                            key="derived")
        _as_str(path, label, f"derived.{figure}", how)
    unverified = raw.get("unverified") or []
    if not isinstance(unverified, list):
        raise HwdbError(path, "must be a list of figure names", entry=label, key="unverified")
    for figure in unverified:
        if not isinstance(figure, str) or figure not in figures:
            raise HwdbError(path, f"names {shown(figure)}, which this entry does not have", entry=label,
                            key="unverified")
    if unverified and "X" not in sources:
        raise HwdbError(path, "unverified figures need source X in 'sources'", entry=label, key="unverified")
    aliases = raw.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise HwdbError(path, "must be a list of names", entry=label, key="aliases")
    capability = raw.get("compute_capability")
    if capability is not None and not (isinstance(capability, (str, float))
                                       and re.fullmatch(r"\d{1,3}\.\d{1,3}", str(capability))):
        raise HwdbError(path, f"must look like '8.6', got {shown(capability)}", entry=label, key="compute_capability")
    has_nvlink = raw.get("nvlink")
    if has_nvlink is not None and not isinstance(has_nvlink, bool):
        raise HwdbError(path, f"must be true or false, got {shown(has_nvlink)}", entry=label, key="nvlink")
    nvlink_gbps = _optional(raw, "nvlink_gbps", lambda v: _as_number(path, label, "nvlink_gbps", v))
    if has_nvlink is False and nvlink_gbps is not None:
        raise HwdbError(path, "nvlink is false but nvlink_gbps is given", entry=label, key="nvlink_gbps")
    host_link = _optional(raw, "host_link", lambda v: _as_str(path, label, "host_link", v))
    if host_link is not None and host_link not in link_ids:
        raise HwdbError(path, f"unknown host link {shown(host_link)}{_suggest(host_link, link_ids)}", entry=label,
                        key="host_link")
    return GPUSpec(
        id=gpu_id,
        name=_as_str(path, label, "name", raw["name"]),
        vendor=_as_choice(path, label, "vendor", raw["vendor"], VENDORS),
        segment=_as_choice(path, label, "segment", raw["segment"], SEGMENTS),
        architecture=_optional(raw, "architecture", lambda v: _as_str(path, label, "architecture", v)),
        chip=_optional(raw, "chip", lambda v: _as_str(path, label, "chip", v)),
        compute_capability=None if capability is None else str(capability),
        memory_bytes=int(_as_number(path, label, "memory_gb", raw["memory_gb"]) * units.GIB),
        memory_type=_optional(raw, "memory_type", lambda v: _as_str(path, label, "memory_type", v)),
        bandwidth_bytes_per_s=_as_number(path, label, "bandwidth_gbps", raw["bandwidth_gbps"]) * units.GB,
        sm_count=_optional(raw, "sm_count", lambda v: _as_int(path, label, "sm_count", v)),
        boost_clock_hz=_optional(
            raw, "boost_clock_mhz", lambda v: _as_number(path, label, "boost_clock_mhz", v) * units.MHZ
        ),
        sustained_clock_hz=_sustained_clock(path, label, raw),
        l2_cache_bytes=_optional(
            raw, "l2_cache_mb", lambda v: int(_as_number(path, label, "l2_cache_mb", v) * units.MB_CACHE)
        ),
        tdp_watts=_optional(raw, "tdp_w", lambda v: _as_number(path, label, "tdp_w", v)),
        form_factor=_optional(raw, "form_factor", lambda v: _as_choice(path, label, "form_factor", v, FORM_FACTORS)),
        pcie_gen=_optional(raw, "pcie_gen", lambda v: _as_int(path, label, "pcie_gen", v)),
        pcie_lanes=_optional(raw, "pcie_lanes", lambda v: _as_int(path, label, "pcie_lanes", v)),
        nvlink_bytes_per_s=None if nvlink_gbps is None else nvlink_gbps * units.GB,
        has_nvlink=True if nvlink_gbps is not None else has_nvlink,
        launch_date=_optional(raw, "launch_date", lambda v: _as_date(path, label, "launch_date", v)),
        launch_msrp_usd=_optional(raw, "launch_msrp_usd", lambda v: _as_number(path, label, "launch_msrp_usd", v)),
        street_price_usd=_optional(raw, "street_price_usd", lambda v: _as_number(path, label, "street_price_usd", v)),
        street_price_date=_street_price_date(path, label, raw),
        peaks=_build_peaks(path, label, raw["peak_tflops"]),
        sources=sources,
        derived=tuple((str(k), str(v)) for k, v in derived.items()),
        unverified=tuple(str(f) for f in unverified),
        aliases=tuple(aliases),
        notes=_optional(raw, "notes", lambda v: _as_str(path, label, "notes", v)),
        origin=str(path),
        host_link=host_link,
    )


def _sustained_clock(path: Path, label: str, raw: dict[str, Any]) -> float | None:
    """The SM clock measured under load (Hz), which only makes sense beside the boost clock the peaks assume."""
    clock = _optional(raw, "sustained_clock_mhz", lambda v: _as_number(path, label, "sustained_clock_mhz", v))
    if clock is not None and raw.get("boost_clock_mhz") is None:
        raise HwdbError(path, "a sustained clock needs the boost clock its peaks assume", entry=label,
                        key="boost_clock_mhz")
    return None if clock is None else clock * units.MHZ


def _street_price_date(path: Path, label: str, raw: dict[str, Any]) -> dt.date | None:
    has_price = raw.get("street_price_usd") is not None
    date = _optional(raw, "street_price_date", lambda v: _as_date(path, label, "street_price_date", v))
    if has_price and date is None:
        raise HwdbError(path, "a street price needs the date it was seen", entry=label, key="street_price_date")
    return date


def _build_offer(
    path: Path,
    label: str,
    raw: dict[str, Any],
    gpu_ids: set[str],
    source_ids: set[str],
    file_date: dt.date | None,
    cpu_ids: set[str],
    interconnect_scopes: dict[str, str],
) -> CloudOffer:
    _check_keys(path, label, raw, OFFER_REQUIRED, OFFER_OPTIONAL)
    gpu_id = _as_str(path, label, "gpu", raw["gpu"])
    if gpu_id not in gpu_ids:
        raise HwdbError(path, f"unknown GPU id {shown(gpu_id)}{_suggest(gpu_id, gpu_ids)}", entry=label, key="gpu")
    source = _as_str(path, label, "source", raw["source"])
    if source not in source_ids:
        raise HwdbError(path, f"unknown source {shown(source)}{_suggest(source, source_ids)}", entry=label,
                        key="source")
    price = _as_number(path, label, "usd_per_gpu_hour", raw["usd_per_gpu_hour"])
    spot = _optional(
        raw, "spot_usd_per_gpu_hour", lambda v: _as_number(path, label, "spot_usd_per_gpu_hour", v, "usd_per_gpu_hour")
    )
    if spot is not None and spot > price:
        raise HwdbError(
            path, f"spot price {spot} is above the on-demand price {price}", entry=label, key="spot_usd_per_gpu_hour"
        )
    date = _optional(raw, "date", lambda v: _as_date(path, label, "date", v)) or file_date
    if date is None:
        raise HwdbError(path, "needs a date (on the offer or at the top of the file)", entry=label, key="date")
    host_cpu = _optional(raw, "host_cpu", lambda v: _as_str(path, label, "host_cpu", v))
    if host_cpu is not None and host_cpu not in cpu_ids:
        raise HwdbError(path, f"unknown host CPU {shown(host_cpu)}{_suggest(host_cpu, cpu_ids)}", entry=label,
                        key="host_cpu")
    links = {key: _offer_link(path, label, raw, key, scope, interconnect_scopes)
             for key, scope in (("interconnect", "node"), ("network", "network"))}
    gpu_only = raw.get("gpu_only", False)
    if not isinstance(gpu_only, bool):
        raise HwdbError(path, f"must be true or false, got {shown(gpu_only)}", entry=label, key="gpu_only")
    return CloudOffer(
        gpu_id=gpu_id,
        provider=_as_str(path, label, "provider", raw["provider"]).lower(),
        instance=_as_str(path, label, "instance", raw["instance"]),
        gpus_per_instance=_as_int(path, label, "gpus_per_instance", raw["gpus_per_instance"]),
        usd_per_gpu_hour=price,
        spot_usd_per_gpu_hour=spot,
        region=_as_str(path, label, "region", raw["region"]),
        gpu_only=gpu_only,
        source=source,
        date=date,
        notes=_optional(raw, "notes", lambda v: _as_str(path, label, "notes", v)),
        origin=str(path),
        host_cpu=host_cpu,
        vcpus=_optional(raw, "vcpus", lambda v: _as_int(path, label, "vcpus", v)),
        host_memory_gb=_optional(raw, "host_memory_gb", lambda v: _as_number(path, label, "host_memory_gb", v)),
        interconnect=links["interconnect"],
        network=links["network"],
    )


def _offer_link(path: Path, label: str, raw: dict[str, Any], key: str, scope: str,
                interconnect_scopes: dict[str, str]) -> str | None:
    """An offer's `interconnect` (between its GPUs) or `network` (between instances): an interconnect id
    of that scope."""
    link = _optional(raw, key, lambda v: _as_str(path, label, key, v))
    if link is None:
        return None
    if link not in interconnect_scopes:
        raise HwdbError(path, f"unknown interconnect {shown(link)}{_suggest(link, set(interconnect_scopes))}",
                        entry=label, key=key)
    if interconnect_scopes[link] != scope:
        raise HwdbError(path, f"interconnect {shown(link)} has scope {interconnect_scopes[link]}, and this key "
                        f"needs one of scope {scope}", entry=label, key=key)
    return link


def _build_defaults(layers: Sequence[_Layer], source_ids: set[str]) -> CostDefaults:
    merged: dict[str, tuple[Path, Any]] = {}
    for layer in layers:
        merged.update(layer.defaults)
    if "electricity_usd_per_kwh" not in merged:
        raise HwdbError(layers[0].directory, "no file sets electricity_usd_per_kwh", key="electricity_usd_per_kwh")
    path, price = merged["electricity_usd_per_kwh"]
    kwh = _as_number(path, None, "electricity_usd_per_kwh", price)
    source_path, source = merged.get("electricity_source", (path, "X"))
    source = _as_str(source_path, None, "electricity_source", source)
    if source not in source_ids:
        raise HwdbError(source_path, f"unknown source {shown(source)}{_suggest(source, source_ids)}",
                        key="electricity_source")
    return CostDefaults(electricity_usd_per_kwh=kwh, electricity_source=str(source))
