"""A file is read with the runtime table it is given: what derives from the table (the
runtimes `runtime:` may name, those `preempt` applies to, which runtime reads a section) is
read from that table when the file is loaded. The table here is the test's own."""

from __future__ import annotations

from typing import ClassVar

import attrs
import pytest

from gpugate.config.model import RuntimeSettings
from gpugate.config.runtime_table import RuntimeEntry, RuntimeTable
from gpugate.core.classes import PriorityClass
from tests.config.helpers import Found, errors, load, ollama, warnings


@attrs.frozen
class BatchSettings(RuntimeSettings):
    """A runtime with jobs and a section of its own."""

    jobs: ClassVar[bool] = True

    slots: int = 1


TABLE = RuntimeTable((RuntimeEntry("http"), RuntimeEntry("batch", BatchSettings)))


def test_a_table_lists_its_runtimes_and_those_with_jobs():
    assert TABLE.names == ("http", "batch")
    assert TABLE.with_jobs == ("batch",)
    assert (TABLE.section("batch"), TABLE.section("http")) == (BatchSettings, RuntimeSettings)
    assert TABLE.section("ollama") is None
    assert TABLE.parse(" Batch ") == "batch"
    with pytest.raises(ValueError, match=r"^unknown runtime 'ollama' \(one of http, batch\)$"):
        TABLE.parse("ollama")


def test_a_table_names_each_runtime_once_as_a_file_reads_it():
    with pytest.raises(ValueError, match="'http' is in the table twice"):
        TABLE.adding(RuntimeEntry("http"))
    with pytest.raises(ValueError, match="lower case"):
        RuntimeTable((RuntimeEntry("Batch"),))
    assert TABLE.adding(RuntimeEntry("queue")).names == ("http", "batch", "queue")
    assert TABLE.names == ("http", "batch")


def test_a_runtime_of_the_table_is_read_with_its_section():
    text = ollama(runtime="batch", batch="{slots: 2}", preempt="[production]")
    consumer = load(text, runtimes=TABLE).config.consumer("ollama")
    assert consumer.settings == BatchSettings(slots=2)
    assert consumer.preempt == (PriorityClass.PRODUCTION,)
    assert warnings(text, runtimes=TABLE) == []


def test_a_runtime_not_in_the_table_is_unknown():
    assert errors(ollama(), runtimes=TABLE) == [
        Found(3, "consumers.ollama.runtime", "unknown runtime 'ollama' (one of http, batch)")
    ]
    assert errors(ollama(runtime="[http]"), runtimes=TABLE) == [
        Found(3, "consumers.ollama.runtime", "expected a runtime (http, batch), got a list")
    ]


def test_preempt_and_sections_elsewhere_name_the_tables_runtimes():
    text = ollama(runtime="http", preempt="[production]", slots="2")
    assert warnings(text, runtimes=TABLE) == [
        Found(
            7,
            "consumers.ollama.preempt",
            "only a batch consumer reads preempt; runtime http ignores it",
        ),
        Found(
            8,
            "consumers.ollama.slots",
            "only a batch consumer reads slots; runtime http ignores it",
        ),
    ]


def test_a_table_without_jobs_says_no_runtime_reads_preempt():
    text = ollama(runtime="http", preempt="[production]")
    assert warnings(text, runtimes=RuntimeTable((RuntimeEntry("http"),))) == [
        Found(7, "consumers.ollama.preempt", "no runtime reads preempt; runtime http ignores it")
    ]
