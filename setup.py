"""The package's metadata is in pyproject.toml; this file adds the one compiled module, optional: a machine
without a C compiler installs the tool without it and runs the same code in Python
(advisor/memory/allocator.py, NATIVE)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gpu_advisor_allocator", ["native/gpu_advisor_allocator.c"], optional=True)])
