"""Ollama: its parts (`adapter.py`, `upstream.py`) and its reading of requests as its Go
server reads them."""
