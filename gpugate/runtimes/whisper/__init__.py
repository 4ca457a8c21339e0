"""whisper.cpp's whisper-server: its adapter (`adapter.py`)."""
