"""`make bench`: the gate against a direct connection and a bare aiohttp pass-through."""
