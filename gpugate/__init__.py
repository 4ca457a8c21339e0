"""gpugate: admit every GPU model load under a VRAM lease from a live NVML budget."""

__version__ = "0.1.0"
