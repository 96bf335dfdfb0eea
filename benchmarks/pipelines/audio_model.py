"""A speech-style model file with its own input pipeline (benchmarks/input_pipeline.py): each sample is
four seconds of 16 kHz audio made from a seeded signal, turned into an 80-band log-mel spectrogram with torch.stft,
with SpecAugment's time and frequency masks, as speech recognisers train."""

import math

import torch

SAMPLE_UNIT = "utterances"
BATCH_SIZE = 32
RATE = 16_000
MELS = 80
SECONDS = 4
FRAMES = 401  # 4 s at a 160-sample hop


def build_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv1d(MELS, 256, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv1d(256, 256, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool1d(1), torch.nn.Flatten(), torch.nn.Linear(256, 35))


def example_input(batch_size: int) -> torch.Tensor:
    return torch.randn(batch_size, MELS, FRAMES)


def _mel_matrix() -> torch.Tensor:
    """Triangular mel filters over a 400-point FFT's 201 bins."""
    def mel(hz: float) -> float:
        return 2595 * math.log10(1 + hz / 700)
    edges = torch.linspace(mel(0), mel(RATE / 2), MELS + 2)
    hz = 700 * (10 ** (edges / 2595) - 1)
    bins = torch.linspace(0, RATE / 2, 201)
    low, centre, high = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    return torch.clamp(torch.minimum((bins - low) / (centre - low), (high - bins) / (high - centre)), min=0)


class Utterances(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.mel = _mel_matrix()
        self.window = torch.hann_window(400)

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        t = torch.arange(SECONDS * RATE) / RATE
        pitch = 100 + 200 * torch.rand(1, generator=generator)
        wave = torch.sin(2 * math.pi * pitch * t * (1 + 0.1 * torch.sin(2 * math.pi * 3 * t)))
        wave = wave + 0.05 * torch.randn(SECONDS * RATE, generator=generator)
        spectrum = torch.stft(wave, 400, 160, window=self.window, return_complex=True).abs() ** 2
        features = torch.log(self.mel @ spectrum + 1e-6)
        features = (features - features.mean()) / (features.std() + 1e-5)
        for size, axis in ((27, 0), (40, 1)):  # SpecAugment: a frequency mask and a time mask
            start = int(torch.randint(0, features.shape[axis] - size, (1,), generator=generator))
            features.narrow(axis, start, size).zero_()
        return features, index % 35


def dataset() -> torch.utils.data.Dataset:
    return Utterances()
