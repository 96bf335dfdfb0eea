"""The largest settings the tool accepts: past them a figure is a typo, refused in one sentence
before any work (every interface checks against these same limits)."""

MAX_BATCH_SIZE = 2**20
"""Largest batch (samples per step): far above any batch a GPU trains with (LLMs train with a few
thousand sequences per step), small enough that every tensor size stays a 64-bit integer."""

MAX_JOB_SAMPLES = 10**15
"""Largest job in samples or steps: a quadrillion, past the largest training sets (about 10^14 tokens)."""

MAX_EPOCHS = 10**6

MAX_USD = 1e12
"""Largest budget in USD."""

MAX_HOURS = 1e7
"""Largest deadline in hours (over a thousand years)."""

MAX_MEMORY_GB = 1e6
"""Largest memory filter in GB (`advisor gpus --min-memory-gb`)."""

MAX_CONTEXT_MIB = 2**20
"""1 TiB of CUDA context: any larger figure is a typo."""

MAX_TRACE_TIMEOUT_S = 7 * 24 * 3600.0
"""A week: a longer trace timeout is a typo (0 means no limit)."""

MAX_SEQ_LEN = 2**24
"""Longest sequence (tokens per sample): 16 M, past every context window trained today."""

MAX_JOB_TOKENS = 10**15
"""Largest job in tokens (the largest training sets are about 10^14)."""

MAX_LORA_RANK = 65_536
"""--lora: a rank above the widest layer of any model is a typo."""

MAX_WORKERS = 256
"""DataLoader workers per GPU (--workers)."""

MAX_VCPUS_PER_GPU = 1024.0
"""vCPUs per GPU of a host (--vcpus-per-gpu)."""

MAX_NUM_GPUS = 4096
"""GPUs of one job (--num-gpus): past the largest clusters a job is planned on here."""
