"""The per-GPU ticket queue: jobs their runtime already runs first, then highest class first,
then arrival; bounded per consumer."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from gpugate.core.tickets import Ticket


class TicketQueue:
    """Waiting tickets of one GPU in service order."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int, float, int]] = []
        self._tickets: list[Ticket] = []
        self._per_consumer: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._tickets)

    def __iter__(self) -> Iterator[Ticket]:
        return iter(list(self._tickets))

    def add(self, ticket: Ticket) -> int:
        """Insert in order; returns its position (0 is the head)."""
        key = ticket.order()
        position = bisect.bisect(self._keys, key)
        self._keys.insert(position, key)
        self._tickets.insert(position, ticket)
        consumer = ticket.demand.consumer
        self._per_consumer[consumer] = self._per_consumer.get(consumer, 0) + 1
        return position

    def remove(self, ticket: Ticket) -> None:
        position = bisect.bisect_left(self._keys, ticket.order())
        if position >= len(self._tickets) or self._tickets[position] is not ticket:
            raise KeyError(ticket.id)
        del self._keys[position]
        del self._tickets[position]
        consumer = ticket.demand.consumer
        self._per_consumer[consumer] -= 1
        if not self._per_consumer[consumer]:
            del self._per_consumer[consumer]

    def waiting_for(self, consumer: str) -> int:
        return self._per_consumer.get(consumer, 0)

    def would_be_last(self, ticket: Ticket) -> bool:
        return not self._keys or ticket.order() > self._keys[-1]
