"""A simulated llama.cpp `llama-server` (the one PyPI's llama-cpp-python 0.3.36 carries).

    python -m gpugate_sim.llamaserver -m MODEL.gguf --host H --port P [--sim-...]
    python -m gpugate_sim.llamaserver --models-dir DIR [--models-max N] [--sim-...]

Single-model mode binds its port, then loads the model (from its GGUF header) into the
simulated GPU; router mode loads each model in a child process of its own. The HTTP
answers are the real server's. docs/runtimes/llamaserver.md lists what it models.
"""
