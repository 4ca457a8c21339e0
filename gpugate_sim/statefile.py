"""The simulated host's state file: its data, its text form, and its parser.

File format (one directive per line)::

    driver 550.54.15
    cuda 12040
    init_error 0                       # nvmlInit fails with this NVML code when non-zero
    check_pids 1                       # 0: keep allocations of PIDs that do not exist
    device <index> <total> <reserved> <base_used> <uuid> <name ...>
    util <gpu> <gpu %> <memory %>      # nvmlDeviceGetUtilizationRates (default 0 0)
    power <gpu> <milliwatts>           # nvmlDeviceGetPowerUsage (default 0)
    proc <gpu> <C|G|CG> <pid> <bytes|-1> <name ...>
    fail <gpu|*> <symbol> <code>       # that NVML symbol returns that code
    stall <gpu|*> <symbol> <ms>        # that NVML symbol blocks that long, then answers
    lost <gpu|*>                       # GPU_IS_LOST on that device until NVML is re-initialised

Words are separated by blanks. A line whose first word starts with `#` is a comment, and
`#` starts a trailing comment on every directive except `device` and `proc`, whose
name runs verbatim to the end of the line (so a name may contain `#`). Device indexes
run 0, 1, 2, ...; `util`, `power`, `proc`, `fail`, `stall` and `lost` name a device declared
above them. Limits (NVML's buffer sizes): driver 79 bytes, device name and uuid 95, process
name 255, pid at least 1, error codes at least 1, stalls 1 ms to one hour, 16 devices. This
parser and the C library's accept exactly the same files.

A device's v2 `used` is `base_used` plus the bytes of its live processes; `free` is
`total - reserved - used`. `-1` bytes is NVML_VALUE_NOT_AVAILABLE (pynvml reports None).
"""

from __future__ import annotations

import attrs

NOT_AVAILABLE = -1
MAX_DEVICES = 16
U64 = 2**64 - 1
MAX_DRIVER_LEN = 79
MAX_DEVICE_STR_LEN = 95
MAX_PROCESS_NAME_LEN = 255
MAX_SYMBOL_LEN = 127
MAX_STALL_MS = 3_600_000
PROCESS_KINDS = ("C", "G", "CG")


def _check_text(value: str, limit: int, what: str, *, blank_ok: bool = True) -> None:
    # One line of the state file holds each value: a newline would start a new directive.
    if any(ch in value for ch in "\r\n\0"):
        raise ValueError(f"{what} {value!r} contains a line break or NUL")
    if len(value.encode()) > limit:
        raise ValueError(f"{what} is longer than {limit} bytes: {value!r}")
    if not blank_ok and (not value.strip() or value != value.strip()):
        raise ValueError(f"{what} {value!r} must be non-empty without surrounding blanks")


def _device_text(instance: object, attribute: attrs.Attribute, value: str) -> None:
    _check_text(value, MAX_DEVICE_STR_LEN, f"device {attribute.name}", blank_ok=False)
    if attribute.name == "uuid" and len(value.split()) != 1:
        raise ValueError(f"device uuid {value!r} must be one word")


def _process_name(instance: object, attribute: attrs.Attribute, value: str) -> None:
    _check_text(value.strip(), MAX_PROCESS_NAME_LEN, "process name")


def _percent(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if not 0 <= value <= 100:
        raise ValueError(f"{attribute.name} must be 0..100, got {value}")


@attrs.frozen
class SimDevice:
    index: int = attrs.field(
        validator=attrs.validators.and_(attrs.validators.ge(0), attrs.validators.lt(MAX_DEVICES))
    )
    total: int = attrs.field(validator=attrs.validators.ge(0))
    reserved: int = attrs.field(validator=attrs.validators.ge(0))
    uuid: str = attrs.field(validator=_device_text)
    name: str = attrs.field(validator=_device_text)
    base_used: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    utilization: int = attrs.field(default=0, validator=_percent)
    """nvmlDeviceGetUtilizationRates().gpu, in percent."""
    memory_utilization: int = attrs.field(default=0, validator=_percent)
    """nvmlDeviceGetUtilizationRates().memory: memory controller busy, not occupancy."""
    power_mw: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """nvmlDeviceGetPowerUsage(), in milliwatts."""


@attrs.frozen
class SimProcess:
    gpu: int
    pid: int = attrs.field(validator=attrs.validators.ge(1))
    used: int = attrs.field(validator=attrs.validators.ge(NOT_AVAILABLE))
    """Bytes, or NOT_AVAILABLE (-1)."""
    kind: str = attrs.field(default="C", validator=attrs.validators.in_(PROCESS_KINDS))
    name: str = attrs.field(default="", validator=_process_name)


def _symbol(instance: object, attribute: attrs.Attribute, value: str) -> None:
    _check_text(value, MAX_SYMBOL_LEN, "symbol", blank_ok=False)
    if len(value.split()) != 1:
        raise ValueError(f"symbol {value!r} must be one word")


@attrs.frozen
class SimFailure:
    """An injected NVML error: `symbol` returns `code` (on one GPU, or all when gpu is None)."""

    symbol: str = attrs.field(validator=_symbol)
    code: int = attrs.field(validator=attrs.validators.ge(1))
    gpu: int | None = None


@attrs.frozen
class SimStall:
    """An injected hang: `symbol` blocks `milliseconds` before it answers."""

    symbol: str = attrs.field(validator=_symbol)
    milliseconds: int = attrs.field(
        validator=[attrs.validators.ge(1), attrs.validators.le(MAX_STALL_MS)]
    )
    gpu: int | None = None


@attrs.define
class HostState:
    """The parsed state file."""

    devices: list[SimDevice]
    processes: list[SimProcess] = attrs.field(factory=list)
    failures: list[SimFailure] = attrs.field(factory=list)
    stalls: list[SimStall] = attrs.field(factory=list)
    lost: list[int | None] = attrs.field(factory=list)
    """Devices that fell off the bus (None: every device)."""
    driver: str = "550.54.15"
    cuda: int = 12040
    init_error: int = 0
    check_pids: bool = True

    def device(self, gpu: int) -> SimDevice:
        for device in self.devices:
            if device.index == gpu:
                return device
        raise KeyError(f"no simulated GPU {gpu}")

    def used(self, gpu: int) -> int:
        """v2 `used`: base plus every live process's known bytes."""
        held = sum(p.used for p in self.processes if p.gpu == gpu and p.used > 0)
        return self.device(gpu).base_used + held

    def free(self, gpu: int) -> int:
        device = self.device(gpu)
        return max(0, device.total - device.reserved - self.used(gpu))

    def held_by(self, pid: int, gpu: int) -> int:
        return sum(p.used for p in self.processes if p.pid == pid and p.gpu == gpu and p.used > 0)

    def render(self) -> str:
        lines = [
            "# gpugate simulated GPU host; written by gpugate_sim.device",
            f"driver {self.driver}",
            f"cuda {self.cuda}",
            f"init_error {self.init_error}",
            f"check_pids {int(self.check_pids)}",
        ]
        for d in self.devices:
            lines.append(f"device {d.index} {d.total} {d.reserved} {d.base_used} {d.uuid} {d.name}")
            if d.utilization or d.memory_utilization:
                lines.append(f"util {d.index} {d.utilization} {d.memory_utilization}")
            if d.power_mw:
                lines.append(f"power {d.index} {d.power_mw}")
        for p in self.processes:
            lines.append(f"proc {p.gpu} {p.kind} {p.pid} {p.used} {p.name}".rstrip())
        for f in self.failures:
            gpu = "*" if f.gpu is None else str(f.gpu)
            lines.append(f"fail {gpu} {f.symbol} {f.code}")
        for stall in self.stalls:
            gpu = "*" if stall.gpu is None else str(stall.gpu)
            lines.append(f"stall {gpu} {stall.symbol} {stall.milliseconds}")
        for lost in self.lost:
            lines.append(f"lost {'*' if lost is None else lost}")
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> HostState:
        """Parse a state file; ValueError names the line and what is wrong with it."""
        state = cls(devices=[])
        for lineno, raw in enumerate(text.splitlines(), 1):
            try:
                _parse_line(state, raw)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"simulated GPU state line {lineno}: {exc}: {raw!r}") from None
        indexes = sorted(d.index for d in state.devices)
        if indexes != list(range(len(indexes))):
            raise ValueError(
                f"simulated GPU state: device indexes must run 0, 1, 2, ...: {indexes}"
            )
        return state


def _words(rest: str, count: int, usage: str) -> list[str]:
    words = rest.split()
    if len(words) != count:
        raise ValueError(f"expected {usage}")
    return words


def _count(word: str, what: str, *, maximum: int | None = None) -> int:
    # The C parser takes plain decimal digits only; so must this one.
    if not word.isascii() or not word.isdigit():
        raise ValueError(f"bad {what} {word!r}")
    value = int(word)
    if maximum is not None and value > maximum:
        raise ValueError(f"{what} {word!r} is above {maximum}")
    return value


def _declared_gpu(state: HostState, word: str, *, allow_any: bool = False) -> int | None:
    if allow_any and word == "*":
        return None
    gpu = _count(word, "GPU index", maximum=MAX_DEVICES - 1)
    if all(d.index != gpu for d in state.devices):
        raise ValueError(f"no device {gpu} is declared above this line")
    return gpu


def _update_device(state: HostState, gpu_word: str, **changes: int) -> None:
    gpu = _declared_gpu(state, gpu_word)
    state.devices = [attrs.evolve(d, **changes) if d.index == gpu else d for d in state.devices]


def _parse_line(state: HostState, raw: str) -> None:
    line = raw.strip(" \t\r")
    if not line or line.startswith("#"):
        return
    word, *tail = line.split(None, 1)
    rest = tail[0] if tail else ""
    if word == "device":
        parts = rest.split(None, 5)
        if len(parts) != 6:
            raise ValueError("expected device <index> <total> <reserved> <base_used> <uuid> <name>")
        index, total, reserved, base, uuid, name = parts
        gpu = _count(index, "GPU index", maximum=MAX_DEVICES - 1)
        if any(d.index == gpu for d in state.devices):
            raise ValueError(f"device {gpu} is declared twice")
        state.devices.append(
            SimDevice(
                gpu,
                _count(total, "total", maximum=U64),
                _count(reserved, "reserved", maximum=U64),
                uuid,
                name.rstrip(),
                _count(base, "base_used", maximum=U64),
            )
        )
        return
    if word == "proc":
        parts = rest.split(None, 4)
        if len(parts) < 4:
            raise ValueError("expected proc <gpu> <C|G|CG> <pid> <bytes|-1> [name]")
        gpu, kind, pid, used = parts[:4]
        name = parts[4].rstrip() if len(parts) > 4 else ""
        if kind not in PROCESS_KINDS:
            raise ValueError(f"kind must be C, G or CG, not {kind!r}")
        nbytes = NOT_AVAILABLE if used == "-1" else _count(used, "byte count", maximum=U64 - 1)
        state.processes.append(
            SimProcess(
                _declared_gpu(state, gpu), _count(pid, "pid", maximum=2**31 - 1), nbytes, kind, name
            )
        )
        return
    rest = rest.split("#", 1)[0]
    if word == "driver":
        _check_text(rest.strip(), MAX_DRIVER_LEN, "driver version", blank_ok=False)
        state.driver = rest.strip()
    elif word in ("cuda", "init_error", "check_pids"):
        (value,) = _words(rest, 1, f"{word} <number>")
        number = _count(value, word, maximum=1 if word == "check_pids" else 2**31 - 1)
        if word == "cuda":
            state.cuda = number
        elif word == "init_error":
            state.init_error = number
        else:
            state.check_pids = bool(number)
    elif word == "util":
        gpu, busy, memory = _words(rest, 3, "util <gpu> <gpu%> <memory%>")
        _update_device(
            state,
            gpu,
            utilization=_count(busy, "GPU %"),
            memory_utilization=_count(memory, "memory %"),
        )
    elif word == "power":
        gpu, milliwatts = _words(rest, 2, "power <gpu> <milliwatts>")
        _update_device(state, gpu, power_mw=_count(milliwatts, "milliwatts", maximum=2**32 - 1))
    elif word == "fail":
        gpu, symbol, code = _words(rest, 3, "fail <gpu|*> <symbol> <code>")
        state.failures.append(
            SimFailure(
                symbol,
                _count(code, "NVML error code", maximum=2**31 - 1),
                _declared_gpu(state, gpu, allow_any=True),
            )
        )
    elif word == "stall":
        gpu, symbol, milliseconds = _words(rest, 3, "stall <gpu|*> <symbol> <milliseconds>")
        state.stalls.append(
            SimStall(
                symbol,
                _count(milliseconds, "milliseconds", maximum=MAX_STALL_MS),
                _declared_gpu(state, gpu, allow_any=True),
            )
        )
    elif word == "lost":
        (gpu,) = _words(rest, 1, "lost <gpu|*>")
        state.lost.append(_declared_gpu(state, gpu, allow_any=True))
    else:
        raise ValueError(f"unknown directive {word!r}")
