"""Load a model file by the contract of PRODUCT.md, or one of the built-in examples.

    def build_model() -> torch.nn.Module
    def example_input(batch_size: int)         # a Tensor, tuple of Tensors or dict of Tensors
    def loss_fn(output, inputs) -> Tensor       # optional
    SAMPLE_UNIT = "images"                      # optional
    BATCH_SIZE = 32                             # optional (an extension): the usual training batch
    TRAIN_SAMPLES = 1_281_167                   # optional (an extension): samples in one epoch
    def optimizer(params) -> torch.optim.Optimizer  # optional: the optimizer the training script builds
    SEQ_LEN = 2048                              # optional: tokens per sample (sequence models)
    def example_input(batch_size, seq_len=None) # may accept seq_len: --seq-len passes it
    TRAIN_TOKENS = 10_000_000                   # optional: the default job in tokens
    def dataset() -> torch.utils.data.Dataset   # optional: training samples with their transforms
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import keyword
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import UserError, closest_matches, shorten
from advisor.limits import MAX_BATCH_SIZE, MAX_JOB_SAMPLES, MAX_JOB_TOKENS, MAX_SEQ_LEN
from advisor.paths import shipped_dir
from advisor.profile.choices import DEFAULT_OPTIMIZER, FILE_OPTIMIZER
from advisor.profile.user_code import user_code

DEFAULT_EXAMPLE = "resnet50"
"""The model `advisor estimate` and `advisor profile` use when none is given."""

DEFAULT_BATCH_SIZE = 32
"""Batch size when neither the command line nor the model file's optional BATCH_SIZE gives one."""


def examples_dir() -> Path:
    return shipped_dir("examples", f"{DEFAULT_EXAMPLE}.py")


def builtin_examples() -> dict[str, Path]:
    """Built-in example name (file stem) -> path."""
    return {p.stem: p for p in sorted(examples_dir().glob("*.py")) if not p.stem.startswith("_")}


@dataclass(frozen=True)
class ModelFile:
    """A loaded model file: its path, display name and the functions of the contract."""

    path: Path
    name: str
    builtin: bool
    build_model: Callable[[], Any]
    example_input: Callable[[int], Any]
    loss_fn: Callable[[Any, Any], Any] | None
    sample_unit: str
    batch_size: int | None = None
    """The file's optional BATCH_SIZE: the batch it is usually trained with."""
    train_samples: int | None = None
    """The file's optional TRAIN_SAMPLES: samples in one epoch of its usual dataset."""
    optimizer: Callable[[list[Any]], Any] | None = None
    """The file's optional optimizer(params): builds the training script's optimizer over the trainable
    parameters (choices.FILE_OPTIMIZER)."""
    seq_len: int | None = None
    """Tokens per sample: the file's SEQ_LEN, or --seq-len once applied (with_seq_len); None: not a
    sequence model, or one that does not say."""
    accepts_seq_len: bool = False
    """example_input takes a `seq_len` keyword (the contract's extension for --seq-len)."""
    train_tokens: int | None = None
    """The file's optional TRAIN_TOKENS: the default job in tokens."""
    origin: str = ""
    """Where a model by name came from ("meta-llama/Llama-3.1-8B, config from the built-in catalog"); ""
    for a model file."""
    dataset: Callable[[], Any] | None = None
    """The file's optional dataset(): its training samples with their transforms (the input pipeline);
    None: the built-in pipeline its inputs call for (advisor.pipeline.datasets)."""
    fingerprint: str = ""
    """SHA-256 of what the model's step depends on beyond the settings: the file and the Python files
    beside it (a helper module it imports), or a named model's config and the transformers version; the
    trace cache's key (trace_cache.py). "" : not cached."""
    padded: bool = False
    """Its inputs carry a padding mask (with_padding_mask)."""

    def with_seq_len(self, seq_len: int) -> ModelFile:
        """This model file with every example input `seq_len` tokens long (--seq-len); a UserError
        when its example_input does not take a seq_len."""
        if not self.accepts_seq_len:
            raise UserError(f"--seq-len: {self.source}'s example_input does not take a seq_len; define it as "
                            "example_input(batch_size, seq_len=None) and make inputs of that length")
        example_input = self.example_input
        return dataclasses.replace(self, seq_len=seq_len,
                                   example_input=lambda batch_size: example_input(batch_size, seq_len=seq_len))

    def with_padding_mask(self) -> ModelFile:
        """This model by name with inputs that carry a padding mask (--padding-mask): the attention mask a
        batch padded to its longest sequence has, ones over each sample's tokens and zeros over its padding
        (PADDED_SHARE of the positions). Transformers then hands attention an explicit mask, which flash
        attention does not take. Its own fingerprint: the trace cache keeps its steps apart. A UserError
        for a model file: its example_input makes its own inputs."""
        if not self.origin:
            raise UserError(f"--padding-mask: {self.source} is a model file, whose example_input makes its own "
                            "inputs; return an attention_mask with zeros over the padding from it instead")
        example_input = self.example_input
        fingerprint = self.fingerprint and hashlib.sha256(f"{self.fingerprint}|padding mask".encode()).hexdigest()
        return dataclasses.replace(self, padded=True, fingerprint=fingerprint,
                                   example_input=lambda batch_size: with_padding(example_input(batch_size)))

    def resolve_optimizer(self, requested: str | None) -> str:
        """The optimizer to trace: `requested` (--optimizer), else the file's own when it defines one,
        else DEFAULT_OPTIMIZER. A UserError when --optimizer file names a function the file lacks."""
        if requested == FILE_OPTIMIZER and self.optimizer is None:
            raise UserError(f"--optimizer {FILE_OPTIMIZER}: {self.source} defines no optimizer(params) function")
        if requested is not None:
            return requested
        return FILE_OPTIMIZER if self.optimizer is not None else DEFAULT_OPTIMIZER

    @property
    def default_batch_size(self) -> int:
        """The file's BATCH_SIZE, else DEFAULT_BATCH_SIZE."""
        return self.batch_size or DEFAULT_BATCH_SIZE

    @property
    def source(self) -> str:
        """How messages name the file."""
        return describe_source(self.path, self.builtin)


def describe_source(path: Path, builtin: bool) -> str:
    """How messages name a model file: "example 'resnet50'" or its path."""
    return f"example '{path.stem}'" if builtin else str(path)


def resolve_model_path(spec: str | None) -> tuple[Path, bool]:
    """The file `spec` names and whether it is a built-in example: an existing path, or an example
    name (`resnet50`, `examples/resnet50.py`); None gives the default example."""
    examples = builtin_examples()
    if spec is None:
        return examples[DEFAULT_EXAMPLE], True
    path = Path(spec).expanduser()
    if path.is_file():
        return path.resolve(), False
    stem = Path(spec).stem if spec.endswith(".py") else spec
    if stem in examples and (len(path.parts) == 1 or path.parent.name == "examples"):
        return examples[stem], True
    if path.is_dir():
        raise UserError(f"'{spec}' is a directory; give a model file (.py)")
    suggestions = closest_matches(stem, examples) if len(path.parts) == 1 else []
    hint = f"; did you mean the built-in example {', '.join(suggestions)}?" if suggestions else ""
    raise UserError(
        f"model file '{spec}' not found{hint} (built-in examples: {', '.join(examples)})"
    )


def module_name_for(path: Path) -> str:
    """The name the model file is imported under: its stem, as `import model` beside it would, when
    that name is a free identifier (pickle, dataclasses and multiprocessing's spawn look the module up
    by name); else a private name that cannot shadow an installed module."""
    stem = path.stem
    if stem.isidentifier() and not keyword.iskeyword(stem):
        loaded = sys.modules.get(stem)
        if loaded is not None and getattr(loaded, "__file__", None) == str(path):
            return stem
        if loaded is None and not _importable_elsewhere(stem, path):
            return stem
    return f"advisor_user_model_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"


def _importable_elsewhere(name: str, path: Path) -> bool:
    """Whether `import name` would find a module other than `path` (stdlib, an installed package)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return True
    return spec is not None and spec.origin != str(path)


def _exec_module(path: Path, source: str) -> Any:
    module_name = module_name_for(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{source}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:  # the file may import modules beside it, as `python model.py` can
        sys.path.append(str(path.parent))
    sys.modules[module_name] = module  # as import does: dataclasses, pickle and typing look it up there
    try:
        with user_code("importing the file", source):
            try:
                spec.loader.exec_module(module)
            except SyntaxError as exc:
                raise UserError(f"{source}, line {exc.lineno}: syntax error: {exc.msg}") from exc
    except BaseException:
        if sys.modules.get(module_name) is module:
            del sys.modules[module_name]
        raise
    return module


def _required_function(module: Any, name: str, signature: str, source: str) -> Callable[..., Any]:
    function = getattr(module, name, None)
    if function is None:
        raise UserError(
            f"{source} defines no {name}(); a model file defines build_model() and example_input(batch_size) "
            f"(see {examples_dir() / 'mlp.py'})"
        )
    if not callable(function):
        raise UserError(f"{source}: {name} must be a function {signature}, got {type(function).__name__}")
    return function


def _check_accepts(function: Callable[..., Any], count: int, name: str, source: str) -> None:
    try:
        inspect.signature(function).bind(*range(count))
    except TypeError as exc:
        raise UserError(f"{source}: {name} must accept {count} positional argument(s): {exc}") from exc
    except ValueError:  # builtins without a signature: trust them
        pass


def _whole_number_in(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= limit


def _short_repr(value: Any) -> str:
    return shorten(repr(value), 40)


def load_model_file(spec: str | None) -> ModelFile:
    """Import the model file (or example) `spec` and check it follows the contract; `hf:ORG/NAME` and
    folders holding a config.json are built from that config (hub.py)."""
    from advisor.profile import hub

    if hub.is_hub_spec(spec):
        assert spec is not None
        return load_hub_model(spec)
    path, builtin = resolve_model_path(spec)
    source = describe_source(path, builtin)
    module = _exec_module(path, source)
    build_model = _required_function(module, "build_model", "build_model() -> torch.nn.Module", source)
    example_input = _required_function(module, "example_input", "example_input(batch_size)", source)
    _check_accepts(build_model, 0, "build_model", source)
    _check_accepts(example_input, 1, "example_input", source)
    loss_fn = getattr(module, "loss_fn", None)
    if loss_fn is not None:
        if not callable(loss_fn):
            raise UserError(f"{source}: loss_fn must be a function loss_fn(output, inputs)")
        _check_accepts(loss_fn, 2, "loss_fn", source)
    sample_unit = getattr(module, "SAMPLE_UNIT", "samples")
    if not isinstance(sample_unit, str) or not sample_unit.strip() or len(sample_unit) > 40 \
            or not sample_unit.isprintable():
        raise UserError(f"{source}: SAMPLE_UNIT must be a short printable word such as \"images\", "
                        f"got {_short_repr(sample_unit)}")
    batch_size = getattr(module, "BATCH_SIZE", None)
    if batch_size is not None and not _whole_number_in(batch_size, MAX_BATCH_SIZE):
        raise UserError(f"{source}: BATCH_SIZE must be a whole number from 1 to {MAX_BATCH_SIZE:,}, "
                        f"got {_short_repr(batch_size)}")
    optimizer = getattr(module, "optimizer", None)
    if optimizer is not None:
        if not callable(optimizer):
            raise UserError(f"{source}: optimizer must be a function optimizer(params) that returns a "
                            "torch.optim.Optimizer")
        _check_accepts(optimizer, 1, "optimizer", source)
    seq_len = getattr(module, "SEQ_LEN", None)
    if seq_len is not None and not _whole_number_in(seq_len, MAX_SEQ_LEN):
        raise UserError(f"{source}: SEQ_LEN must be a whole number from 1 to {MAX_SEQ_LEN:,}, got {_short_repr(seq_len)}")
    train_tokens = getattr(module, "TRAIN_TOKENS", None)
    if train_tokens is not None and not _whole_number_in(train_tokens, MAX_JOB_TOKENS):
        raise UserError(f"{source}: TRAIN_TOKENS must be a whole number from 1 to {MAX_JOB_TOKENS:.0e}, "
                        f"got {_short_repr(train_tokens)}")
    train_samples = getattr(module, "TRAIN_SAMPLES", None)
    if train_samples is not None and not _whole_number_in(train_samples, MAX_JOB_SAMPLES):
        raise UserError(f"{source}: TRAIN_SAMPLES must be a whole number from 1 to {MAX_JOB_SAMPLES:.0e}, "
                        f"got {_short_repr(train_samples)}")
    dataset = getattr(module, "dataset", None)
    if dataset is not None:
        if not callable(dataset):
            raise UserError(f"{source}: dataset must be a function dataset() that returns a torch.utils.data.Dataset")
        _check_accepts(dataset, 0, "dataset", source)
    return ModelFile(path, path.stem, builtin, build_model, example_input, loss_fn, sample_unit, batch_size,
                     train_samples, optimizer, seq_len, _takes_seq_len(example_input), train_tokens,
                     dataset=dataset, fingerprint=_file_fingerprint(path))


MAX_FINGERPRINT_FILES = 200
MAX_FINGERPRINT_BYTES = 16 * 2**20


def _file_fingerprint(path: Path) -> str:
    """SHA-256 of which file is the model, the model file and the .py files in its folder (what `import
    helper` beside it reads); "" (not cached) for a folder with more than MAX_FINGERPRINT_FILES of them or
    MAX_FINGERPRINT_BYTES. Two model files of one folder differ by the first: the folder alone is the same."""
    digest = hashlib.sha256(b"model\0" + path.name.encode() + b"\0")
    siblings = sorted(p for p in path.parent.glob("*.py") if p.is_file())
    if path not in siblings:
        siblings.insert(0, path)
    if len(siblings) > MAX_FINGERPRINT_FILES:
        return ""
    total = 0
    for file in siblings:
        data = file.read_bytes()
        total += len(data)
        if total > MAX_FINGERPRINT_BYTES:
            return ""
        digest.update(file.name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


PADDED_SHARE = 0.25
"""Of each sequence's positions, the share --padding-mask marks as padding. Attention computes every score
whatever the share (the fused kernels skip none of them), so it changes no cost the estimate counts."""


def with_padding(inputs: Any) -> Any:
    """A model by name's inputs (hub.input_function: `input_ids` and `labels`) with an `attention_mask` of
    ones over the first 1 - PADDED_SHARE of each sequence and zeros over the rest."""
    assert isinstance(inputs, dict) and "input_ids" in inputs, type(inputs)
    ids = inputs["input_ids"]
    mask = ids.new_ones(ids.shape)
    mask[:, max(1, round(ids.shape[1] * (1 - PADDED_SHARE))):] = 0
    return {**inputs, "attention_mask": mask}


def load_hub_model(spec: str) -> ModelFile:
    """The model `hf:ORG/NAME` or a config.json folder names, as a model file: its architecture built by
    transformers from the config, trained as a language model on sequences of tokens (hub.py)."""
    from advisor.profile import hub

    config = hub.resolve_config(spec)
    example_input = hub.input_function(config.config)
    return ModelFile(Path(spec), config.name.split("/")[-1], False, hub.build_function(config), example_input,
                     hub.model_loss, "sequences", hub.DEFAULT_BATCH_SIZE, None, None,
                     hub.default_seq_len(config.config), True, hub.DEFAULT_TRAIN_TOKENS,
                     origin=f"{config.name}, config from {config.origin}", fingerprint=hub.fingerprint(config))


def _takes_seq_len(example_input: Callable[..., Any]) -> bool:
    """Whether example_input accepts a `seq_len` keyword (or any keyword)."""
    try:
        parameters = inspect.signature(example_input).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return any(p.name == "seq_len" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
