"""The package's layers (issue #23): no module imports a layer above its own, the views (command
line, TUI) do not import each other, and every interface exposes every option of a PlanRequest."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from advisor.app.request import OPTIONS, PlanRequest

PACKAGE = Path(__file__).resolve().parents[1] / "advisor"

LAYERS = (
    ("errors", "units", "limits", "paths", "atomic", "pickled", "process", "__init__"),
    ("hardware",),
    ("probe",),
    ("profile",),
    ("calibration", "memory", "parallel"),
    ("pipeline",),
    ("estimate",),
    ("app",),
    ("present",),
    ("report",),
    ("cli", "tui"),
    ("__main__",),  # `python -m advisor`: the entry point, above every view
)
"""Top-level modules and packages of advisor/, lowest first. A module may import its own package,
the base layer's modules, and lower layers; packages sharing a layer do not import each other."""

LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}


def imported(text: str) -> set[str]:
    """Top-level names of advisor/ that the module `text` imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(text)):
        modules = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        for module in modules:
            parts = module.split(".")
            if parts[0] == "advisor" and len(parts) > 1:
                names.add(parts[1])
    return names


def package_modules() -> dict[str, str]:
    """Every module of advisor/: its path inside the package -> its text."""
    return {path.relative_to(PACKAGE).as_posix(): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def upward_imports(modules: dict[str, str]) -> list[str]:
    found = []
    for relative, text in modules.items():
        source = relative.split("/")[0].removesuffix(".py")
        assert source in LEVEL, f"advisor/{relative} is in no layer of LAYERS"
        for target in imported(text) - {source}:
            assert target in LEVEL, f"advisor/{relative} imports advisor.{target}, in no layer"
            sideways = LEVEL[target] == LEVEL[source] and LEVEL[source] != 0
            if LEVEL[target] > LEVEL[source] or sideways:
                found.append(f"advisor/{relative} imports advisor.{target}")
    return found


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward_imports(package_modules()) == []


def test_the_walk_sees_upward_and_sideways_imports() -> None:
    assert upward_imports({"profile/x.py": "def f():\n    from advisor.cli import main\n",
                           "tui/y.py": "import advisor.cli.main\n",
                           "cli/z.py": "from advisor.present.format import si\n"}) == [
        "advisor/profile/x.py imports advisor.cli", "advisor/tui/y.py imports advisor.cli"]


def cli_options() -> set[str]:
    """PlanRequest fields the `estimate` and `report` commands' flags fill (request_from_arguments)."""
    from advisor.cli.main import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    destinations = set()
    for command in ("estimate", "report"):
        destinations |= {action.dest for action in subparsers.choices[command]._actions}
    renamed = {"gpu": "gpus", "trace_timeout": "trace_timeout_s", "compile": "compiled"}
    return {renamed.get(d, d) for d in destinations} & set(OPTIONS)


def test_the_command_line_exposes_every_option() -> None:
    # estimate has all but the report's --budget-usd and --deadline-hours; the TUI's form: tests/test_tui.py
    assert cli_options() == set(OPTIONS)


@pytest.mark.parametrize("fields, message", [
    ({"steps": 10, "samples": 100}, "give either --steps or --samples/--epochs, not both"),
    ({"batch_size": 0}, "batch size must be at least 1, got 0"),
    ({"batch_size": 12, "micro_batch": 5}, "--batch-size 12 is not a multiple of --micro-batch 5"),
    ({"precision": "fp8x"}, "unknown precision 'fp8x'"),
    ({"epochs": float("nan")}, "epochs must be a positive number, got nan"),
    ({"trace_timeout_s": -1.0}, r"trace timeout must be a positive \(or zero\) number, got -1"),
])
def test_a_request_is_checked_when_made(fields: dict, message: str) -> None:
    from advisor.errors import UserError

    with pytest.raises(UserError, match=message):
        PlanRequest(**fields)


def test_traces_are_shared_by_requests_that_differ_only_after_the_trace() -> None:
    base = PlanRequest(model="mlp", batch_size=8)
    assert not base.traces_differ(PlanRequest(model="mlp", batch_size=8, gpus=("h100-sxm",), spot=True, steps=5))
    assert base.traces_differ(PlanRequest(model="mlp", batch_size=16))
    assert base.trace_key() == PlanRequest(model="mlp", batch_size=8, provider="lambda", epochs=3).trace_key()
    assert base.trace_key() != PlanRequest(model="mlp", batch_size=8, lora=4).trace_key()


def test_an_edited_model_file_is_traced_again(tmp_path: Path) -> None:
    import os

    model = tmp_path / "m.py"
    model.write_text("# one\n")
    before = PlanRequest(model=str(model)).trace_key()
    assert PlanRequest(model=str(model), spot=True).trace_key() == before
    model.write_text("# two, longer\n")
    os.utime(model, ns=(1, 1))  # a different modification time too, whatever the clock's resolution
    assert PlanRequest(model=str(model)).trace_key() != before


def test_every_package_is_installed() -> None:
    # pyproject.toml lists packages by name (the data folders are mapped in): a new one must be listed,
    # or `pip install .` leaves it out and every command fails to import
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(("advisor", *init.parent.relative_to(PACKAGE).parts)).rstrip(".")
             for init in PACKAGE.rglob("__init__.py") if "__pycache__" not in init.parts}
    assert found - listed == set()


def test_one_precision_value_answers_every_question() -> None:
    from advisor.memory.estimate import parameter_formula_bytes
    from advisor.profile.choices import PRECISIONS, precision_of

    assert PRECISIONS == ("fp32", "tf32", "amp-fp16", "amp-bf16", "bf16", "bf16-master", "fp16", "fp8", "fp8-master")
    assert [p for p in PRECISIONS if precision_of(p).float8] == ["fp8", "fp8-master"]
    assert precision_of("fp8").matmul_dtype == "fp8" and precision_of("fp8").autocast == "bf16"
    assert [p for p in PRECISIONS if precision_of(p).grad_scaler] == ["amp-fp16"]
    assert [p for p in PRECISIONS if precision_of(p).cast] == ["bf16", "bf16-master", "fp16", "fp8-master"]
    assert [p for p in PRECISIONS if precision_of(p).master] == ["bf16-master", "fp8-master"]
    # Adam, per parameter: fp32 4 + 4 + 2 x 4 = 16 B; amp adds a 2-byte copy: 18 B; pure bf16 2 + 2 + 2 x 2 = 8 B;
    # bf16-master 2 + 2 + 4 (master) + 4 (its gradient) + 2 x 4 = 20 B
    assert [parameter_formula_bytes(1, p, "adamw") for p in ("fp32", "amp-bf16", "bf16", "bf16-master")] == \
        [16, 18, 8, 20]


def torch_assignments(text: str) -> list[str]:
    """Attributes of torch the module `text` assigns (`torch.x.y = ...`, `setattr(torch..., ...)`)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            targets = [node.args[0]]
        for target in targets:
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id == "torch" and target is not root:
                found.append(ast.unparse(target))
            elif isinstance(root, ast.Name) and root.id == "torch" and isinstance(node, ast.Call):
                found.append(f"setattr({ast.unparse(target)}, ...)")
    return found


def test_torch_is_patched_in_one_module_only() -> None:
    patched = {relative: torch_assignments(text) for relative, text in package_modules().items()}
    # calibration/runner.py sets torch.backends' public TF32 switches around a TF32 measurement and
    # restores them: a setting torch offers, not a replaced function
    assert {relative for relative, found in patched.items() if found} <= {"profile/torch_patches.py",
                                                                          "calibration/runner.py"}
    assert all(name.startswith("torch.backends.") for name in patched["calibration/runner.py"])
    assert torch_assignments("import torch\ntorch.utils.swap_tensors = f\n") == ["torch.utils.swap_tensors"]
