"""One package per runtime, each building its consumers' `Runtime`, the record of the
parts it has (runtime.py, parts.py): which requests demand VRAM and how to rewrite them,
what is resident, how to unload, how it is known to be well."""
