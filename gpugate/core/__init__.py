"""The decision core: pure, synchronous, no I/O and no clock reads (time is passed in)."""
