"""vLLM's OpenAI-compatible server (`vllm serve`) with sleep mode: eviction puts it to sleep,
a request that needs it wakes it (adapter.py, sleep.py)."""
