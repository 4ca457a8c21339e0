"""The gate: the single owner of live state, running the core's decisions as tasks."""
