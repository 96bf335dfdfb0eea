"""Money: the training job's length, cloud rental per offer (on demand and spot), and owning the card
(purchase plus electricity) with the break-even point against renting. Seconds, USD, watts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from advisor.errors import UserError
from advisor.hardware.specs import CloudOffer, GPUSpec
from advisor.limits import MAX_EPOCHS, MAX_JOB_SAMPLES

SECONDS_PER_HOUR = 3600.0
DEFAULT_SAMPLES = 1_000_000
"""The job when neither the command line nor the model file (TRAIN_SAMPLES) gives one: one epoch of a
million samples, a round figure to compare devices by; the output says it is the default."""


@dataclass(frozen=True)
class Job:
    """How much training: `samples` x `epochs`, or a number of optimizer `steps`. A job beyond
    MAX_JOB_SAMPLES or MAX_EPOCHS is a typo, refused in one sentence (UserError)."""

    samples: int | None = None
    epochs: float | None = None
    steps: int | None = None
    origin: str = "command line"
    """Where it came from: "command line", "model file (TRAIN_SAMPLES)" or "default"."""

    def __post_init__(self) -> None:
        assert (self.steps is None) != (self.samples is None), "a job is samples x epochs or steps"
        assert self.steps is None or self.steps > 0
        assert self.samples is None or (self.samples > 0 and self.epochs is not None and self.epochs > 0)
        for name, value, limit in (("samples", self.samples, MAX_JOB_SAMPLES), ("steps", self.steps, MAX_JOB_SAMPLES),
                                   ("epochs", self.epochs, MAX_EPOCHS)):
            if value is not None and not (math.isfinite(value) and value <= limit):
                raise UserError(f"{name} must be at most {limit:.0e} (the job is {value:.3g} {name}): "
                                "is it a typo?")

    @classmethod
    def over_samples(cls, samples: int | None, epochs: float, train_samples: int | None) -> Job:
        """`samples` x `epochs` as given, else the model file's TRAIN_SAMPLES, else DEFAULT_SAMPLES;
        the origin says which."""
        if samples is not None:
            return cls(samples=samples, epochs=epochs)
        if train_samples is not None:
            return cls(samples=train_samples, epochs=epochs, origin="model file's TRAIN_SAMPLES")
        return cls(samples=DEFAULT_SAMPLES, epochs=epochs, origin="default: the model file has no TRAIN_SAMPLES")

    def steps_for(self, batch_size: int) -> int:
        """Optimizer steps at `batch_size` samples per step (the last partial batch counts as a step).

        # 1,000 samples x 2 epochs at batch 64: ceil(2000 / 64) = 32 steps
        """
        if self.steps is not None:
            return self.steps
        assert self.samples is not None and self.epochs is not None
        return math.ceil(self.samples * self.epochs / batch_size)

    def describe(self, batch_size: int, unit: str) -> str:
        if self.steps is not None:
            return f"{self.steps:,} steps of {batch_size} {unit} ({self.origin})"
        epochs = f"{self.epochs:g} epoch{'s' if self.epochs != 1 else ''}"
        return f"{self.samples:,} {unit} x {epochs} = {self.steps_for(batch_size):,} steps of {batch_size} ({self.origin})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CloudCost:
    """The job rented from one offer: `instances` whole instances of `gpus_per_instance` GPUs for the
    job's hours. Prices per instance-hour (`usd_per_hour`, `spot_usd_per_hour`, PRODUCT.md) and per
    GPU-hour as the database gives them. A job on fewer GPUs than an instance holds pays for all of it
    (nobody rents one GPU of an 8-GPU node), so such offers are listed, never the cheapest for it
    (DeviceEstimate.cheapest)."""

    provider: str
    instance: str
    region: str
    gpus_per_instance: int
    instances: int
    usd_per_hour: float
    spot_usd_per_hour: float | None
    usd_per_gpu_hour: float
    spot_usd_per_gpu_hour: float | None
    cost_usd: float
    spot_cost_usd: float | None
    source: str
    price_date: str

    @property
    def gpus(self) -> int:
        """GPUs rented (and paid for)."""
        return self.instances * self.gpus_per_instance

    def rate(self, spot: bool = False) -> float | None:
        """USD per hour of everything rented (every instance), on demand or at the spot price (None
        where the offer has none)."""
        per_instance = self.spot_usd_per_hour if spot else self.usd_per_hour
        return None if per_instance is None else per_instance * self.instances

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Ownership:
    """Buying the card: its price, electricity for the job at its board power, and when buying pays
    off against the cheapest on-demand rental of the same GPU."""

    purchase_usd: float
    power_watts: float | None
    electricity_usd_per_kwh: float
    electricity_usd: float | None
    """Electricity of the job: board power x job hours x price (None without a power figure)."""
    total_usd: float
    """Purchase plus the job's electricity."""
    break_even_hours: float | None
    """Training hours after which owning costs less than renting at the cheapest on-demand rate:
    purchase / (rent per hour - electricity per hour). None without an offer, or where electricity
    costs more per hour than renting."""
    break_even_jobs: float | None
    """break_even_hours in runs of this job."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def instances_for(offer: CloudOffer, gpus: int) -> int | None:
    """Whole instances of `offer` that hold `gpus` GPUs: one where it holds that many or more, several
    where its size divides `gpus` and a network links them, else None (it cannot run the job)."""
    if offer.gpus_per_instance >= gpus:
        return 1
    if gpus % offer.gpus_per_instance == 0 and offer.network is not None:
        return gpus // offer.gpus_per_instance
    return None


def cloud_costs(offers: Sequence[CloudOffer], hours: float, gpus: int = 1) -> list[CloudCost]:
    """The job of `gpus` GPUs on each offer that can hold it, whole instances rented for `hours`,
    cheapest on demand first.

    # 10 h at 2.00 USD/GPU-hour on demand, 0.80 spot, 1 GPU: 20.00 USD and 8.00 USD; on an 8-GPU
    # instance at the same rates: 8 x 20.00 = 160.00 USD and 64.00 USD
    # 16 GPUs on 8-GPU instances with a network: 2 instances x 8 x 2.00 x 10 h = 320.00 USD
    """
    costs = []
    for o in offers:
        count = instances_for(o, gpus)
        if count is None:
            continue
        per_instance = o.usd_per_gpu_hour * o.gpus_per_instance
        spot = None if o.spot_usd_per_gpu_hour is None else o.spot_usd_per_gpu_hour * o.gpus_per_instance
        costs.append(CloudCost(o.provider, o.instance, o.region, o.gpus_per_instance, count, per_instance, spot,
                               o.usd_per_gpu_hour, o.spot_usd_per_gpu_hour, hours * per_instance * count,
                               None if spot is None else hours * spot * count, o.source, o.date.isoformat()))
    return sorted(costs, key=lambda c: (c.cost_usd, c.provider, c.instance))


def electricity_usd(power_watts: float, hours: float, usd_per_kwh: float) -> float:
    """# 450 W for 10 h at 0.17 USD/kWh: 0.45 kW x 10 h x 0.17 = 0.765 USD"""
    return power_watts / 1000.0 * hours * usd_per_kwh


def ownership(gpu: GPUSpec, hours: float, usd_per_kwh: float, cheapest_rent_usd_per_hour: float | None,
              cards: int = 1) -> Ownership | None:
    """Owning `cards` of `gpu` for a job of `hours` (against renting as many at
    `cheapest_rent_usd_per_hour` in all); None when the database has no price for it."""
    if gpu.purchase_usd is None:
        return None
    purchase = gpu.purchase_usd * cards
    power = None if gpu.tdp_watts is None else gpu.tdp_watts * cards
    electricity = None if power is None else electricity_usd(power, hours, usd_per_kwh)
    break_even = None
    if cheapest_rent_usd_per_hour is not None:
        per_hour = electricity_usd(power, 1.0, usd_per_kwh) if power is not None else 0.0
        if cheapest_rent_usd_per_hour > per_hour:
            break_even = purchase / (cheapest_rent_usd_per_hour - per_hour)
    return Ownership(purchase, power, usd_per_kwh, electricity, purchase + (electricity or 0.0), break_even,
                     None if break_even is None or hours <= 0 else break_even / hours)


def pareto_front(points: Sequence[tuple[str, float, float]]) -> list[str]:
    """Ids of the points no other point beats on both axes (time, cost): lower is better on each.

    # (a, 1, 9), (b, 2, 5), (c, 3, 6), (d, 4, 1): c is dominated by b; the front is a, b, d
    """
    front = []
    for name, time, cost in points:
        dominated = any(t <= time and c <= cost and (t < time or c < cost) for _, t, c in points)
        if not dominated:
            front.append(name)
    return front
