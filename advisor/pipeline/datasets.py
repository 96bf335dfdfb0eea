"""The training samples whose preparation is measured: the model file's own `dataset()`, or a built-in
pipeline chosen from what `example_input(1)` looks like.

- Images (a float tensor of 1 x 3 x H x W): ImageNet-style JPEG files read and decoded with Pillow, then
  RandomResizedCrop to H x W, a random horizontal flip, conversion to a float tensor and normalisation:
  torchvision's classic `ImageFolder` + `RandomResizedCrop` / `RandomHorizontalFlip` / `ToTensor` /
  `Normalize` recipe on its PIL path, written here so that torchvision is not needed. The JPEGs are made
  on this machine (IMAGES of them, seeded): natural-image-like content at ImageNet's typical size, so
  that decoding costs what decoding a photograph costs.
- Tokens (an integer tensor of 1 x L, or a dict holding one as `input_ids`): pre-tokenized text, a slice
  of L + 1 tokens read from a token file on disk (np.memmap), as nanoGPT and LitGPT read theirs.
- Anything else: the example's own tensors indexed in memory (no preparation to speak of).
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from advisor.atomic import write_atomically
from advisor.errors import UserError
from advisor.profile.user_code import user_code

IMAGES = 48
"""Built-in JPEGs made once into the cache (a DataLoader run cycles over them)."""

IMAGE_SIZE = (500, 375)
"""Width x height of the built-in JPEGs: ImageNet's most common training size (its mean is about 400 x
350 pixels, about 110 KB per file)."""

JPEG_QUALITY = 90

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

TOKENS_IN_FILE = 2**22
"""Tokens in the built-in token file (uint16, 8 MiB)."""

IMAGE_VERSION = 2
"""Bumped when the built-in images change: their folder name carries it."""


@dataclass(frozen=True)
class Pipeline:
    """A dataset to measure, and what it is. `kind`: "file" (the model file's dataset()), "images",
    "tokens" or "tensors" (built in); `describe` says it in a few words for the output."""

    kind: str
    describe: str
    make: Callable[[], torch.utils.data.Dataset]
    read_bytes_per_sample: float = 0.0
    """Bytes read from storage per sample, where known (the built-in JPEGs and token slices)."""


def pipeline_for(dataset: Callable[[], Any] | None, example_input: Callable[[int], Any], source: str,
                 cache: Path) -> Pipeline:
    """The model file's `dataset()` when it has one, else the built-in pipeline its inputs call for,
    with its files made under `cache` (the user cache's pipeline folder)."""
    if dataset is not None:
        return Pipeline("file", f"{source}: dataset()", lambda: _file_dataset(dataset, source))
    with user_code("example_input(1)", source):
        sample = example_input(1)
    images = _image_shape(sample)
    if images is not None:
        height, width = images
        folder = built_in_images(cache)
        size = sum(p.stat().st_size for p in _image_files(folder)) / IMAGES
        return Pipeline("images", f"JPEG decode + RandomResizedCrop({height}x{width}) + flip + normalize "
                                  f"(built in; {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} JPEGs of {size / 1e3:.0f} KB)",
                        lambda: JPEGFolder(folder, (height, width)), size)
    tokens = _token_length(sample)
    if tokens is not None:
        path = built_in_tokens(cache)
        return Pipeline("tokens", f"pre-tokenized text, {tokens} tokens per sample read from a token file "
                                  "(built in)", lambda: TokenFile(path, tokens), 2 * (tokens + 1))
    return Pipeline("tensors", "the example's tensors, in memory (built in)", lambda: InMemory(sample))


def _file_dataset(dataset: Callable[[], Any], source: str) -> torch.utils.data.Dataset:
    with user_code("dataset()", source):
        made = dataset()
    if not isinstance(made, torch.utils.data.Dataset) or not hasattr(made, "__getitem__"):
        raise UserError(f"{source}: dataset() returned {type(made).__name__}, not a map-style "
                        "torch.utils.data.Dataset (one with __getitem__ and __len__)")
    try:
        length = len(made)
    except TypeError:
        raise UserError(f"{source}: dataset() returned a dataset without __len__; the input pipeline is "
                        "measured on a map-style dataset") from None
    if length < 1:
        raise UserError(f"{source}: dataset() returned an empty dataset")
    return made


def _image_shape(sample: Any) -> tuple[int, int] | None:
    """(H, W) of a 1 x 3 x H x W floating-point example, else None."""
    if isinstance(sample, torch.Tensor) and sample.dim() == 4 and sample.shape[1] == 3 \
            and sample.is_floating_point() and min(sample.shape[2:]) >= 8:
        return int(sample.shape[2]), int(sample.shape[3])
    return None


def _token_length(sample: Any) -> int | None:
    """L of a 1 x L integer example (or of its `input_ids`), else None."""
    if isinstance(sample, dict):
        sample = sample.get("input_ids")
    if isinstance(sample, torch.Tensor) and sample.dim() == 2 and not sample.is_floating_point() \
            and sample.dtype != torch.bool:
        return int(sample.shape[1])
    return None


# ---------------------------------------------------------------- built-in images

def built_in_images(cache: Path) -> Path:
    """The folder of built-in JPEGs under `cache`, made on first use (seeded: the same files everywhere)."""
    folder = cache / f"images-v{IMAGE_VERSION}"
    if len(_image_files(folder)) == IMAGES:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(IMAGES):
        path = folder / f"{index:03d}.jpg"
        if not path.is_file():
            write_atomically(path, _photograph_like(index))
    return folder


def _image_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("[0-9][0-9][0-9].jpg")) if folder.is_dir() else []


def _photograph_like(seed: int) -> bytes:
    """A JPEG with a photograph's statistics (smooth regions, shapes, texture, sensor noise) and ImageNet's
    typical file size (about 110 KB at 500 x 375), so that it decodes as one does."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    width, height = IMAGE_SIZE
    picture = np.full((height, width, 3), 128.0, dtype=np.float32)
    for cell, amplitude in ((75, 90.0), (19, 40.0), (5, 25.0), (2, 60.0)):  # shapes down to fine texture
        coarse = rng.uniform(-amplitude, amplitude, (height // cell + 2, width // cell + 2)).astype(np.float32)
        smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))
        picture += smooth[..., None] * rng.uniform(0.6, 1.4, 3).astype(np.float32)
    picture += rng.normal(0, 12, (height, width, 1)) + rng.normal(0, 3, picture.shape)  # luma and chroma noise
    image = Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8), "RGB")
    out = io.BytesIO()
    image.save(out, "JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


class JPEGFolder(torch.utils.data.Dataset):
    """The built-in image pipeline: read, decode (Pillow), RandomResizedCrop, flip, to a normalised
    3 x H x W float tensor, and the class label."""

    def __init__(self, folder: Path, size: tuple[int, int]) -> None:
        self.files = _image_files(folder)
        self.size = size
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        with open(self.files[index], "rb") as file:
            image = Image.open(io.BytesIO(file.read())).convert("RGB")
        top, left, height, width = _random_resized_crop(image.height, image.width)
        height_out, width_out = self.size
        image = image.resize((width_out, height_out), Image.BILINEAR, box=(left, top, left + width, top + height))
        if random.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        tensor = pixels.view(height_out, width_out, 3).permute(2, 0, 1).float().div_(255)
        return (tensor - self.mean) / self.std, index % 1000


def _random_resized_crop(height: int, width: int, scale: tuple[float, float] = (0.08, 1.0),
                         ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: (top, left, height, width) of a random crop."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    side = min(height, width)  # the central crop torchvision falls back to
    return (height - side) // 2, (width - side) // 2, side, side


# ---------------------------------------------------------------- built-in tokens

def built_in_tokens(cache: Path) -> Path:
    """The built-in token file (uint16 tokens below 50,257, seeded), made on first use."""
    path = cache / "tokens-v1.u16"
    if not path.is_file() or path.stat().st_size != 2 * TOKENS_IN_FILE:
        path.parent.mkdir(parents=True, exist_ok=True)
        tokens = np.random.default_rng(0).integers(0, 50_257, TOKENS_IN_FILE, dtype=np.uint16)
        write_atomically(path, tokens.tobytes())
    return path


class TokenFile(torch.utils.data.Dataset):
    """Samples of `length` tokens (and the next token for each) at random offsets of a token file."""

    def __init__(self, path: Path, length: int) -> None:
        self.path = path
        self.length = length
        self.tokens: np.memmap | None = None  # opened in the process that reads (each worker its own)

    def __len__(self) -> int:
        return max(1, TOKENS_IN_FILE // (self.length + 1))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        start = random.randrange(0, TOKENS_IN_FILE - self.length - 1)
        chunk = torch.from_numpy(self.tokens[start:start + self.length + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class InMemory(torch.utils.data.Dataset):
    """The example's sample (batch of one) returned again: indexing tensors held in memory."""

    def __init__(self, sample: Any) -> None:
        self.sample = sample

    def __len__(self) -> int:
        return 1024

    def __getitem__(self, index: int) -> Any:
        return _first(self.sample)


def _first(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value[0].clone()
    if isinstance(value, dict):
        return {key: _first(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_first(item) for item in value)
    return value
