"""The order whisper-server's cpp-httplib 0.20 writes an answer's headers in: its `Headers`,
a libstdc++ `std::unordered_multimap` hashed by `case_ignore::hash`, iterated in bucket
order (httplib.py's `answer_head` for the 0.20 dialect)."""

from __future__ import annotations

import functools

import attrs

FAST_BUCKETS = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
PRIMES = (
    17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 103, 109, 113,
    127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293, 313, 337, 359,
)  # fmt: skip
HASH_MASK = (2**64 - 1) >> 6


def _case_ignore_hash(key: str) -> int:
    """httplib 0.20 `case_ignore::hash`: h = ((SIZE_MAX >> 6) & h * 33) ^ lower(c)."""
    h = 0
    for c in key.lower().encode("latin-1"):
        h = (HASH_MASK & (h * 33)) ^ c
    return h


@attrs.define(slots=True)
class _HeaderTable:
    """httplib 0.20's `Headers`, a libstdc++ `unordered_multimap`, in its iteration order.

    libstdc++ keeps one singly linked list with each bucket's nodes together: a node goes
    before an equal key's first node, else at the front of its bucket, else at the front of
    the list; growth (prime bucket counts, load factor 1) relinks the nodes in list order
    (bits/hashtable.h `_M_insert_multi_node`, `_M_rehash_aux`; hashtable_c++0x.cc).
    """

    buckets: int = 1
    next_resize: int = 0
    nodes: list[tuple[str, str]] = attrs.Factory(list)

    @classmethod
    def of(cls, items: list[tuple[str, str]]) -> _HeaderTable:
        """As the range constructor builds it (sized for `items` first)."""
        table = cls()
        table.buckets = table._next_buckets(len(items))
        for name, value in items:
            table.add(name, value)
        return table

    def _next_buckets(self, n: int) -> int:
        if n < len(FAST_BUCKETS):
            result = 1 if n == 0 else FAST_BUCKETS[n]
        else:
            result = next(p for p in PRIMES if p >= n)
        self.next_resize = result
        return result

    def _bucket(self, name: str) -> int:
        return _case_ignore_hash(name) % self.buckets

    def _place(self, nodes: list[tuple[str, str]], node: tuple[str, str]) -> None:
        bucket = self._bucket(node[0])
        for at, (name, _) in enumerate(nodes):
            if self._bucket(name) == bucket:
                nodes.insert(at, node)
                return
        nodes.insert(0, node)

    def _rehash(self, buckets: int) -> None:
        self.buckets = buckets
        relinked: list[tuple[str, str]] = []
        previous: tuple[str, str] | None = None
        for node in self.nodes:
            if previous is not None and self._bucket(previous[0]) == self._bucket(node[0]):
                relinked.insert(relinked.index(previous) + 1, node)
            else:
                self._place(relinked, node)
            previous = node
        self.nodes = relinked

    def add(self, name: str, value: str) -> None:
        """`emplace`: grow when needed, then link the node."""
        count = len(self.nodes) + 1
        if count > self.next_resize:
            least = max(count, 0 if self.next_resize else 11)
            if least >= self.buckets:
                self._rehash(self._next_buckets(max(least + 1, self.buckets * 2)))
            else:
                self.next_resize = self.buckets
        node = (name, value)
        for at, (key, _) in enumerate(self.nodes):
            if key.lower() == name.lower():
                self.nodes.insert(at, node)
                return
        self._place(self.nodes, node)


@functools.lru_cache(maxsize=256)
def table_order(base: tuple[str, ...], added: tuple[str, ...]) -> tuple[int, ...]:
    """Where each header (`base` built at once, then `added` one by one) comes out of 0.20's
    table: it depends only on the names, so it is worked out once per set of names."""
    table = _HeaderTable.of([(name, str(index)) for index, name in enumerate(base)])
    for index, name in enumerate(added, start=len(base)):
        table.add(name, str(index))
    return tuple(int(value) for _, value in table.nodes)
