"""The hostile corpus tests.faults.real_fuzz sends to the real runtimes behind the gate.

whisper-server: `/load` forms in every shape cpp-httplib reads (or refuses) differently from
a plain multipart parser, naming models, missing files and files that end the server:
boundaries found inside other parameters, quoted, percent-encoded; repeated and missing
fields; parts whose Content-Transfer-Encoding nobody undoes; preambles,
epilogues that later reads turn into parts, delimiters inside content; NULs; bodies of every
size, chunked, encoded, behind `Expect`; the route spelled with escapes. `/inference`s, some
of them bodies the server stops reading with a `/load` where its next read begins.

llama-server (router mode): completions and `/models/load` for each model, odd spellings,
and the same kind of body with a second request inside.
"""

from __future__ import annotations

import base64
import enum
import json
import random

import attrs

from gpugate_sim.whisper.transcript import wav_bytes
from tests.whisper.conftest import Models
from tests.whisper.wire import BOUNDARY, form, form_type, part, request

ROUTER_MODELS = ("alpha", "beta", "gamma")
READ = 4096
"""cpp-httplib's first read of a connection (the head and the body's first piece)."""


class Target(enum.Enum):
    WHISPER = "whisper"
    LLAMA = "llama"


@attrs.frozen
class Case:
    id: str
    target: Target
    kind: str
    raw: bytes


def gate_head(target: str, headers: list[bytes], upstream: int, length: int) -> int:
    """The length of the head the gate sends up for this request (proxy/forward.py
    `request_head`): the request line, Host, the client's other headers less framing and
    hops, X-Forwarded-For, Content-Length, `Connection: close`."""
    kept = [h for h in headers if h.split(b":")[0].strip().lower() not in DROPPED]
    lines = [f"POST {target} HTTP/1.1".encode(), b"Host: 127.0.0.1:%d" % upstream, *kept]
    lines += [b"X-Forwarded-For: 127.0.0.1", b"Content-Length: %d" % length, b"Connection: close"]
    return sum(len(line) + 2 for line in lines) + 2


DROPPED = {b"host", b"content-length", b"transfer-encoding", b"connection", b"expect"}


def aligned(target: str, headers: list[bytes], upstream: int, inner: bytes) -> bytes:
    """A body holding `inner` where the server's next read starts: at the body's start (the
    gate's head went up alone) and 4 KiB into what the gate sent (head and body together)."""
    pad = READ - gate_head(target, headers, upstream, READ + 2 * len(inner)) - len(inner)
    return inner + b"p" * max(pad, 0) + inner


class Corpus:
    """Cases drawn from a seeded generator, for the whisper consumer and the router."""

    def __init__(
        self, rng: random.Random, models: Models, whisper_upstream: int, *, router: float = 0.2
    ) -> None:
        self.rng = rng
        self.models = models
        self.upstream = whisper_upstream
        self.router = router
        """The share of cases for the router."""
        self.count = 0

    def next(self) -> Case:
        self.count += 1
        if self.rng.random() >= self.router:
            kind, raw = self.whisper()
            return Case(str(self.count), Target.WHISPER, kind, raw)
        kind, raw = self.llama()
        return Case(str(self.count), Target.LLAMA, kind, raw)

    # -- whisper-server ----------------------------------------------------------------------

    def model(self) -> str:
        """A path to name: mostly models; some that do not exist (whisper-server answers
        400), and some that open but do not load, a file that is no model and a directory:
        server.cpp frees its model, fails and exits 1 unanswered; the gate answers 502
        MODEL_LOAD_FAILED and starts it again for the next request."""
        m = self.models
        pool = [m.english, m.english_other, m.multilingual] * 8 + [m.missing]
        pool += [m.not_a_model, m.directory]
        return str(self.rng.choice(pool))

    def whisper(self) -> tuple[str, bytes]:
        kind = self.rng.choice(WHISPER_KINDS)
        if kind.startswith("inference"):
            return kind, self.inference(kind)
        path = self.model()
        body, content_type, headers, target = self.load_form(kind, path)
        if kind == "chunked":
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:7], body[7:]) if c)
            return kind, request(
                "POST", target, chunks + b"0\r\n\r\n", content_type=content_type,
                headers=[*headers, b"Transfer-Encoding: chunked"], length=False,
            )  # fmt: skip
        return kind, request("POST", target, body, content_type=content_type, headers=headers)

    def load_form(self, kind: str, path: str) -> tuple[bytes, bytes | None, list[bytes], str]:
        """(body, Content-Type, more headers, target) of a /load of this kind."""
        other = self.model()
        model = part("model", path)
        content_type: bytes | None = form_type()
        headers: list[bytes] = []
        target = "/load"
        body = form(model)
        if kind == "pad":
            pad = part("pad", b"p" * self.rng.choice([10, 5000, 70_000, 300_000]))
            body = form(*self.rng.sample([pad, model], 2))
        elif kind == "xboundary":
            inner = self.rng.choice([b"AAA", BOUNDARY])
            body = form(part("model", path, boundary=inner), boundary=inner)
            content_type = b"multipart/form-data; xboundary=AAA; boundary=" + BOUNDARY
        elif kind == "quoted":
            content_type = b'multipart/form-data; boundary="' + BOUNDARY + b'"'
        elif kind == "percent":
            content_type = b"multipart%2Fform-data; boundary%3D" + BOUNDARY
        elif kind == "upper":
            content_type = b"Multipart/Form-Data; boundary=" + BOUNDARY
        elif kind == "no-boundary":
            content_type = b"multipart/form-data"
        elif kind == "two-models":
            body = form(model, part("model", other))
        elif kind == "encoded":
            coding = self.rng.choice([b"base64", b"quoted-printable"])
            value = base64.b64encode(path.encode()) if coding == b"base64" else path.encode()
            body = form(part("model", value, headers=[b"Content-Transfer-Encoding: " + coding]))
        elif kind == "preamble":
            body = self.rng.choice([b"preamble\r\n", b"xx", b""]) + form(model)
        elif kind == "epilogue":
            tail = self.rng.choice([b"\r\n", b"junk", b"\r\n" + part("model", other)[9:] + b"--"])
            body = form(model) + tail
        elif kind == "inner-delimiter":
            body = form(part("pad", b"x--" + BOUNDARY + b"\r\n" + part("model", other)[9:]), model)
        elif kind == "nul":
            body = form(part("model", path.encode() + b"\0" + other.encode()))
        elif kind == "no-model":
            body = form(part(self.rng.choice(["Model", "models", "file", ""]), path))
        elif kind == "disposition":
            disposition = self.rng.choice(DISPOSITIONS)
            body = form(part("", path, disposition=disposition))
        elif kind == "gzip":
            headers = [b"Content-Encoding: " + self.rng.choice([b"gzip", b"identity", b"br"])]
        elif kind == "expect":
            headers = [b"Expect: 100-continue"]
        elif kind == "path":
            target = self.rng.choice(["/lo%61d", "/%u006coad", "/load?x=1", "/load/", "//load"])
        elif kind == "two-types":
            headers = [b"Content-Type: multipart/form-data; boundary=OTHER"]
        elif kind == "lf-only":
            body = form(model).replace(b"\r\n", b"\n")
        elif kind == "split-first":
            # The server's first read ends 3 bytes into the first delimiter.
            body = form(model, part("model", other))
            sent = [b"X-Pad: ", b"Content-Type: " + form_type()]
            base = gate_head(target, sent, self.upstream, len(body))
            headers = [b"X-Pad: " + b"p" * max(READ - 3 - base, 0)]
        return body, content_type, headers, target

    def inference(self, kind: str) -> bytes:
        audio = part("file", wav_bytes(1), disposition=b'form-data; name="file"; filename="a.wav"')
        if kind == "inference":
            fields = [part("model", self.model()), part("response_format", "json")]
            return request(
                "POST", "/inference", form(audio, *self.rng.sample(fields, self.rng.randint(0, 2))),
                content_type=form_type(),
            )  # fmt: skip
        inner = request(
            "POST", "/load", form(part("model", self.model())), content_type=form_type()
        )
        if kind == "inference-gzip":
            headers = [b"Content-Encoding: gzip", b"Content-Type: " + form_type()]
        else:  # a form the server refuses at its first piece
            headers = [b"Content-Type: " + form_type()]
        body = aligned("/inference", headers, self.upstream, inner)
        if kind == "inference-bad-form":
            start = b"--" + BOUNDARY + b"\r\nNo colon here\r\n\r\n"
            body = start + body[len(start) :]
        return request("POST", "/inference", body, headers=headers)

    # -- llama-server router -----------------------------------------------------------------

    def llama(self) -> tuple[str, bytes]:
        kind = self.rng.choice(["chat", "models-load", "completion", "smuggle"])
        name = self.rng.choice([*ROUTER_MODELS, *ROUTER_MODELS, "ALPHA", " beta", "delta", ""])
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        if kind == "chat":
            return kind, json_request("/v1/chat/completions", chat)
        if kind == "models-load":
            return kind, json_request("/models/load", {"model": name})
        if kind == "completion":
            return kind, json_request("/completion", {"model": name, "prompt": "a", "n_predict": 1})
        inner = json_request("/v1/chat/completions", chat)
        headers = [b"Content-Encoding: gzip", b"Content-Type: application/json"]
        body = b"p" * (READ - 200) + inner
        return kind, request("POST", "/v1/chat/completions", body, headers=headers)


def json_request(path: str, value: object) -> bytes:
    body = json.dumps(value).encode()
    return request("POST", path, body, content_type=b"application/json")


WHISPER_KINDS = (
    "plain", "plain", "pad", "xboundary", "quoted", "percent", "upper", "no-boundary",
    "two-models", "encoded", "preamble", "epilogue", "inner-delimiter", "nul", "no-model",
    "disposition", "gzip", "expect", "path", "two-types", "lf-only", "split-first", "chunked",
    "inference", "inference", "inference-gzip", "inference-bad-form",
)  # fmt: skip
DISPOSITIONS = (
    b"form-data; name=model", b'FORM-DATA; name="model"', b'form-data; NAME="model"',
    b'attachment; name="model"', b'form-data; name="model"; name="x"',
    b'form-data; name="x"; name="model"', b"form-data; name=\"model\"; filename*=latin1''x",
)  # fmt: skip
