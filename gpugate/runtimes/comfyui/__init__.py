"""ComfyUI: its adapter (`adapter.py`), its prompt graph, validation and origin check."""
