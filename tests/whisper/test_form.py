"""The gate's reading of a whisper-server form (gpugate/runtimes/whisper/form.py) against the
simulator's own port of cpp-httplib (gpugate_sim/whisper/httplib.py): the same parts from
one read, and, split into reads anywhere, never a `model` the gate did not count unless
the gate said its reading was in doubt."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from gpugate.runtimes.whisper.form import boundary_of, decode_url, path_of, read_form
from gpugate_sim.whisper import httplib

B = b"bb"
FIELDS = [b"model", b"other", b"file", b""]
MODEL_HEAD = b"Content-Disposition: form-data; name=model\r\n\r\n"
DISPOSITIONS = [
    b'form-data; name="%s"',
    b"form-data; name=%s",
    b'FORM-DATA; name="%s"',
    b'attachment; name="%s"',
    b'form-data; name="x"; name="%s"',
]


def sim_model(body: bytes, boundary: bytes, reads: list[int]) -> tuple[bool, bytes | None]:
    """(valid, the first `model` part's content) as the simulator's parser reads `body`
    handed over in pieces of `reads` bytes (the rest in one)."""
    parser = httplib.FormParser(boundary)
    at = 0
    for size in [*reads, len(body)]:
        piece = body[at : at + size]
        at += len(piece)
        if piece and not parser.parse(piece):
            return False, None
    if not parser.valid:
        return False, None
    first = next((f for f in parser.files if f.name == b"model"), None)
    return True, None if first is None else bytes(first.content)


def test_decode_url_is_cpp_httplibs():
    assert decode_url(b"multipart%2Fform-data") == b"multipart/form-data"
    assert decode_url(b"%u0041%41%4") == b"AA%4"
    assert decode_url(b"%uD800x") == b"x", "a surrogate decodes to nothing"
    assert decode_url(b"%zz+") == b"%zz+"
    for raw in (b"%u00e9", b"%%41", b"%u12", b"a%", b"%E2%82%AC"):
        assert decode_url(raw) == httplib.decode_url(raw)


@pytest.mark.parametrize(
    ("value", "boundary"),
    [
        (b"multipart/form-data; boundary=AAA", b"AAA"),
        (b"multipart/form-data; xboundary=AAA; boundary=BBB", b"AAA"),
        (b'multipart/form-data; boundary="A;A"', b'"A'),
        (b"multipart/form-data; boundary=AAA ;x", b"AAA "),
        (b"multipart/form-data", b""),
        (b"multipart/form-data; boundary=", b""),
        (b'multipart/form-data; boundary=""', b""),
        (b"Multipart/form-data; boundary=AAA", None),
        (b"text/plain; boundary=AAA", None),
    ],
)
def test_the_boundary_is_read_as_cpp_httplib_reads_it(value, boundary):
    assert boundary_of(value) == boundary
    if boundary is not None:
        assert httplib.multipart_boundary(value) == (boundary or None)


def part(name: bytes, value: bytes, boundary: bytes = B) -> bytes:
    return (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="' + name + b'"\r\n\r\n'
        + value + b"\r\n"
    )  # fmt: skip


def close(boundary: bytes = B) -> bytes:
    return b"--" + boundary + b"--\r\n"


def test_one_model_part_is_read_without_doubt():
    reading = read_form(part(b"other", b"x") + part(b"model", b"/m.bin\0junk") + close(), B)
    assert (reading.valid, reading.doubt) == (True, None)
    first = reading.first(b"model")
    assert first is not None and path_of(first.content) == b"/m.bin"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"preamble\r\n" + part(b"model", b"/a") + close(), None),
        (b"x--bb\r\n" + part(b"model", b"/a") + close(), "starts a line"),
        (part(b"model", b"/a--bb\r\n") + close(), "starts a line"),
        (part(b"pad", b"x--bb\r\n" + MODEL_HEAD + b"/b") + close(), "starts a line"),
        (part(b"model", b"/a") + close() + b"\r\n" + MODEL_HEAD + b"/b", "after the closing"),
        (part(b"model", b"/a") + close() + b"an epilogue\r\n", None),
    ],
)  # fmt: skip
def test_a_reading_reads_split_could_change_is_in_doubt(body, why):
    doubt = read_form(body, B).doubt
    assert (doubt is None) if why is None else (doubt is not None and why in doubt)


def test_every_model_part_counts_even_past_the_first():
    reading = read_form(part(b"model", b"/a") + part(b"model", b"/b") + close(), B)
    assert [path_of(p.content) for p in reading.named(b"model")] == [b"/a", b"/b"]
    first = reading.first(b"model")
    assert first is not None and first.content == b"/a"


def test_a_part_refused_ends_the_reading_invalid():
    no_name = b'--bb\r\nContent-Disposition: form-data; filename="m"\r\n\r\nx\r\n' + close()
    assert not read_form(no_name, B).valid
    many = b"".join(part(b"f", b"x") for _ in range(1025)) + close()
    assert not read_form(many, B).valid
    assert read_form(b"".join(part(b"f", b"x") for _ in range(1024)) + close(), B).valid


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Forms with hostile corners: preambles and epilogues holding delimiters, repeated and
    odd names, encodings, truncation, delimiters inside content."""
    pieces = [draw(st.sampled_from([b"", b"pre\r\n", b"x--bb\r\n", b"--bb"]))]
    for _ in range(draw(st.integers(0, 4))):
        name = draw(st.sampled_from(FIELDS))
        value = draw(
            st.sampled_from([b"/a", b"/b", b"", b"/a\0x", b"y--bb\r\n", b"\r\n--bbz", b"L3Nydg=="])
        )
        extra = draw(st.sampled_from([b"", b"Content-Transfer-Encoding: base64\r\n", b"Bad\r\n"]))
        disposition = draw(st.sampled_from(DISPOSITIONS))
        pieces.append(
            b"--bb\r\nContent-Disposition: " + (disposition % name) + b"\r\n" + extra + b"\r\n"
            + value + b"\r\n"
        )  # fmt: skip
    pieces.append(draw(st.sampled_from([close(), b"--bb--", b"--bb", b"", b"--bbX"])))
    pieces.append(
        draw(st.sampled_from([b"", b"\r\n", b"\r\n" + part(b"model", b"/e"), b"junk\r\n\r\nmore"]))
    )
    return b"".join(pieces)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(), st.lists(st.integers(1, 40), max_size=8))
def test_split_anywhere_the_simulator_loads_only_what_the_gate_counted(body, reads):
    reading = read_form(body, B)
    valid, whole = sim_model(body, B, [])
    assert valid == reading.valid
    if valid:
        first = reading.first(b"model")
        assert whole == (None if first is None else first.content)
    if reading.doubt is not None:
        return
    counted = {p.content for p in reading.named(b"model")}
    valid, split = sim_model(body, B, reads)
    if valid and split is not None:
        assert split in counted, (body, reads)
