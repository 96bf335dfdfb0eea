"""Attacks on the command line and on the model file (issue #19): the model file is user code inside
our process (it prints, exits, starts threads, runs out of memory), and numbers come from people.
Each row: the contract's outcome (exit 2 and one sentence, data alone on stdout). Process-level
cases (signals, pipes, imports) follow the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.attacks import REPO, Attack, check_attack

pytestmark = pytest.mark.slow  # seconds per test: `python -m pytest -m "not slow"` skips them

LINEAR = """
import torch
def build_model():
    return torch.nn.Linear(8, 4)
def example_input(batch_size):
    return torch.randn(batch_size, 8)
"""


def model(body: str = "", build: str = "return torch.nn.Linear(8, 4)", forward: str = "") -> str:
    """A tiny model file: `body` at import, `build` as build_model's body, `forward` run in forward."""
    forward_lines = f"        {forward}\n" if forward else ""
    return f"""
import torch
{body}
class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
    def forward(self, x):
{forward_lines}        return self.fc(x)
def build_model():
    {build}
def example_input(batch_size):
    return torch.randn(batch_size, 8)
"""


TINY = model(build="return Tiny()")
ONE_GPU = ("--gpu", "h100-sxm")
FRAMES = 8
"""A user's failure shows one sentence and the user's own frames."""

ATTACKS = [
    # --- the model file writes to our stdout: it goes to stderr, --json still parses
    Attack("print in the model file, estimate --json", ("estimate", "m.py", *ONE_GPU, "--json"), exit_code=0,
           files={"m.py": model('print("hello from import")', 'print("building"); return Tiny()', 'print("fwd")')},
           json_stdout=True, stdout=r'^\{', stderr="hello from import"),
    Attack("print in the model file, profile --json", ("profile", "m.py", "--no-fvcore", "--json"), exit_code=0,
           files={"m.py": model('print("hello")', 'print("building"); return Tiny()')}, json_stdout=True,
           stdout=r'^\{'),
    Attack("print in the model file, memory --json", ("memory", "m.py", *ONE_GPU, "--json"), exit_code=0,
           files={"m.py": model('print("hello")', "return Tiny()", 'print("fwd")')}, json_stdout=True,
           stdout=r'^\{'),
    Attack("C-level write to fd 1 in the model file", ("estimate", "m.py", *ONE_GPU, "--json"), exit_code=0,
           files={"m.py": model('import os; os.write(1, b"raw bytes on fd 1\\n")', "return Tiny()")},
           json_stdout=True, stdout=r'^\{', stderr="raw bytes on fd 1"),
    # --- the model file does not decide how we exit
    Attack("sys.exit(0) in build_model", ("estimate", "m.py", *ONE_GPU), subprocess=True,
           files={"m.py": model("import sys", "sys.exit(0)")}, stderr=r"build_model\(\) called sys\.exit\(0\)",
           max_stderr_lines=FRAMES),
    Attack("sys.exit('msg') at import", ("estimate", "m.py", *ONE_GPU), subprocess=True,
           files={"m.py": model('import sys; sys.exit("bye")')}, stderr=r"importing the file called sys\.exit\('bye'\)",
           max_stderr_lines=FRAMES),
    Attack("sys.exit in forward", ("estimate", "m.py", *ONE_GPU, "--json"), subprocess=True,
           files={"m.py": model("import sys", "return Tiny()", "sys.exit(3)")}, json_stdout=True, stdout=r"^$",
           stderr=r"forward .* called sys\.exit\(3\)", max_stderr_lines=FRAMES),
    Attack("MemoryError in build_model", ("estimate", "m.py", *ONE_GPU),
           files={"m.py": model(build="raise MemoryError()")}, stderr="ran out of memory", max_stderr_lines=FRAMES),
    Attack("non-daemon thread started by the model", ("estimate", "m.py", *ONE_GPU, "--json"), exit_code=0,
           subprocess=True, timeout_s=90, json_stdout=True, stdout=r'^\{',
           files={"m.py": model("import threading, time",
                                "threading.Thread(target=time.sleep, args=(3600,)).start(); return Tiny()")}),
    # --- the model module is a real module (sys.modules)
    Attack("dataclass config with postponed annotations (nanoGPT style)", ("estimate", "m.py", *ONE_GPU), exit_code=0,
           files={"m.py": "from __future__ import annotations\nfrom dataclasses import dataclass\n"
                          "@dataclass\nclass Config:\n    n_in: int = 8\n" + model(build="return Tiny()")}),
    Attack("pickling a class of the model file", ("estimate", "nano.py", *ONE_GPU), exit_code=0,
           files={"nano.py": model("import pickle\nclass Cfg:\n    n = 8",
                                   "assert pickle.loads(pickle.dumps(Cfg())).n == 8; return Tiny()")}),
    Attack("multiprocessing pool in build_model", ("estimate", "mp_model.py", *ONE_GPU), exit_code=0,
           files={"mp_model.py": model("import multiprocessing\ndef square(v):\n    return v * v",
                                       "pool = multiprocessing.get_context('fork').Pool(2)\n"
                                       "    assert pool.map(square, [1, 2]) == [1, 4]; pool.close(); pool.join()\n"
                                       "    return Tiny()")}),
    Attack("model file named like a standard module", ("estimate", "json.py", *ONE_GPU), exit_code=0,
           files={"json.py": TINY}),
    # --- built-in examples are input, not our code
    Attack("huge batch on a built-in example", ("estimate", "mlp", "--batch-size", "99999999999999999999999"),
           stderr=r"--batch-size: must be at most 1,048,576"),
    # --- numbers
    Attack("--epochs inf", ("estimate", "mlp", "--epochs", "inf"), stderr=r"--epochs: expected a finite number"),
    Attack("--epochs 1e308", ("estimate", "mlp", "--epochs", "1e308"), stderr=r"--epochs: must be at most"),
    Attack("--epochs nan", ("estimate", "mlp", "--epochs", "nan"), stderr=r"--epochs: expected a finite number"),
    Attack("--samples 10^39", ("estimate", "mlp", "--samples", "1" + "0" * 39), stderr=r"--samples: must be at most"),
    Attack("--steps -1", ("estimate", "mlp", "--steps", "-1"), stderr=r"--steps: must be at least 1"),
    Attack("memory --cuda-context-mib inf", ("memory", "mlp", "--cuda-context-mib", "inf"),
           stderr=r"--cuda-context-mib: expected a finite number"),
    Attack("gpus --min-memory-gb nan", ("gpus", "--min-memory-gb", "nan"), stderr=r"expected a finite number"),
    Attack("report --budget-usd inf", ("report", "mlp", "-o", "plan.html", "--budget-usd", "inf"),
           stderr=r"--budget-usd: expected a finite number"),
    Attack("report --deadline-hours 0", ("report", "mlp", "-o", "plan.html", "--deadline-hours", "0"),
           stderr=r"--deadline-hours: must be more than 0"),
    Attack("batch not a multiple of the micro-batch", ("estimate", "mlp", "--batch-size", "10", "--micro-batch", "3"),
           stderr=r"--batch-size 10 is not a multiple of --micro-batch 3.*--batch-size 9"),
    Attack("TRAIN_SAMPLES absurd in the model file", ("estimate", "m.py", *ONE_GPU),
           files={"m.py": LINEAR + "TRAIN_SAMPLES = 10**39\n"}, stderr=r"TRAIN_SAMPLES must be a whole number from 1"),
    Attack("SAMPLE_UNIT with a newline and HTML", ("estimate", "m.py", *ONE_GPU),
           files={"m.py": LINEAR + "SAMPLE_UNIT = 'rows\\n<script>'\n"}, stderr=r"SAMPLE_UNIT must be a short printable"),
    Attack("unknown subcommand", ("estimte",), stderr=r"invalid choice: 'estimte'", max_stderr_lines=1),
    Attack("usage error is one line", ("estimate", "--batch-size", "x"), stderr=r"expected a whole number",
           max_stderr_lines=1),
    # --- what torch would refuse on a real device
    Attack("int64 input to nn.Linear", ("estimate", "m.py", *ONE_GPU),
           files={"m.py": LINEAR.replace("torch.randn(batch_size, 8)", "torch.ones(batch_size, 8, dtype=torch.int64)")},
           stderr=r"raised RuntimeError: addmm of float32 and int64 tensors"),
    # --- memory says so when nothing fits, as estimate does
    Attack("memory when the model fits nowhere", ("memory", "m.py", "--gpu", "rtx-3060"),
           files={"m.py": LINEAR.replace("Linear(8, 4)", "Linear(65536, 65536)").replace(", 8)", ", 65536)")},
           stderr=r"does not fit on any of the 1 devices"),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack(attack: Attack, tmp_path: Path, capfd: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch) -> None:
    check_attack(attack, tmp_path, capfd, monkeypatch)


def test_a_gpu_named_twice_is_estimated_once(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    attack = Attack("repeated --gpu", ("estimate", "mlp", *ONE_GPU, *ONE_GPU, "--json"), exit_code=0, json_stdout=True)
    outcome = check_attack(attack, tmp_path, capfd, monkeypatch)
    assert [r["gpu_id"] for r in json.loads(outcome.stdout)["results"]] == ["h100-sxm"]


# ---- the process: signals, children, pipes, imports ----------------------------------------------------

LOOPS_FOREVER = model(build="return Tiny()", forward="while True: pass")


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_looping_estimate(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """`advisor estimate` on a model whose forward never returns; waits until its trace child runs
    (where the machine allows one) and returns the process and its children."""
    (tmp_path / "loop.py").write_text(LOOPS_FOREVER)
    # Ctrl-C as a terminal delivers it: a shell that started pytest in the background without job control
    # made SIGINT ignored, and a child inherits that (Python then installs no KeyboardInterrupt handler)
    process = subprocess.Popen([sys.executable, "-m", "advisor", "estimate", "loop.py", *ONE_GPU], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    children: list[int] = []
    while time.monotonic() < deadline and not children:
        time.sleep(0.5)
        children = _children(process.pid)
        if process.poll() is not None:
            break
    if not children:
        time.sleep(3)  # no fork here (one CPU): the parent itself loops
    return process, children


def _assert_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    assert not [pid for pid in pids if _alive(pid)], "a trace child outlived advisor"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("signum, code, line", [(signal.SIGTERM, 143, "advisor: terminated"),
                                                (signal.SIGINT, 130, "advisor: interrupted"),
                                                (signal.SIGKILL, -9, None)])
def test_no_process_outlives_advisor(tmp_path: Path, signum: int, code: int, line: str | None) -> None:
    process, children = _start_looping_estimate(tmp_path)
    try:
        assert process.poll() is None, process.communicate()
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
        assert process.returncode == code, err
        if line is not None:
            assert err.strip().splitlines() == [line] and out == ""
        _assert_gone(children)
    finally:  # a failure leaves no looping process behind
        for pid in [process.pid, *children]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_a_signal_during_a_native_import_waits_for_its_end() -> None:
    """SIGTERM inside signals_deferred() (where triton's nanobind module init once turned it into an
    abort, exit -6, in this file's signal test) is raised as Terminated right after the block."""
    script = """
import os, signal, time
from advisor.process import Terminated, signals_deferred, terminate_on_sigterm
terminate_on_sigterm()
try:
    with signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("the block ran to its end")
    print("not reached")
except Terminated:
    print("Terminated after it")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stdout.splitlines()) == (0, ["the block ran to its end", "Terminated after it"])


@pytest.mark.parametrize("exception, code, line", [("KeyboardInterrupt", 130, "advisor: interrupted"),
                                                    ("Terminated", 143, "advisor: terminated")])
def test_a_signal_swallowed_by_a_weakref_callback_still_ends_the_process(exception: str, code: int,
                                                                          line: str) -> None:
    """Ctrl-C landing in a weakref callback (the import system's module locks have them) is "ignored" by
    CPython and a looping model never stops (seen once in this file's signal test): the process leaves
    anyway, with the usual one line and exit code."""
    script = f"""
import weakref
from advisor.process import Terminated, terminate_on_sigterm
terminate_on_sigterm()
class Anything: pass
thing = Anything()
def callback(reference):
    raise {exception}()
reference = weakref.ref(thing, callback)
del thing  # the callback runs here; its exception cannot propagate
print("still running")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stdout, done.stderr.strip().splitlines()) == (code, "", [line])


def test_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`advisor gpus | head -1`: no BrokenPipeError traceback."""
    reader = subprocess.Popen([sys.executable, "-m", "advisor", "gpus"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert reader.stdout is not None
    reader.stdout.readline()
    reader.stdout.close()  # the reader goes away, as `head` does
    err = reader.stderr.read().decode() if reader.stderr else ""
    reader.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err
    assert reader.returncode in (0, 141)


@pytest.mark.parametrize("argv", [["--help"], ["gpus"], ["gpus", "--json"], ["estimate", "--help"]])
def test_light_commands_do_not_import_torch(argv: list[str]) -> None:
    code = ("import sys, contextlib, io\nfrom advisor.cli.main import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        main({argv!r})\n"
            "    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'fvcore', 'scipy', 'matplotlib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_successful_command_writes_nothing_to_stderr(tmp_path: Path) -> None:
    """No exit-time noise (nanobind's leak reports on torch 2.15 came from finalising at exit)."""
    (tmp_path / "m.py").write_text(TINY)
    result = subprocess.run([sys.executable, "-m", "advisor", "estimate", "m.py", *ONE_GPU, "--json"], cwd=tmp_path,
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    json.loads(result.stdout)
