"""The simulated GPU host: device state, fake NVML library, fake runtimes, scenarios.

Nothing outside `gpugate_sim` imports from here; the gate sees the simulated host only
through the fake `libnvidia-ml.so.1` and the runtimes' HTTP APIs, exactly as a real one.
"""
