"""The `gpugate` commands, one module each, and what only they use: the control API's
client (`control_client.py`), the tokens a command finds on this machine
(`local_token.py`) and the exit codes (`exits.py`)."""
