"""Hardware and price database: typed records (specs), YAML loading and validation (loader)."""

from advisor.hardware.loader import HwdbError, load_hwdb
from advisor.hardware.specs import CloudOffer, GPUSpec, HardwareDB, PeakThroughput

__all__ = ["CloudOffer", "GPUSpec", "HardwareDB", "HwdbError", "PeakThroughput", "load_hwdb"]
