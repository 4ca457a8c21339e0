"""The residents by key, with the indexes the planner and the books look them up by."""

from __future__ import annotations

from gpugate.core.residents import Resident, ResidentKey


class ResidentTable(dict[ResidentKey, Resident]):
    """The residents by key, indexed by GPU and by model as entries are set and removed.

    Each index keeps the table's own order, so a GPU's residents come out as a scan of
    the whole table would give them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.by_gpu: dict[int, dict[ResidentKey, Resident]] = {}
        self.by_model: dict[tuple[int, str, str], dict[ResidentKey, Resident]] = {}
        self.by_whole: dict[ResidentKey, dict[ResidentKey, Resident]] = {}
        """The parts of each model split across GPUs."""

    def __setitem__(self, key: ResidentKey, resident: Resident) -> None:
        old = self.get(key)
        super().__setitem__(key, resident)
        if old is not None and old.gpu != resident.gpu:
            self._reindex()
            return
        self.by_gpu.setdefault(resident.gpu, {})[key] = resident
        self.by_model.setdefault((resident.gpu, key.consumer, key.model), {})[key] = resident
        if key.part is not None:
            self.by_whole.setdefault(key.whole, {})[key] = resident

    def __delitem__(self, key: ResidentKey) -> None:
        resident = self[key]
        super().__delitem__(key)
        self._unindex(key, resident)

    def pop(self, key: ResidentKey, *default: Resident | None) -> Resident | None:  # type: ignore[override]
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        resident = super().pop(key)
        self._unindex(key, resident)
        return resident

    def on_gpu(self, gpu: int) -> list[Resident]:
        return list(self.by_gpu.get(gpu, {}).values())

    def same_model(self, gpu: int, consumer: str, model: str) -> list[Resident]:
        return list(self.by_model.get((gpu, consumer, model), {}).values())

    def parts_of(self, whole: ResidentKey) -> list[Resident]:
        return list(self.by_whole.get(whole, {}).values())

    def _unindex(self, key: ResidentKey, resident: Resident) -> None:
        indexes: list[tuple[dict, object]] = [  # type: ignore[type-arg]
            (self.by_gpu, resident.gpu),
            (self.by_model, (resident.gpu, *key[:2])),
        ]
        if key.part is not None:
            indexes.append((self.by_whole, key.whole))
        for index, at in indexes:
            rows = index[at]
            del rows[key]
            if not rows:
                del index[at]

    def _reindex(self) -> None:
        self.by_gpu, self.by_model, self.by_whole = {}, {}, {}
        for key, resident in self.items():
            self.by_gpu.setdefault(resident.gpu, {})[key] = resident
            self.by_model.setdefault((resident.gpu, key.consumer, key.model), {})[key] = resident
            if key.part is not None:
                self.by_whole.setdefault(key.whole, {})[key] = resident
