"""Rules of consumers.yaml that span several fields: each value is fine, the combination is not.

These run on a Config whose every value has been read; sections that could not be read are at
their defaults, so a rule here never reports a consequence of an error already reported.
"""

from __future__ import annotations

from gpugate.config.findings import Findings
from gpugate.config.model import Address, Config, Consumer, Residency
from gpugate.config.runtime_table import RuntimeTable
from gpugate.core.classes import ResidencyPolicy
from gpugate.core.units import format_duration, format_gib


def _at(findings: Findings, path: str) -> str:
    """`path`, with its line when the file has it: "consumers.ollama.listen (line 7)"."""
    line = findings.line_of(path)
    return path if line is None else f"{path} (line {line})"


def check_relations(config: Config, findings: Findings, runtimes: RuntimeTable) -> None:
    """Report every cross-field error and warning of `config` to `findings`; `runtimes`:
    the table the file was read with."""
    _check_budget(config, findings)
    _check_queue(config, findings)
    _check_gate(config, findings)
    _check_consumers(config, findings, runtimes)
    _check_external(config, findings)
    _check_identities(config, findings)


def _check_queue(config: Config, findings: Findings) -> None:
    """A grace a class's requests cannot outwait: each of them that finds only such a model
    to evict is refused DEADLINE_CANNOT_BE_MET at once."""
    queue = config.queue
    for settings in config.classes:
        label = settings.priority.label
        if queue.equal_class_grace >= settings.max_wait:
            findings.warn(
                "queue.equal_class_grace",
                f"{format_duration(queue.equal_class_grace)} is not shorter than class "
                f"{label}'s max_wait ({format_duration(settings.max_wait)}): "
                f"{'an' if label[0] in 'aeiou' else 'a'} {label} request that must evict an "
                f"idle {label} model is refused DEADLINE_CANNOT_BE_MET",
            )


def _check_budget(config: Config, findings: Findings) -> None:
    budget = config.budget
    if budget.reserve > budget.reserve_max:
        findings.report(
            "budget.reserve",
            f"reserve ({format_gib(budget.reserve)}) is larger than "
            f"reserve_max ({format_gib(budget.reserve_max)})",
        )
    if budget.sample_interval <= 0:
        findings.report("budget.sample_interval", "must be longer than 0s")
    elif budget.stale_after <= budget.sample_interval:
        findings.report(
            "budget.stale_after",
            f"must be longer than sample_interval ({format_duration(budget.sample_interval)}), "
            "or every sample would be stale before the next one arrives",
        )
    first: dict[int, str] = {}
    for index, gpu in enumerate(config.gpus):
        path = f"gpus[{index}]"
        if gpu.index in first:
            findings.report(
                f"{path}.index",
                f"GPU {gpu.index} is already listed at {_at(findings, first[gpu.index])}",
            )
        first.setdefault(gpu.index, path)
        if gpu.reserve is not None and gpu.reserve > budget.reserve_max:
            findings.report(
                f"{path}.reserve",
                f"reserve ({format_gib(gpu.reserve)}) is larger than "
                f"budget.reserve_max ({format_gib(budget.reserve_max)})",
            )


def _check_gate(config: Config, findings: Findings) -> None:
    if config.gate.max_lease_ttl < 1:
        # A lease's ttl is at least 1s (gpugate.control.leases): none could be asked for.
        findings.report("gate.max_lease_ttl", "must be at least 1s, the shortest ttl a lease has")


def _check_consumers(config: Config, findings: Findings, runtimes: RuntimeTable) -> None:
    control = config.gate.control
    listeners: dict[int, tuple[str, Address]] = {control.port: ("gate.control", control)}
    agent = config.gate.agent_check
    if agent is not None and agent.port:
        if agent.port in listeners:
            findings.report(
                "gate.agent_check",
                f"port {agent.port} is already used by {_at(findings, 'gate.control')}",
            )
        else:
            listeners[agent.port] = ("gate.agent_check", agent)
    for consumer in config.consumers:
        path = f"consumers.{consumer.name}.listen"
        taken = listeners.get(consumer.listen.port)
        if taken is None:
            listeners[consumer.listen.port] = (path, consumer.listen)
        else:
            findings.report(
                path,
                f"port {consumer.listen.port} is already used by {_at(findings, taken[0])}",
            )
    gpus = {gpu.index for gpu in config.gpus}
    check_gpus = bool(gpus) and not findings.has_errors_under("gpus")
    for consumer in config.consumers:
        path = f"consumers.{consumer.name}"
        upstream = consumer.upstream
        loop = listeners.get(upstream.port) if upstream.is_loopback else None
        if loop is not None and loop[1].reaches_loopback:
            findings.report(
                f"{path}.upstream",
                f"{upstream.url} is the gate's own listener ({loop[0]}); point it at the "
                "port the runtime itself listens on",
            )
        if not upstream.is_loopback:
            findings.warn(
                f"{path}.upstream",
                f"{upstream.host} is not a loopback address: clients could bypass the gate "
                "by talking to it directly",
            )
        if consumer.processes.empty:
            findings.warn(
                f"{path}.processes",
                "no units, commands or names: its VRAM will be counted as external 'other'",
            )
        _check_cards(consumer, path, findings, gpus if check_gpus else None)
        _check_residencies(consumer, path, findings)
        _check_runtime(consumer, path, findings, runtimes)
        _check_control(consumer, path, findings)
    if not config.consumers and not findings.has_errors_under("consumers"):
        findings.warn("consumers", "no consumers: the gate has nothing to front")


def _check_cards(
    consumer: Consumer, path: str, findings: Findings, listed: set[int] | None
) -> None:
    """`gpu` or `gpus`, each GPU once, each one the budget lists (when it lists any)."""
    if consumer.gpus and findings.line_of(f"{path}.gpu") is not None:
        findings.report(
            f"{path}.gpus",
            f"give gpu (one GPU) or gpus (several), not both; gpu is at "
            f"{_at(findings, f'{path}.gpu')}",
        )
    seen: set[int] = set()
    for index, gpu in enumerate(consumer.gpus):
        if gpu < 0:
            findings.report(f"{path}.gpus[{index}]", f"a GPU index is 0 or more, got {gpu}")
        elif gpu in seen:
            findings.report(f"{path}.gpus[{index}]", f"GPU {gpu} is listed twice")
        seen.add(gpu)
    if findings.line_of(f"{path}.gpus") is not None and not consumer.gpus:
        findings.report(f"{path}.gpus", "must list at least one GPU index")
    if len(consumer.cards) > 1:
        _check_placing(consumer, path, findings)
    if listed is None:
        return
    names = ", ".join(str(index) for index in sorted(listed))
    if not consumer.gpus and consumer.gpu not in listed:
        findings.report(f"{path}.gpu", f"GPU {consumer.gpu} is not in gpus (listed: {names})")
    for index, gpu in enumerate(consumer.gpus):
        if gpu not in listed:
            findings.report(f"{path}.gpus[{index}]", f"GPU {gpu} is not in gpus (listed: {names})")


def _check_placing(consumer: Consumer, path: str, findings: Findings) -> None:
    """Several GPUs: the runtime must place itself by a rule the gate knows, or be started
    by the gate on the GPU it chooses."""
    settings = consumer.settings
    where = f"{path}.gpus"
    if settings.one_device:
        findings.report(
            where, f"runtime {consumer.runtime} runs on one device: give one gpu, not several"
        )
    elif settings.places_itself:
        return
    elif consumer.control is None or not consumer.control.command:
        how = (
            "its unit's own Environment=CUDA_VISIBLE_DEVICES decides"
            if consumer.control is not None and consumer.control.unit is not None
            else "the gate does not start it"
        )
        findings.report(
            where,
            f"runtime {consumer.runtime} uses the GPU it is started on, and {how}: give one "
            "gpu, or a control.command for the gate to start it on the GPU it chooses",
        )


def _check_residencies(consumer: Consumer, path: str, findings: Findings) -> None:
    residencies: list[tuple[Residency, str]] = [(consumer.residency, f"{path}.residency")]
    residencies += [
        (model.residency, f"{path}.models.{model.name}.residency")
        for model in consumer.models
        if model.residency is not None
    ]
    for residency, where in residencies:
        if residency.ttl is None or residency.policy is ResidencyPolicy.KEEP_WARM:
            continue
        why = (
            "never unloads for idleness"
            if residency.policy is ResidencyPolicy.ALWAYS_WARM
            else "unloads as soon as its last request is done"
        )
        findings.report(
            f"{where}.ttl", f"a ttl applies only to keep_warm; {residency.policy.value} {why}"
        )
    for model in consumer.models:
        residency = model.residency or consumer.residency
        if model.rewarm and residency.policy is ResidencyPolicy.LOAD_ON_DEMAND:
            findings.report(
                f"{path}.models.{model.name}.rewarm",
                "rewarm applies to keep_warm and always_warm; a load_on_demand model "
                "unloads as soon as its last request is done, so there is nothing to warm again",
            )


def _check_runtime(
    consumer: Consumer, path: str, findings: Findings, runtimes: RuntimeTable
) -> None:
    """The runtime's own rules (its section's `check`), and `preempt` only where it has jobs."""
    consumer.settings.check(consumer, path, findings)
    if not consumer.settings.jobs:
        if findings.line_of(f"{path}.preempt") is not None:
            with_jobs = runtimes.with_jobs
            readers = f"only a {' or '.join(with_jobs)} consumer" if with_jobs else "no runtime"
            findings.warn(
                f"{path}.preempt",
                f"{readers} reads preempt; runtime {consumer.runtime} ignores it",
            )
        return
    seen: set[object] = set()
    for index, priority in enumerate(consumer.preempt):
        if priority in seen:
            findings.warn(f"{path}.preempt[{index}]", f"{priority.label} is listed twice")
        seen.add(priority)


def _check_control(consumer: Consumer, path: str, findings: Findings) -> None:
    control = consumer.control
    where = f"{path}.control"
    if control is None or findings.has_errors_under(where):
        return
    if not consumer.settings.controlled:
        findings.warn(
            where,
            f"runtime {consumer.runtime} ignores control: the gate starts and stops only a "
            "runtime whose memory is its process's; its models load and unload inside its "
            "server, which you start (or systemd does)",
        )
        return
    if control.unit is not None and control.command:
        findings.report(where, "give either unit (a systemd service) or command, not both")
    elif control.unit is None and not control.command:
        if findings.line_of(f"{where}.command") is not None:
            findings.report(f"{where}.command", "must be a non-empty list: the program first")
        else:
            findings.report(where, "give unit (a systemd service) or command (a list)")
    elif control.unit is not None:
        for key in ("env", "cwd"):
            if findings.line_of(f"{where}.{key}") is not None:
                findings.report(
                    f"{where}.{key}",
                    "applies to a command; a unit has its own Environment= and WorkingDirectory=",
                )
    if not control.health.startswith("/"):
        findings.report(
            f"{where}.health", f"expected a path like '/health', got {control.health!r}"
        )
    for key in ("start_timeout", "stop_timeout", "start_admission_timeout"):
        if getattr(control, key) <= 0:
            findings.report(f"{where}.{key}", "must be longer than 0s")
    if consumer.envelope is None:
        findings.report(
            f"{path}.envelope",
            "a process-controlled consumer needs an envelope: the bytes its start is admitted for",
        )


def _check_external(config: Config, findings: Findings) -> None:
    consumers = {consumer.name for consumer in config.consumers}
    for service in config.external:
        path = f"external.{service.name}"
        if service.name in consumers:
            consumer = _at(findings, f"consumers.{service.name}")
            findings.report(
                path, f"'{service.name}' is also {consumer}; each owner needs its own name"
            )
        if service.processes.empty:
            findings.warn(
                f"{path}.processes", "no units, commands or names: it can never match a process"
            )


def _check_identities(config: Config, findings: Findings) -> None:
    names: dict[str, str] = {}
    token_owner: dict[str, str] = {}
    source_owner: dict[object, str] = {}
    for index, identity in enumerate(config.identities):
        path = f"identities[{index}]"
        if identity.name in names:
            first = names[identity.name]
            findings.report(
                f"{path}.name",
                f"identity '{identity.name}' is already defined at {_at(findings, first)}",
            )
        names.setdefault(identity.name, path)
        # A token left out because its variable is unset was already reported (a warning).
        left_out = findings.has_errors_under(f"{path}.tokens")
        if not identity.sources and not identity.tokens and not left_out:
            findings.report(path, "matches no client: give sources, tokens or both")
        ceiling = identity.max_priority
        if ceiling is not None and ceiling < identity.priority:
            findings.report(
                f"{path}.max_class",
                f"max_class {ceiling.label} is below class {identity.priority.label}; "
                "it must be at least the identity's own class",
            )
        for position, token in enumerate(identity.tokens):
            if token in token_owner:
                # Never echo the token itself: the output may end up in a log.
                findings.report(
                    f"{path}.tokens[{position}]",
                    f"the same token is already given for identity '{token_owner[token]}'",
                )
            token_owner.setdefault(token, identity.name)
        for position, network in enumerate(identity.sources):
            if network in source_owner:
                findings.report(
                    f"{path}.sources[{position}]",
                    f"{network} is already a source of identity '{source_owner[network]}'",
                )
            source_owner.setdefault(network, identity.name)
