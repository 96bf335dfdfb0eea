"""What this machine has: CPU (cpu), NVIDIA GPUs through NVML (nvml), both together (local).

The probe layer never imports UI code.
"""
