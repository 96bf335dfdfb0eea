"""Loading model files by the contract, and the errors a user gets for broken ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from advisor.errors import UserError
from advisor.profile.model_file import DEFAULT_EXAMPLE, load_model_file, resolve_model_path
from advisor.profile.user_code import UserCodeError

GOOD = """
import torch
SAMPLE_UNIT = "rows"
BATCH_SIZE = 16
def build_model():
    return torch.nn.Linear(4, 2)
def example_input(batch_size):
    return torch.randn(batch_size, 4)
"""


def write(tmp_path: Path, text: str, name: str = "model.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_good_file_loads_with_its_optional_names(tmp_path: Path) -> None:
    model = load_model_file(write(tmp_path, GOOD))
    assert (model.name, model.builtin, model.sample_unit, model.batch_size, model.loss_fn) == (
        "model", False, "rows", 16, None)


def test_examples_resolve_by_name_path_or_default() -> None:
    assert resolve_model_path(None)[0].stem == DEFAULT_EXAMPLE
    assert resolve_model_path("bert_base")[0] == resolve_model_path("examples/bert_base.py")[0]
    assert resolve_model_path("gpt2_small")[1] is True


def test_missing_file_suggests_the_closest_example() -> None:
    with pytest.raises(UserError, match=r"model file 'resnet5' not found; did you mean the built-in example "
                                        r"resnet50\?"):
        resolve_model_path("resnet5")
    with pytest.raises(UserError, match=r"model file 'nowhere/model.py' not found \(built-in examples: "):
        resolve_model_path("nowhere/model.py")


def test_directory_is_not_a_model_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is a directory"):
        resolve_model_path(str(tmp_path))


def test_missing_build_model(tmp_path: Path) -> None:
    path = write(tmp_path, "def example_input(batch_size):\n    return None\n")
    with pytest.raises(UserError, match=r"model.py defines no build_model\(\); a model file defines build_model\(\) "
                                        r"and example_input\(batch_size\)"):
        load_model_file(path)


def test_example_input_must_take_the_batch_size(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("def example_input(batch_size):", "def example_input():"))
    with pytest.raises(UserError, match="example_input must accept 1 positional argument"):
        load_model_file(path)


def test_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "import torch\ndef build_model(:\n    pass\n")
    with pytest.raises(UserError, match=r"model.py, line 2: syntax error"):
        load_model_file(path)


def test_exception_at_import_shows_the_users_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "import torch\n\nWIDTH = int('wide')\n")
    with pytest.raises(UserCodeError) as caught:
        load_model_file(path)
    assert caught.value.sentence.endswith("importing the file raised ValueError: invalid literal for int() with "
                                          "base 10: 'wide'")
    assert caught.value.user_frames[0].startswith(f'  File "{path}", line 3, in <module>')
    assert "WIDTH = int('wide')" in caught.value.user_frames[1]
    assert not any("importlib" in line or "advisor/" in line for line in caught.value.user_frames)


def test_model_file_imports_its_neighbours(tmp_path: Path) -> None:
    (tmp_path / "layers.py").write_text("import torch\ndef block():\n    return torch.nn.Linear(4, 2)\n")
    path = write(tmp_path, GOOD.replace("return torch.nn.Linear(4, 2)", "from layers import block\n    return block()"))
    model = load_model_file(path)
    assert model.build_model().out_features == 2


def test_two_model_files_of_one_folder_have_their_own_fingerprints(tmp_path: Path) -> None:
    # the trace cache keys a model by its fingerprint: with the folder's files alone, the second of two
    # model files beside each other was estimated from the first one's cached trace
    paths = write(tmp_path, GOOD, "first.py"), write(tmp_path, GOOD.replace("Linear(4, 2)", "Linear(4, 3)"), "second.py")
    first, second = (load_model_file(path) for path in paths)
    assert first.fingerprint and second.fingerprint and first.fingerprint != second.fingerprint
    assert load_model_file(paths[0]).fingerprint == first.fingerprint  # stable while the folder is unchanged


def test_bad_batch_size_constant(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="BATCH_SIZE must be a whole number from 1 to 1,048,576, got 0"):
        load_model_file(write(tmp_path, GOOD.replace("BATCH_SIZE = 16", "BATCH_SIZE = 0")))
