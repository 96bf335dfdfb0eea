"""Models by name: `hf:ORG/NAME` or a folder holding a Hugging Face `config.json` (PRODUCT.md, issue #26).

The architecture is built with transformers (an optional extra) from the config alone, on fake tensors as
every model file is: no weights are read or downloaded. The config comes, first found first used, from
  1. the folder given, or the local Hugging Face cache (`$HF_HUB_CACHE`, `$HF_HOME/hub`, ~/.cache/huggingface/hub);
  2. the catalog shipped in hf_catalog/ (popular models, so the common names work offline);
  3. the Hub, when it is reachable and `HF_HUB_OFFLINE` is not set (huggingface_hub, transformers' dependency).

The job is a language model's: inputs are `input_ids` (and `labels`, so the model computes its own loss, as
Trainer and every fine-tuning script run it) of SEQ_LEN tokens; Seq2seq models (T5) get target sequences of
the same length.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from advisor import pickled
from advisor.errors import UserError, closest_matches

HUB_PREFIX = "hf:"
CATALOG_DIR = Path(__file__).resolve().parent / "hf_catalog"
"""The shipped configs: one `ORG--NAME.json` each, listed with their sources in catalog.yaml."""

DEFAULT_SEQ_LEN = 2048
"""Tokens per sequence when the command line gives none: a common fine-tuning length, capped by the model's
own maximum (GPT-2 1,024, BERT 512)."""
SEQ_LEN_WITHOUT_POSITIONS = 512
"""For models whose config gives no maximum length (T5's relative positions): its pre-training length."""

DEFAULT_BATCH_SIZE = 8
"""Sequences per optimizer step when the command line gives none."""
DEFAULT_TRAIN_TOKENS = 10_000_000
"""The default job: 10 M tokens, an instruction-tuning set of Alpaca's size (52 k samples)."""

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
SEQ2SEQ_SUFFIXES = ("ForConditionalGeneration",)
MASKED_SUFFIXES = ("ForMaskedLM", "ForPreTraining")


@dataclass(frozen=True)
class HubConfig:
    """A model's config.json and where it came from."""

    name: str
    """The model's id (ORG/NAME) or the folder's name."""
    config: dict[str, Any]
    origin: str
    """Where the config was read: "the local Hugging Face cache", "the built-in catalog", a folder, "the Hub"."""


def is_hub_spec(spec: str | None) -> bool:
    """Whether the model argument names a Hub model (`hf:ORG/NAME`) or a folder holding a config.json."""
    if spec is None:
        return False
    return spec.startswith(HUB_PREFIX) or (Path(spec).expanduser() / "config.json").is_file()


def fingerprint(config: HubConfig) -> str:
    """SHA-256 of the config and the transformers version: what the architecture built from it depends on
    (the trace cache's key, trace_cache.py); "" when transformers is not installed."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    try:
        transformers = version("transformers")
    except PackageNotFoundError:
        return ""
    text = json.dumps({"config": config.config, "transformers": transformers}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def resolve_config(spec: str) -> HubConfig:
    """The config `spec` names (see the module docstring for the order); a UserError in one sentence when
    it names nothing that can be found."""
    folder = Path(spec).expanduser()
    if not spec.startswith(HUB_PREFIX):
        return HubConfig(folder.resolve().name, _read_config(folder / "config.json"), f"folder {folder}")
    repo_id = spec[len(HUB_PREFIX):].strip().strip("/")
    if not repo_id:
        raise UserError("'hf:' needs a model id, such as hf:meta-llama/Llama-3.1-8B")
    cached = _cached_config(repo_id)
    if cached is not None:
        return HubConfig(repo_id, _read_config(cached), "the local Hugging Face cache")
    entry = catalog_entry(repo_id)
    if entry is not None:
        canonical, path = entry
        return HubConfig(canonical, _read_config(path), "the built-in catalog")
    return HubConfig(repo_id, _config_from_hub(repo_id), "the Hub")


@cache
def catalog() -> dict[str, dict[str, Any]]:
    """catalog.yaml's models: id -> {file, aliases, params_b, source, ...}, kept parsed (pickled.loaded)."""
    index = CATALOG_DIR / "catalog.yaml"
    if not index.is_file():
        return {}
    text = index.read_bytes()
    models = pickled.loaded("catalog", [(str(index), text)], (), dict,  # yaml alone parses it: no code to key
                            lambda: _parsed_catalog(text))
    assert isinstance(models, dict), f"{index}: 'models' must be a mapping"
    return models


def _parsed_catalog(text: bytes) -> dict[str, Any]:
    import yaml  # here: a model by name read back from the cache, or an example, does not import it

    return (yaml.safe_load(text.decode("utf-8")) or {}).get("models", {})


@cache
def catalog_names() -> dict[str, str]:
    """Every name the catalog answers to (ids and aliases, lower case) -> the model's id."""
    names = {}
    for model_id, entry in catalog().items():
        for name in (model_id, model_id.split("/")[-1], *(entry.get("aliases") or ())):
            names.setdefault(name.lower(), model_id)
    return names


def catalog_entry(name: str) -> tuple[str, Path] | None:
    """The catalog's model called `name` (its id, its name without the organisation, or an alias; any
    case): its id and config file; None when the catalog has none."""
    model_id = catalog_names().get(name.lower())
    if model_id is None:
        return None
    return model_id, CATALOG_DIR / catalog()[model_id]["file"]


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is not a readable JSON config: {exc}") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise UserError(f"{path} is not a Hugging Face model config: it has no 'model_type'")
    return config


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloaded repositories."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = Path(os.environ["HF_HOME"]).expanduser() if os.environ.get("HF_HOME") else \
        Path.home() / ".cache" / "huggingface"
    return home / "hub"


def _cached_config(repo_id: str) -> Path | None:
    """config.json of `repo_id` in the local cache: the snapshot refs/main points to, else the newest."""
    repo = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    main = repo / "refs" / "main"
    if main.is_file():
        candidate = repo / "snapshots" / main.read_text().strip() / "config.json"
        if candidate.is_file():
            return candidate
    snapshots = sorted((repo / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return snapshots[-1] if snapshots else None


def _config_from_hub(repo_id: str) -> dict[str, Any]:
    """config.json downloaded from the Hub; a UserError naming the catalog's closest names when it cannot be."""
    closest = dict.fromkeys(catalog_names()[name] for name in closest_matches(repo_id.lower(), catalog_names()))
    hint = (f"; the built-in catalog has {', '.join('hf:' + model_id for model_id in closest)}" if closest
            else "; `advisor models` lists the built-in catalog")
    unresolved = (f"cannot resolve 'hf:{repo_id}': it is not in the local Hugging Face cache nor in the "
                  "built-in catalog, and")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise UserError(f"{unresolved} HF_HUB_OFFLINE is set{hint}")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise UserError(f"{unresolved} huggingface_hub is not installed to ask the Hub "
                        f"(pip install 'gpu-advisor[hf]'){hint}") from None
    if not _hub_reachable():
        raise UserError(f"{unresolved} the Hub could not be reached{hint}")
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.CRITICAL)  # its own warning of the failed request would come before our sentence
    try:
        path = hf_hub_download(repo_id, "config.json")
    except Exception as exc:  # noqa: BLE001 - any failure to fetch is the same answer to the user
        raise UserError(f"{unresolved} the Hub did not give it ({_hub_failure(exc)}){hint}") from None
    finally:
        hub_logger.setLevel(level)
    return _read_config(Path(path))


HUB_CONNECT_TIMEOUT_S = 3.0
"""How long to wait for the Hub's address to answer before calling it unreachable (huggingface_hub itself retries
an unreachable host for tens of seconds)."""


def _hub_reachable() -> bool:
    """Whether a TCP connection to the Hub ($HF_ENDPOINT, else huggingface.co) opens within HUB_CONNECT_TIMEOUT_S."""
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=HUB_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _hub_failure(exc: Exception) -> str:
    """Why the Hub did not give a file, in a few words."""
    name = type(exc).__name__
    if name in ("LocalEntryNotFoundError", "ConnectionError", "OfflineModeIsEnabled"):
        return "it could not be reached"
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return "no such public model; a gated one needs `huggingface-cli login`"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{name}: {first[:100]}" if first else name


# --- building the model ---------------------------------------------------------------------------------


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise UserError("models by name (hf:, a config.json folder) need transformers: "
                        "pip install 'gpu-advisor[hf]'") from None
    return transformers


def task_of(config: dict[str, Any]) -> str:
    """"causal", "seq2seq" or "masked": what the model is trained to do, from its architectures entry
    (causal when it names none: the fine-tuning job people plan)."""
    for architecture in config.get("architectures") or ():
        if architecture.endswith(SEQ2SEQ_SUFFIXES):
            return "seq2seq"
        if architecture.endswith(MASKED_SUFFIXES):
            return "masked"
        if architecture.endswith(CAUSAL_SUFFIXES):
            return "causal"
    return "seq2seq" if config.get("is_encoder_decoder") else "causal"


IGNORED_CONFIG_KEYS = ("auto_map", "_name_or_path", "torch_dtype", "dtype")
"""Config keys the model is not built from: remote code, the checkpoint's path, and the dtype its weights were
saved in. transformers 5's from_config builds in that dtype (bf16 for most LLM configs); the trace builds in
torch's default fp32, the master weights mixed precision keeps, and --precision decides the rest (pure bf16
casts the model; --lora under amp-bf16 or fp8 keeps the frozen base in bf16)."""


def transformers_config(hub: HubConfig) -> Any:
    """The config as transformers' class for its model_type, with the KV cache off (training), without the
    keys of IGNORED_CONFIG_KEYS."""
    transformers = _transformers()
    model_type = hub.config["model_type"]
    try:
        config_class = transformers.CONFIG_MAPPING[model_type]
    except KeyError:
        raise UserError(f"{hub.name}: transformers {transformers.__version__} does not know model_type "
                        f"'{model_type}'; a newer transformers may (pip install -U transformers)") from None
    settings = {k: v for k, v in hub.config.items() if k not in IGNORED_CONFIG_KEYS}
    config = config_class.from_dict(settings)
    config.use_cache = False
    return config


def build_function(hub: HubConfig) -> Callable[[], Any]:
    """build_model() for the config: the Auto class of its task, with PyTorch's scaled-dot-product
    attention where the architecture supports it (Trainer's default), else its own."""
    transformers = _transformers()
    auto = {"causal": transformers.AutoModelForCausalLM, "seq2seq": transformers.AutoModelForSeq2SeqLM,
            "masked": transformers.AutoModelForMaskedLM}[task_of(hub.config)]

    def build_model() -> Any:
        config = transformers_config(hub)
        try:
            model = auto.from_config(config, attn_implementation="sdpa")
        except (ValueError, ImportError):  # this architecture has no sdpa path: its own attention
            model = auto.from_config(transformers_config(hub), attn_implementation="eager")
        if getattr(model, "loss_type", "") is None and task_of(hub.config) == "causal":
            model.loss_type = "ForCausalLM"  # transformers' own fallback for a class name it does not map, unwarned
        if hub.config.get("tie_word_embeddings") is False:
            _untie_output_embeddings(model)
        return model
    return build_model


def _untie_output_embeddings(model: Any) -> None:
    """A head of its own where the config says the embeddings are not tied (transformers 5 ties T5's and mT5's
    whatever their config says; the checkpoints of T0 and mT0 have two matrices)."""
    import torch

    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and embeddings is not None and head.weight is embeddings.weight:
        head.weight = torch.nn.Parameter(embeddings.weight.detach().clone())


def default_seq_len(config: dict[str, Any]) -> int:
    """DEFAULT_SEQ_LEN, capped by the model's maximum positions."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        limit = config.get(key)
        if isinstance(limit, int) and limit > 0:
            return min(DEFAULT_SEQ_LEN, limit)
    return SEQ_LEN_WITHOUT_POSITIONS


def vocab_size(config: dict[str, Any]) -> int:
    size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if not isinstance(size, int) or size < 1:
        raise UserError("the model's config gives no vocab_size to make token ids from")
    return size


def input_function(config: dict[str, Any]) -> Callable[..., Any]:
    """example_input(batch_size, seq_len): token ids and the same ids as labels (the model's own loss);
    seq2seq models get target sequences of the same length."""
    import torch

    vocab = vocab_size(config)
    default = default_seq_len(config)

    def example_input(batch_size: int, seq_len: int | None = None) -> dict[str, Any]:
        ids = torch.randint(0, vocab, (batch_size, seq_len or default))
        return {"input_ids": ids, "labels": ids.clone()}
    return example_input


def model_loss(output: Any, inputs: Any) -> Any:
    """The loss the model computed from `labels` (a transformers ModelOutput's `loss`)."""
    return output.loss
