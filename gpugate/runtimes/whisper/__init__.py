"""whisper.cpp's whisper-server: its reading and its runtime (`adapter.py`)."""
