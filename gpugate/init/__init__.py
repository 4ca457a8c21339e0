"""`gpugate init`: read a GPU host and propose how to put the gate in front of it.

* `scan`: what the host shows: NVML's devices and the processes holding memory on them,
  every process's command line, environment, cgroup units and listening sockets from
  /proc (`proc`), and (for the units of what is recognised) `systemctl show` (`systemd`).
* `recognise`: a table of small rules (`rules`), one per runtime (Ollama, ComfyUI,
  whisper-server, llama-server, vLLM) and per external GPU user (Plex, Tdarr), applied to
  the scan; a command line read as its program and options (`cmdline`).
* `planning` decides the `plan`: names, the ports the gate takes and the loopback ports the
  runtimes move to (`addresses`), and each consumer's class, policy, envelope and control
  (`fronts`).
* `write`: the `consumers.yaml` text and one systemd drop-in per runtime unit; `moves`: the
  moves (the commands an operator runs, in order). Nothing is ever run or installed by init.

The command itself (its options, printing or writing what `write` renders) is
gpugate.commands.init.
"""
