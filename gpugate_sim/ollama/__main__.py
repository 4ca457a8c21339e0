"""`python -m gpugate_sim.ollama serve --host-file HOST.yaml --state-dir DIR`.

Serves the `ollama:` part of HOST.yaml against the simulated GPU in DIR, prints
`READY http://HOST:PORT` (flushed) once listening and preloaded, and runs until SIGTERM
or SIGINT, when it kills its runner children and exits 0.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gpugate_sim.hostpart import HostFileError, host_file_parser, read_part, serve_part
from gpugate_sim.serving import EXIT_USAGE


async def _serve(host_file: Path, state_dir: Path, listen: str | None) -> int:
    from gpugate_sim.ollama.server import PreloadError, SimOllama, split_listen

    try:
        spec, gpu = read_part(host_file, state_dir, "ollama")
    except HostFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        host, port = split_listen(listen or spec.listen)
        sim = SimOllama(spec, gpu)
    except ValueError as exc:
        print(f"error: {host_file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return await serve_part(sim, host, port, host_file, (OSError, PreloadError))


def main(argv: list[str] | None = None) -> int:
    parser, _ = host_file_parser("Ollama", "ollama")
    args = parser.parse_args(argv)
    return asyncio.run(_serve(args.host_file, args.state_dir, args.listen))


if __name__ == "__main__":
    sys.exit(main())
