"""Attacks on the hardware database (issue #19): each bad YAML file given with `--hwdb` ends in one
sentence naming the file (and the entry, key and line where there is one) and exit 2, quickly, with
bounded memory; never a traceback, never a whole value printed. `advisor gpus` reads the database and
needs no model, so it is the cheap command to attack it through."""

from __future__ import annotations

import datetime as dt
import math
import os
import time
from pathlib import Path

import pytest
import yaml

from advisor.hardware import loader
from advisor.hardware.loader import MAX_FILE_BYTES, HwdbError, load_directories
from tests.attacks import Attack, check_attack
from tests.conftest import SOURCES, TINY_GPU, TINY_OFFER, write_yaml

GPUS = ("gpus", "--hwdb", "{tmp}/db")
LONGEST_LINE = 300
"""No stderr line of these attacks is longer: a value is shown cut, never whole."""


def gpu_file(**changes: object) -> str:
    """A file with one valid GPU entry (citing the shipped source X), changed as given."""
    entry = {"id": "my-gpu", "name": "My GPU", "vendor": "nvidia", "segment": "geforce", "memory_gb": 24,
             "bandwidth_gbps": 936, "peak_tflops": {"fp32": 35.6}, "sources": ["X"], **changes}
    return yaml.safe_dump({"gpus": [entry]}, sort_keys=False)


def source_file(url: object) -> str:
    return yaml.safe_dump({"sources": [{"id": "EVIL", "grade": "A", "title": "a page", "url": url}]})


def alias_bomb(levels: int) -> str:
    """memory_gb as a billion-laughs list: level 1 holds 9 strings, each next level 9 aliases of the one
    before, so `levels` levels expand to about 9**levels values in a file of 60 bytes per level."""
    names = "abcdefghijklmnop"[:levels]
    rows = ["      - &a [x, x, x, x, x, x, x, x, x]"]
    rows += [f"      - &{name} [" + ", ".join([f"*{prev}"] * 9) + "]" for prev, name in zip(names, names[1:])]
    return ("gpus:\n  - id: bomb-gpu\n    name: Bomb\n    vendor: nvidia\n    segment: datacenter\n"
            "    bandwidth_gbps: 500\n    peak_tflops: {fp32: 10}\n    sources: [X]\n    memory_gb:\n"
            + "\n".join(rows) + "\n")


def _sparse_file(size: int):
    def setup(tmp: Path) -> None:
        with open(tmp / "db" / "big.yaml", "wb") as handle:  # a 50 MB catalog without writing 50 MB
            handle.truncate(size)
    return setup


def _fifo(tmp: Path) -> None:
    os.mkfifo(tmp / "db" / "pipe.yaml")


def _dangling_link(tmp: Path) -> None:
    (tmp / "db" / "gone.yaml").symlink_to(tmp / "db" / "nowhere.yaml")


def _chmod(name: str, mode: int):
    def setup(tmp: Path) -> None:
        (tmp / "db" / name).chmod(mode)
    return setup


ATTACKS = [
    # 1. alias bombs: refused from the YAML events before anything is built, in milliseconds
    Attack("alias_bomb_billion_laughs", GPUS, files={"db/bomb.yaml": alias_bomb(9)},
           stderr=r"db/bomb\.yaml: holds more than 1,000,000 values once its aliases \(\*name\) are expanded"),
    Attack("alias_bomb_below_the_limit_is_shown_cut", GPUS, files={"db/bomb.yaml": alias_bomb(4)},
           stderr=r"entry 'bomb-gpu', key 'memory_gb': must be a number, got \[\[.{1,60}\n$"),
    Attack("alias_inside_the_value_it_names", GPUS, files={"db/loop.yaml": "gpus:\n  - &a {id: x, notes: [*a]}\n"},
           stderr=r"loop\.yaml: line 2: alias \*a is inside the value it names"),
    # 2. what made tracebacks: yaml's own ValueErrors, bytes, nesting, shapes, permissions, syntax
    Attack("date_that_does_not_exist", GPUS, files={"db/prices.yaml": "date: 2024-13-45\noffers: []\n"},
           stderr=r"prices\.yaml: not valid YAML at line 1, column 7: cannot read '2024-13-45' \(month must be in "),
    Attack("float_tag_on_text", GPUS, files={"db/d.yaml": "electricity_usd_per_kwh: !!float abc\n"},
           stderr=r"d\.yaml: not valid YAML at line 1, column \d+: cannot read 'abc'"),
    Attack("integer_of_5000_digits", GPUS, files={"db/d.yaml": "electricity_usd_per_kwh: " + "9" * 5000 + "\n"},
           stderr=r"d\.yaml: not valid YAML at line 1, column \d+: cannot read '9999"),
    Attack("python_object_tag_is_not_run", GPUS,
           files={"db/d.yaml": "electricity_usd_per_kwh: !!python/object/apply:os.system ['echo pwned']\n"},
           stderr=r"d\.yaml: not valid YAML at line 1, column \d+: could not determine a constructor"),
    Attack("bytes_that_are_not_utf8", GPUS, files={"db/latin1.yaml": b"gpus:\n  - id: caf\xe9\n"},
           stderr=r"latin1\.yaml: line 2: byte 0xe9 is not UTF-8; save the file as UTF-8 text"),
    Attack("ten_thousand_nested_brackets", GPUS, files={"db/deep.yaml": "gpus: " + "[" * 10_000 + "\n"},
           stderr=r"deep\.yaml: line 1: values nested more than 32 levels deep"),
    Attack("nesting_that_crashed_libyaml", GPUS, files={"db/deep.yaml": "[" * 200_000 + "]" * 200_000 + "\n"},
           stderr=r"deep\.yaml: line 1: values nested more than 32 levels deep"),
    Attack("deep_block_nesting", GPUS, files={"db/deep.yaml": "".join(f"{' ' * i}k{i}:\n" for i in range(40))},
           stderr=r"deep\.yaml: line 3\d: values nested more than 32 levels deep"),
    Attack("peak_tflops_as_a_list", GPUS, files={"db/mine.yaml": gpu_file(peak_tflops=[35.6, 71.2])},
           stderr=r"mine\.yaml: entry 'my-gpu', key 'peak_tflops': must map math modes to TFLOP/s"),
    Attack("yaml_syntax_error", GPUS, files={"db/broken.yaml": "gpus:\n  - id: a\n   name: [b\n"},
           stderr=r"broken\.yaml: not valid YAML at line \d+, column \d+: "),
    Attack("unreadable_file", GPUS, files={"db/locked.yaml": gpu_file()}, setup=_chmod("locked.yaml", 0),
           stderr=r"locked\.yaml: cannot be read \(Permission denied\)"),
    Attack("fifo_named_yaml", GPUS, files={"db/.keep": ""}, setup=_fifo, subprocess=True, timeout_s=60,
           stderr=r"pipe\.yaml: is not a regular file"),
    Attack("link_to_nothing", GPUS, files={"db/.keep": ""}, setup=_dangling_link,
           stderr=r"gone\.yaml: cannot be read \(No such file or directory\)"),
    # 3. a folder that cannot be listed may hold entries: an error, not silence
    Attack("unreadable_sub_folder", GPUS, files={"db/lab/mine.yaml": gpu_file()}, setup=_chmod("lab", 0),
           stderr=r"db/lab: folder cannot be read \(Permission denied\)"),
    # 4. a catalog far larger than a database is refused from its size, before it is read
    Attack("catalog_of_50_mb", GPUS, files={"db/.keep": ""}, setup=_sparse_file(50 * 2**20),
           stderr=r"big\.yaml: is 50\.0 MiB, above the limit of 4 MiB for one hardware-database file"),
    # 5. plausible ranges, low and high, naming the allowed range
    Attack("bandwidth_in_tb_per_s", GPUS, files={"db/mine.yaml": gpu_file(bandwidth_gbps=0.936)},
           stderr=r"mine\.yaml: entry 'my-gpu', key 'bandwidth_gbps': 0\.936 is not plausible "
                  r"\(allowed 10 to 100,000\); check the unit"),
    Attack("memory_in_tb", GPUS, files={"db/mine.yaml": gpu_file(memory_gb=0.024)},
           stderr=r"key 'memory_gb': 0\.024 is not plausible \(allowed 0\.5 to 4,096\)"),
    Attack("memory_in_mb", GPUS, files={"db/mine.yaml": gpu_file(memory_gb=24_576)},
           stderr=r"key 'memory_gb': 24576 is not plausible \(allowed 0\.5 to 4,096\)"),
    Attack("peak_in_pflops_far_too_small", GPUS, files={"db/mine.yaml": gpu_file(peak_tflops={"fp32": 1e-4})},
           stderr=r"key 'peak_tflops\.fp32': 0\.0001 is not plausible \(allowed 0\.001 to 100,000\)"),
    Attack("peak_in_gflops", GPUS, files={"db/mine.yaml": gpu_file(peak_tflops={"fp32": 35_600_000})},
           stderr=r"key 'peak_tflops\.fp32': 35600000 is not plausible"),
    Attack("bandwidth_nan", GPUS, files={"db/mine.yaml": gpu_file(bandwidth_gbps=math.nan)},
           stderr=r"key 'bandwidth_gbps': must be positive, got nan"),
    Attack("pcie_gen_infinite", GPUS, files={"db/mine.yaml": gpu_file(pcie_gen=math.inf)},
           stderr=r"key 'pcie_gen': inf is not plausible"),
    Attack("sm_count_of_400_digits", GPUS, files={"db/mine.yaml": gpu_file(sm_count=10**400)},
           stderr=r"key 'sm_count': 1000.{0,60} is not plausible \(allowed up to 10,000\)"),
    # 6. a source link is http(s) or nothing: never javascript:, data: or file:
    Attack("javascript_source_url", GPUS, files={"db/s.yaml": source_file("javascript:alert(1)")},
           stderr=r"s\.yaml: entry 'EVIL', key 'url': must be an http:// or https:// address \(or empty\), "
                  r"got 'javascript:alert\(1\)'"),
    Attack("data_source_url", GPUS, files={"db/s.yaml": source_file("data:text/html,<script>alert(1)</script>")},
           stderr=r"entry 'EVIL', key 'url': must be an http:// or https:// address"),
    Attack("file_source_url", GPUS, files={"db/s.yaml": source_file("file:///etc/passwd")},
           stderr=r"entry 'EVIL', key 'url': must be an http:// or https:// address"),
    Attack("source_url_with_a_newline", GPUS, files={"db/s.yaml": source_file("https://a.example/\nhttps://b")},
           stderr=r"entry 'EVIL', key 'url': must be an http:// or https:// address"),
    Attack("source_url_not_text", GPUS, files={"db/s.yaml": source_file(["https://a.example/"])},
           stderr=r"entry 'EVIL', key 'url': must be a string"),
    # shapes that used to raise TypeError deep in the validation
    Attack("source_list_holding_a_mapping", GPUS, files={"db/mine.yaml": gpu_file(sources=[{"X": 1}])},
           stderr=r"key 'sources': must be a list of source ids, got \{'X': 1\} in it"),
    Attack("unverified_list_holding_a_list", GPUS,
           files={"db/mine.yaml": gpu_file(sources=["X"], unverified=[["memory_gb"]])},
           stderr=r"key 'unverified': names \['memory_gb'\], which this entry does not have"),
    Attack("electricity_source_a_list", GPUS,
           files={"db/d.yaml": "electricity_usd_per_kwh: 0.2\nelectricity_source: [X]\n"},
           stderr=r"d\.yaml: key 'electricity_source': must be a non-empty string, got \['X'\]"),
    # names are shown printable and short, whatever the file holds
    Attack("terminal_escape_in_an_id", GPUS, files={"db/mine.yaml": gpu_file(id="\x1b[2J\x1b[31mred")},
           stderr=r"entry '\\x1b\[2J\\x1b\[31mred', key 'id': ids use lowercase"),
    Attack("id_of_ten_thousand_characters", GPUS, files={"db/mine.yaml": gpu_file(id="G" * 10_000)},
           stderr=r"entry 'GGGG[^']*\.\.\.G+', key 'id'"),
    Attack("key_of_ten_thousand_characters", GPUS,
           files={"db/mine.yaml": gpu_file(**{"bandwidth" * 1000: 1})},
           stderr=r"key '\'bandwidthbandwidth.{0,50}': unknown key"),
]

NEEDS_PERMISSIONS = {"unreadable_file", "unreadable_sub_folder"}
"""chmod does not stop root; these run as a user, and as monkeypatched reads below for root."""


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_hwdb_attack(attack: Attack, tmp_path: Path, capfd: pytest.CaptureFixture[str],
                     monkeypatch: pytest.MonkeyPatch) -> None:
    if attack.name in NEEDS_PERMISSIONS and os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode (simulated in test_unreadable_*_simulated)")
    started = time.perf_counter()
    outcome = check_attack(attack, tmp_path, capfd, monkeypatch)
    assert time.perf_counter() - started < 30, "a bad file is refused in seconds"
    assert all(len(line) <= LONGEST_LINE for line in outcome.stderr.splitlines()), outcome.stderr[:1000]
    assert outcome.stdout == ""


def test_unreadable_file_simulated(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = Path.open

    def denied(self: Path, mode: str = "r", *args: object, **kwargs: object):
        if self.name == "locked.yaml" and mode == "rb":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    check_attack(Attack("unreadable_file_simulated", GPUS, files={"db/locked.yaml": gpu_file()},
                        stderr=r"locked\.yaml: cannot be read \(Permission denied\)"), tmp_path, capfd, monkeypatch)


def test_unreadable_sub_folder_simulated(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    real_scandir = os.scandir

    def denied(path: object = "."):
        if str(path).endswith("/lab"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", denied)  # what os.walk lists folders with
    check_attack(Attack("unreadable_sub_folder_simulated", GPUS, files={"db/lab/mine.yaml": gpu_file()},
                        stderr=r"db/lab: folder cannot be read \(Permission denied\)"), tmp_path, capfd, monkeypatch)


def test_alias_bomb_is_refused_in_milliseconds(tiny_db_dir: Path) -> None:
    """The 590-byte bomb (9 levels, 9**9 = 387 million strings) cost 47 s and 4.4 GB before, most of it
    printing the expanded value in the error message; the event walk stops at the millionth value."""
    (tiny_db_dir / "bomb.yaml").write_text(alias_bomb(9), encoding="utf-8")
    started = time.perf_counter()
    with pytest.raises(HwdbError, match="more than 1,000,000 values") as info:
        load_directories([tiny_db_dir])
    assert time.perf_counter() - started < 10  # about 0.02 s; generous so that a busy machine passes
    assert len(str(info.value)) < LONGEST_LINE


def test_big_file_is_refused_before_it_is_opened(tiny_db_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open(tiny_db_dir / "big.yaml", "wb") as handle:
        handle.truncate(50 * 2**20)
    real_open = Path.open

    def guarded(self: Path, *args: object, **kwargs: object):
        assert self.name != "big.yaml", "the 50 MB file was opened"
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", guarded)
    started = time.perf_counter()
    with pytest.raises(HwdbError, match=r"is 50\.0 MiB, above the limit of 4 MiB"):
        load_directories([tiny_db_dir])
    assert time.perf_counter() - started < 2


def test_a_file_at_the_cap_is_still_read(tiny_db_dir: Path) -> None:
    """The cap is on bytes, not on what they hold: a file of exactly MAX_FILE_BYTES (a long comment
    here, to keep the test fast) loads."""
    text = "electricity_usd_per_kwh: 0.25\n"
    (tiny_db_dir / "prices" / "defaults.yaml").write_text(
        text + "electricity_source: S1\n#" + "x" * (MAX_FILE_BYTES - len(text) - 25) + "\n", encoding="utf-8")
    assert (tiny_db_dir / "prices" / "defaults.yaml").stat().st_size == MAX_FILE_BYTES
    assert load_directories([tiny_db_dir]).defaults.electricity_usd_per_kwh == 0.25


def test_the_c_loader_is_used_where_libyaml_is_installed() -> None:
    if hasattr(yaml, "CSafeLoader"):
        assert issubclass(loader._loader(), yaml.CSafeLoader)
    assert issubclass(loader._loader(), yaml.SafeLoader) or issubclass(loader._loader(), yaml.CSafeLoader)


def test_shown_values_are_cut() -> None:
    nested: list = ["x"] * 9
    for _ in range(8):
        nested = [nested] * 9  # 9**9 values, shared: shown() must not walk them
    started = time.perf_counter()
    assert len(loader.shown(nested)) <= loader.SHOWN_CHARS
    assert len(loader.shown("y" * 10**6)) <= loader.SHOWN_CHARS
    assert "..." in loader.shown(10**400) and len(loader.shown(10**400)) <= loader.SHOWN_CHARS
    assert time.perf_counter() - started < 1


WEIRD = [None, True, 0, -1, 10**30, 1e308, math.nan, math.inf, "", "x", [], [1], {}, {"a": 1}, [[1]],
         dt.date(2024, 1, 2), "G" * 500]


def _replace(document: dict, key: str, value: object) -> dict:
    entry = dict(document)
    entry[key] = value
    return entry


@pytest.mark.parametrize("kind", ["gpu", "offer", "source", "peak"])
def test_any_value_in_any_key_is_a_sentence_or_loads(tiny_db_dir: Path, kind: str) -> None:
    """Every key of every kind of entry, given every shape of YAML value: the database loads or says one
    short sentence naming the file; never TypeError, OverflowError, AttributeError or KeyError."""
    base = {"gpu": TINY_GPU, "offer": TINY_OFFER, "source": SOURCES["sources"][0],
            "peak": TINY_GPU["peak_tflops"]}[kind]
    for key in base:
        for value in WEIRD:
            if kind == "gpu":
                write_yaml(tiny_db_dir / "gpus" / "tiny.yaml", {"gpus": [_replace(TINY_GPU, key, value)]})
            elif kind == "peak":
                gpu = {**TINY_GPU, "peak_tflops": _replace(TINY_GPU["peak_tflops"], key, value)}
                write_yaml(tiny_db_dir / "gpus" / "tiny.yaml", {"gpus": [gpu]})
            elif kind == "offer":
                write_yaml(tiny_db_dir / "prices" / "cloud.yaml",
                           {"date": "2026-01-02", "offers": [_replace(TINY_OFFER, key, value)]})
            else:
                write_yaml(tiny_db_dir / "sources.yaml",
                           {"sources": [_replace(SOURCES["sources"][0], key, value), SOURCES["sources"][1]]})
            try:
                load_directories([tiny_db_dir])
            except HwdbError as exc:
                message = str(exc)
                assert ".yaml" in message and "\n" not in message and len(message) < LONGEST_LINE, message
        write_yaml(tiny_db_dir / "gpus" / "tiny.yaml", {"gpus": [dict(TINY_GPU)]})
        write_yaml(tiny_db_dir / "prices" / "cloud.yaml", {"date": "2026-01-02", "offers": [dict(TINY_OFFER)]})
        write_yaml(tiny_db_dir / "sources.yaml", SOURCES)
