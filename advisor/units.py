"""Unit conversions from the data files' units (named in their keys) to SI units used in code."""

GIB = 2**30
"""Bytes in one GiB. GPU vendors' "GB" of device memory are binary: an "80 GB" A100 reports
81,920 MiB and a "16 GB" T4 16,384 MiB (cloud catalogs K-AWS, K-GCP), so `memory_gb` * GIB."""

GB = 1e9
"""Bytes in one decimal GB: bandwidths (`bandwidth_gbps`, `nvlink_gbps`) are decimal GB/s."""

MB_CACHE = 2**20
"""Bytes in one MB of on-chip cache (`l2_cache_mb`), binary as vendors use it."""

TERA = 1e12
"""FLOP/s in one TFLOP/s (`peak_tflops`)."""

MHZ = 1e6
"""Hz in one MHz (`boost_clock_mhz`)."""

MIB = 2**20
"""Bytes in one MiB (`cuda_context_mib`, `cublas_workspace_mib`)."""
