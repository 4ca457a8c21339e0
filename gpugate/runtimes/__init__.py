"""One adapter per runtime family: which requests demand VRAM, how to rewrite them,
what is resident, how to unload."""
