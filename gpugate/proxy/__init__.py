"""aiohttp listeners on each runtime's public port: admit, forward (streamed), release."""
