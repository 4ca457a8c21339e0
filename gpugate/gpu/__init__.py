"""GPU observation: NVML device and process samples, and who owns each process."""
