"""ComfyUI: its parts (`adapter.py`, `jobs.py`, `vetting.py`), its prompt graph, validation
and origin check."""
