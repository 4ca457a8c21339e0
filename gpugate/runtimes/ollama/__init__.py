"""Ollama: its adapter (`adapter.py`) and its reading of requests as its Go server reads them."""
