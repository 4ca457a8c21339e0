"""The simulated GPU host: device state, fake NVML library, fake runtimes, scenarios.

A package of its own beside gpugate, in the same distribution: `gpugate demo` and `gpugate
sim` run it, and nothing else of gpugate imports it; it takes from gpugate only
gpugate.core.units. The gate sees the simulated host only through the fake
`libnvidia-ml.so.1` and the runtimes' HTTP APIs, exactly as a real one.
"""
