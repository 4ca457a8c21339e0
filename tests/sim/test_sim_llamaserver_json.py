"""The simulated llama-server's JSON parsing: nlohmann's messages, as the real server gives them.

Every message in REAL_ERRORS was observed from build/llama-server (llama-cpp-python 0.3.36's
llama.cpp, nlohmann json 3.12) answering a POST of the body to /completion (and the same on
/v1/chat/completions and /tokenize): 500 `{"error":{"code":500,"message":...}}`. The
message is `[json.exception.parse_error.101] parse error at <position>: <what>`; the table
gives the position and what.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpugate_sim.llamaserver.memory import plan
from gpugate_sim.llamaserver.model import load_model_info
from gpugate_sim.llamaserver.nlohmann import JsonError, parse, parse_exact
from gpugate_sim.llamaserver.server import ModelServer, ServeOptions

gguf = pytest.importorskip("gguf")
gguf_models = pytest.importorskip("tests.llamaserver.gguf_models")
PARSE_ERROR = "[json.exception.parse_error.101] parse error at "

# (body, position, what); position None: the whole message (not a parse_error)
# fmt: off
REAL_ERRORS: list[tuple[bytes, str | None, str]] = [
    (b'', 'line 1, column 1',
     'attempting to parse an empty input; check that your input string or '
     'stream contains the expected JSON'),
    (b' ', 'line 1, column 2',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'\n', 'line 2, column 1',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'\x00', 'line 1, column 1',
     'attempting to parse an empty input; check that your input string or '
     'stream contains the expected JSON'),
    (b'  \n  ', 'line 2, column 3',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'{not json', 'line 1, column 3',
     'syntax error while parsing object key - invalid literal; last read: '
     "'{no'; expected string literal"),
    (b'{bad', 'line 1, column 2',
     'syntax error while parsing object key - invalid literal; last read: '
     "'{b'; expected string literal"),
    (b'nope', 'line 1, column 2',
     "syntax error while parsing value - invalid literal; last read: 'no'"),
    (b'tru', 'line 1, column 4',
     "syntax error while parsing value - invalid literal; last read: 'tru'"),
    (b'nul', 'line 1, column 4',
     "syntax error while parsing value - invalid literal; last read: 'nul'"),
    (b'fals', 'line 1, column 5',
     "syntax error while parsing value - invalid literal; last read: 'fals'"),
    (b'True', 'line 1, column 1',
     "syntax error while parsing value - invalid literal; last read: 'T'"),
    (b'[tru]', 'line 1, column 5',
     "syntax error while parsing value - invalid literal; last read: '[tru]'"),
    (b'[1, tru]', 'line 1, column 8',
     "syntax error while parsing value - invalid literal; last read: '1, tru]'"),
    (b'{"a": 1, "b": nul}', 'line 1, column 18',
     'syntax error while parsing value - invalid literal; last read: \'"b": '
     "nul}'"),
    (b'NaN', 'line 1, column 1',
     "syntax error while parsing value - invalid literal; last read: 'N'"),
    (b'Infinity', 'line 1, column 1',
     "syntax error while parsing value - invalid literal; last read: 'I'"),
    (b'-Infinity', 'line 1, column 2',
     'syntax error while parsing value - invalid number; expected digit after '
     "'-'; last read: '-I'"),
    (b'[NaN]', 'line 1, column 2',
     "syntax error while parsing value - invalid literal; last read: '[N'"),
    (b'{"a":NaN}', 'line 1, column 6',
     'syntax error while parsing value - invalid literal; last read: \'"a":N\''),
    (b'{"a":-Infinity}', 'line 1, column 7',
     'syntax error while parsing value - invalid number; expected digit after '
     "'-'; last read: '-I'"),
    (b'"abc', 'line 1, column 5',
     'syntax error while parsing value - invalid string: missing closing '
     'quote; last read: \'"abc\''),
    (b'{"a', 'line 1, column 4',
     'syntax error while parsing object key - invalid string: missing closing '
     'quote; last read: \'"a\'; expected string literal'),
    (b'{"a":"b', 'line 1, column 8',
     'syntax error while parsing value - invalid string: missing closing '
     'quote; last read: \'"b\''),
    (b'["x\ny"]', 'line 2, column 0',
     'syntax error while parsing value - invalid string: control character '
     'U+000A (LF) must be escaped to \\u000A or \\n; last read: \'"x<U+000A>\''),
    (b'"a\tb"', 'line 1, column 3',
     'syntax error while parsing value - invalid string: control character '
     'U+0009 (HT) must be escaped to \\u0009 or \\t; last read: \'"a<U+0009>\''),
    (b'"\x00"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: control character '
     'U+0000 (NUL) must be escaped to \\u0000; last read: \'"<U+0000>\''),
    (b'"\x01"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: control character '
     'U+0001 (SOH) must be escaped to \\u0001; last read: \'"<U+0001>\''),
    (b'"\x1f"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: control character '
     'U+001F (US) must be escaped to \\u001F; last read: \'"<U+001F>\''),
    (b'"\x08"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: control character '
     'U+0008 (BS) must be escaped to \\u0008 or \\b; last read: \'"<U+0008>\''),
    (b'"\x0c"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: control character '
     'U+000C (FF) must be escaped to \\u000C or \\f; last read: \'"<U+000C>\''),
    (b'"\r"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: control character '
     'U+000D (CR) must be escaped to \\u000D or \\r; last read: \'"<U+000D>\''),
    (b'"\x0b"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: control character '
     'U+000B (VT) must be escaped to \\u000B; last read: \'"<U+000B>\''),
    (b'"\xff"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�\''),
    (b'"\xc3("', 'line 1, column 3',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�(\''),
    (b'"\xe2\x82"', 'line 1, column 4',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�"\''),
    (b'"\xe2\x82("', 'line 1, column 4',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�(\''),
    (b'"\xf0\x80\x80\x80"', 'line 1, column 3',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"��\''),
    (b'"\xed\xa0\x80"', 'line 1, column 3',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"��\''),
    (b'"\xc0\xaf"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�\''),
    (b'"\xf4\x90\x80\x80"', 'line 1, column 3',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"��\''),
    (b'{"k\xff":1}', 'line 1, column 4',
     'syntax error while parsing object key - invalid string: ill-formed '
     'UTF-8 byte; last read: \'"k�\'; expected string literal'),
    (b'"\xe0\x80\x80"', 'line 1, column 3',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"��\''),
    (b'"\xf5"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�\''),
    (b'"\x80"', 'line 1, column 2',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�\''),
    (b'"\\x"', 'line 1, column 3',
     'syntax error while parsing value - invalid string: forbidden character '
     'after backslash; last read: \'"\\x\''),
    (b'"\\u12"', 'line 1, column 6',
     "syntax error while parsing value - invalid string: '\\u' must be "
     'followed by 4 hex digits; last read: \'"\\u12"\''),
    (b'"\\u12G4"', 'line 1, column 6',
     "syntax error while parsing value - invalid string: '\\u' must be "
     'followed by 4 hex digits; last read: \'"\\u12G\''),
    (b'"\\ud800"', 'line 1, column 8',
     'syntax error while parsing value - invalid string: surrogate '
     'U+D800..U+DBFF must be followed by U+DC00..U+DFFF; last read: '
     '\'"\\ud800"\''),
    (b'"\\ud800\\u0041"', 'line 1, column 13',
     'syntax error while parsing value - invalid string: surrogate '
     'U+D800..U+DBFF must be followed by U+DC00..U+DFFF; last read: '
     '\'"\\ud800\\u0041\''),
    (b'"\\udc00"', 'line 1, column 7',
     'syntax error while parsing value - invalid string: surrogate '
     'U+DC00..U+DFFF must follow U+D800..U+DBFF; last read: \'"\\udc00\''),
    (b'"\\ud800x"', 'line 1, column 8',
     'syntax error while parsing value - invalid string: surrogate '
     'U+D800..U+DBFF must be followed by U+DC00..U+DFFF; last read: '
     '\'"\\ud800x\''),
    (b'"\\ud800\\"', 'line 1, column 9',
     'syntax error while parsing value - invalid string: surrogate '
     'U+D800..U+DBFF must be followed by U+DC00..U+DFFF; last read: '
     '\'"\\ud800\\"\''),
    (b'"\\u"', 'line 1, column 4',
     "syntax error while parsing value - invalid string: '\\u' must be "
     'followed by 4 hex digits; last read: \'"\\u"\''),
    (b'"\\', 'line 1, column 3',
     'syntax error while parsing value - invalid string: forbidden character '
     'after backslash; last read: \'"\\\''),
    (b'{} x', 'line 1, column 4',
     "syntax error while parsing value - invalid literal; last read: '{} x'; "
     'expected end of input'),
    (b'[] []', 'line 1, column 4',
     "syntax error while parsing value - unexpected '['; expected end of input"),
    (b'1 2', 'line 1, column 3',
     'syntax error while parsing value - unexpected number literal; expected '
     'end of input'),
    (b'{}}', 'line 1, column 3',
     "syntax error while parsing value - unexpected '}'; expected end of input"),
    (b'"a" "b"', 'line 1, column 7',
     'syntax error while parsing value - unexpected string literal; expected '
     'end of input'),
    (b'{}\n\nfoo', 'line 3, column 2',
     'syntax error while parsing value - invalid literal; last read: '
     "'{}<U+000A><U+000A>fo'; expected end of input"),
    (b'null,', 'line 1, column 5',
     "syntax error while parsing value - unexpected ','; expected end of input"),
    (b'{"a" 1}', 'line 1, column 6',
     'syntax error while parsing object separator - unexpected number '
     "literal; expected ':'"),
    (b'{"a":1 "b":2}', 'line 1, column 10',
     'syntax error while parsing object - unexpected string literal; expected '
     "'}'"),
    (b'{"a":1,}', 'line 1, column 8',
     "syntax error while parsing object key - unexpected '}'; expected string "
     'literal'),
    (b'[1,]', 'line 1, column 4',
     "syntax error while parsing value - unexpected ']'; expected '[', '{', "
     'or a literal'),
    (b'[1 2]', 'line 1, column 4',
     'syntax error while parsing array - unexpected number literal; expected '
     "']'"),
    (b'{,}', 'line 1, column 2',
     "syntax error while parsing object key - unexpected ','; expected string "
     'literal'),
    (b'[,]', 'line 1, column 2',
     "syntax error while parsing value - unexpected ','; expected '[', '{', "
     'or a literal'),
    (b'{"a"}', 'line 1, column 5',
     "syntax error while parsing object separator - unexpected '}'; expected "
     "':'"),
    (b'{1:2}', 'line 1, column 2',
     'syntax error while parsing object key - unexpected number literal; '
     'expected string literal'),
    (b'{"a":}', 'line 1, column 6',
     "syntax error while parsing value - unexpected '}'; expected '[', '{', "
     'or a literal'),
    (b'[', 'line 1, column 2',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'{', 'line 1, column 2',
     'syntax error while parsing object key - unexpected end of input; '
     'expected string literal'),
    (b'{"a":', 'line 1, column 6',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'[1,', 'line 1, column 4',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'{"a":1', 'line 1, column 7',
     'syntax error while parsing object - unexpected end of input; expected '
     "'}'"),
    (b':', 'line 1, column 1',
     "syntax error while parsing value - unexpected ':'; expected '[', '{', "
     'or a literal'),
    (b']', 'line 1, column 1',
     "syntax error while parsing value - unexpected ']'; expected '[', '{', "
     'or a literal'),
    (b'}', 'line 1, column 1',
     "syntax error while parsing value - unexpected '}'; expected '[', '{', "
     'or a literal'),
    (b',', 'line 1, column 1',
     "syntax error while parsing value - unexpected ','; expected '[', '{', "
     'or a literal'),
    (b'01', 'line 1, column 2',
     'syntax error while parsing value - unexpected number literal; expected '
     'end of input'),
    (b'-', 'line 1, column 2',
     'syntax error while parsing value - invalid number; expected digit after '
     "'-'; last read: '-'"),
    (b'1.', 'line 1, column 3',
     'syntax error while parsing value - invalid number; expected digit after '
     "'.'; last read: '1.'"),
    (b'1e', 'line 1, column 3',
     "syntax error while parsing value - invalid number; expected '+', '-', "
     "or digit after exponent; last read: '1e'"),
    (b'1e+', 'line 1, column 4',
     'syntax error while parsing value - invalid number; expected digit after '
     "exponent sign; last read: '1e+'"),
    (b'-01', 'line 1, column 3',
     'syntax error while parsing value - unexpected number literal; expected '
     'end of input'),
    (b'1.e5', 'line 1, column 3',
     'syntax error while parsing value - invalid number; expected digit after '
     "'.'; last read: '1.e'"),
    (b'.5', 'line 1, column 1',
     "syntax error while parsing value - invalid literal; last read: '.'"),
    (b'+1', 'line 1, column 1',
     "syntax error while parsing value - invalid literal; last read: '+'"),
    (b'1E', 'line 1, column 3',
     "syntax error while parsing value - invalid number; expected '+', '-', "
     "or digit after exponent; last read: '1E'"),
    (b'0x1F', 'line 1, column 2',
     "syntax error while parsing value - invalid literal; last read: '0x'; "
     'expected end of input'),
    (b'-a', 'line 1, column 2',
     'syntax error while parsing value - invalid number; expected digit after '
     "'-'; last read: '-a'"),
    (b'1.5e-', 'line 1, column 6',
     'syntax error while parsing value - invalid number; expected digit after '
     "exponent sign; last read: '1.5e-'"),
    (b'[01]', 'line 1, column 3',
     'syntax error while parsing array - unexpected number literal; expected '
     "']'"),
    (b'[1.]', 'line 1, column 4',
     'syntax error while parsing value - invalid number; expected digit after '
     "'.'; last read: '1.]'"),
    (b'{"a":1e}', 'line 1, column 8',
     "syntax error while parsing value - invalid number; expected '+', '-', "
     "or digit after exponent; last read: '1e}'"),
    (b'1e400', None, "[json.exception.out_of_range.406] number overflow parsing '1e400'"),
    (b'-1e400', None, "[json.exception.out_of_range.406] number overflow parsing '-1e400'"),
    (b'[1e999]', None, "[json.exception.out_of_range.406] number overflow parsing '1e999'"),
    (b'1.5E+', 'line 1, column 6',
     'syntax error while parsing value - invalid number; expected digit after '
     "exponent sign; last read: '1.5E+'"),
    (b'{\n  "a": 1,\n  "b": x\n}', 'line 3, column 8',
     'syntax error while parsing value - invalid literal; last read: \'"b": '
     "x'"),
    (b'{\n"a":\n1\n\n,', 'line 5, column 2',
     'syntax error while parsing object key - unexpected end of input; '
     'expected string literal'),
    (b'{1\n}', 'line 1, column 0',
     'syntax error while parsing object key - unexpected number literal; '
     'expected string literal'),
    (b'[1\n,\n]', 'line 3, column 1',
     "syntax error while parsing value - unexpected ']'; expected '[', '{', "
     'or a literal'),
    (b'[1\r\n x]', 'line 2, column 2',
     'syntax error while parsing array - invalid literal; last read: '
     "'1<U+000D><U+000A> x'; expected ']'"),
    (b'\r\n\r\n', 'line 3, column 1',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'\xef\xbb\xbf{}x', 'line 1, column 6',
     'syntax error while parsing value - invalid literal; last read: '
     "'\ufeff{}x'; expected end of input"),
    (b'\xef\xbb\xbf', 'line 1, column 4',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'\xef\xbb{}', 'line 1, column 3',
     'syntax error while parsing value - invalid BOM; must be 0xEF 0xBB 0xBF '
     "if given; last read: '�{'"),
    (b'\xef{}', 'line 1, column 2',
     'syntax error while parsing value - invalid BOM; must be 0xEF 0xBB 0xBF '
     "if given; last read: '�{'"),
    (b'\xef\xbb\xbf{no', 'line 1, column 6',
     'syntax error while parsing object key - invalid literal; last read: '
     "'\ufeff{no'; expected string literal"),
    (b'{"a":"\\u00e9\\ud83d\\ude00"} z', 'line 1, column 28',
     'syntax error while parsing value - invalid literal; last read: '
     '\'"\\u00e9\\ud83d\\ude00"} z\'; expected end of input'),
    (b'["\xe2\x96\x81" x]', 'line 1, column 8',
     'syntax error while parsing array - invalid literal; last read: \'"▁" '
     "x'; expected ']'"),
    (b'{"prompt": "hi""}', 'line 1, column 18',
     'syntax error while parsing object - invalid string: missing closing '
     'quote; last read: \'"}\'; expected \'}\''),
    (b"{'a':1}", 'line 1, column 2',
     'syntax error while parsing object key - invalid literal; last read: '
     "'{''; expected string literal"),
    (b'// c\n{}', 'line 1, column 1',
     "syntax error while parsing value - invalid literal; last read: '/'"),
    (b'/* c */{}', 'line 1, column 1',
     "syntax error while parsing value - invalid literal; last read: '/'"),
    (b'{"a":1}}', 'line 1, column 8',
     "syntax error while parsing value - unexpected '}'; expected end of input"),
    (b'[[[[', 'line 1, column 5',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'[[]]]', 'line 1, column 5',
     "syntax error while parsing value - unexpected ']'; expected end of input"),
    (b'{"a":[1,2}', 'line 1, column 10',
     "syntax error while parsing array - unexpected '}'; expected ']'"),
    (b'[{"a":1]', 'line 1, column 8',
     "syntax error while parsing object - unexpected ']'; expected '}'"),
    (b'\t\x01', 'line 1, column 2',
     'syntax error while parsing value - invalid literal; last read: '
     "'<U+0009><U+0001>'"),
    (b'[\x7f]', 'line 1, column 2',
     "syntax error while parsing value - invalid literal; last read: '[\x7f'"),
    (b'"\x7f" x', 'line 1, column 5',
     'syntax error while parsing value - invalid literal; last read: \'"\x7f" '
     "x'; expected end of input"),
    (b'1\n x', 'line 2, column 2',
     'syntax error while parsing value - invalid literal; last read: '
     "'1<U+000A> x'; expected end of input"),
    (b'1\nx', 'line 2, column 1',
     'syntax error while parsing value - invalid literal; last read: '
     "'1<U+000A>x'; expected end of input"),
    (b'12\n\n]', 'line 3, column 1',
     "syntax error while parsing value - unexpected ']'; expected end of input"),
    (b'{"\xc3\xa9": x}', 'line 1, column 8',
     'syntax error while parsing value - invalid literal; last read: \'"é": '
     "x'"),
    (b'["\xe2\x96\x81\xe2\x96\x81",\n\t"a" : 1]', 'line 2, column 6',
     "syntax error while parsing array - unexpected ':'; expected ']'"),
    (b'-0 1', 'line 1, column 4',
     'syntax error while parsing value - unexpected number literal; expected '
     'end of input'),
    (b'-', 'line 1, column 2',
     'syntax error while parsing value - invalid number; expected digit after '
     "'-'; last read: '-'"),
    (b'--1', 'line 1, column 2',
     'syntax error while parsing value - invalid number; expected digit after '
     "'-'; last read: '--'"),
    (b'[1e5 ,]', 'line 1, column 7',
     "syntax error while parsing value - unexpected ']'; expected '[', '{', "
     'or a literal'),
    (b'{"a":{"b":[1,{"c":tru}]}}', 'line 1, column 22',
     'syntax error while parsing value - invalid literal; last read: '
     '\'"c":tru}\''),
    (b'{"a":{"b":[1,{"c":true}]}} ]', 'line 1, column 28',
     "syntax error while parsing value - unexpected ']'; expected end of input"),
    (b'["a\\u0000b" 1]', 'line 1, column 13',
     'syntax error while parsing array - unexpected number literal; expected '
     "']'"),
    (b'"\\u00"', 'line 1, column 6',
     "syntax error while parsing value - invalid string: '\\u' must be "
     'followed by 4 hex digits; last read: \'"\\u00"\''),
    (b'"\\uD83D\\uDE00" 0', 'line 1, column 16',
     'syntax error while parsing value - unexpected number literal; expected '
     'end of input'),
    (b'"\\uDBFF\\uDFFF"x', 'line 1, column 15',
     'syntax error while parsing value - invalid literal; last read: '
     '\'"\\uDBFF\\uDFFF"x\'; expected end of input'),
    (b'"\\t\\n\\r\\b\\f\\/\\\\\\"" 0', 'line 1, column 20',
     'syntax error while parsing value - unexpected number literal; expected '
     'end of input'),
    (b'[true false]', 'line 1, column 11',
     'syntax error while parsing array - unexpected false literal; expected '
     "']'"),
    (b'[null,nulL]', 'line 1, column 10',
     'syntax error while parsing value - invalid literal; last read: '
     "'[null,nulL'"),
    (b'{"a":falsey}', 'line 1, column 11',
     'syntax error while parsing object - invalid literal; last read: '
     '\'"a":falsey\'; expected \'}\''),
    (b'0.0e', 'line 1, column 5',
     "syntax error while parsing value - invalid number; expected '+', '-', "
     "or digit after exponent; last read: '0.0e'"),
    (b'0e-1x', 'line 1, column 5',
     "syntax error while parsing value - invalid literal; last read: '0e-1x'; "
     'expected end of input'),
    (b'123456789012345678901234567890e', 'line 1, column 32',
     "syntax error while parsing value - invalid number; expected '+', '-', "
     "or digit after exponent; last read: '123456789012345678901234567890e'"),
    (b'[1,\n2,\n3,\n]', 'line 4, column 1',
     "syntax error while parsing value - unexpected ']'; expected '[', '{', "
     'or a literal'),
    (b'\x00{}', 'line 1, column 1',
     'attempting to parse an empty input; check that your input string or '
     'stream contains the expected JSON'),
    (b' \x00 ', 'line 1, column 2',
     'syntax error while parsing value - unexpected end of input; expected '
     "'[', '{', or a literal"),
    (b'{"a":1}\n\x01', 'line 2, column 1',
     'syntax error while parsing value - invalid literal; last read: '
     "'1}<U+000A><U+0001>'; expected end of input"),
    (b'[1]\r\r\rx', 'line 1, column 7',
     'syntax error while parsing value - invalid literal; last read: '
     "'1]<U+000D><U+000D><U+000D>x'; expected end of input"),
    (b'"\xf0\x9f\x98\x80" \xf0\x9f\x98\x80', 'line 1, column 8',
     'syntax error while parsing value - invalid literal; last read: \'"😀" '
     "�'; expected end of input"),
    (b'"\xf0\x9f\x98" ', 'line 1, column 5',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�"\''),
    (b'"\xe2" ', 'line 1, column 3',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�"\''),
    (b'"\xc3"', 'line 1, column 3',
     'syntax error while parsing value - invalid string: ill-formed UTF-8 '
     'byte; last read: \'"�"\''),
    (b'["a","\xef\xbf\xbf", q]', 'line 1, column 13',
     'syntax error while parsing value - invalid literal; last read: '
     '\'"\uffff", q\''),
    (b'{"a":[]  ,  "b" ,}', 'line 1, column 17',
     "syntax error while parsing object separator - unexpected ','; expected "
     "':'"),
    (b'[[[]],[[]],]', 'line 1, column 12',
     "syntax error while parsing value - unexpected ']'; expected '[', '{', "
     'or a literal'),
    (b'9223372036854775808 x', 'line 1, column 21',
     'syntax error while parsing value - invalid literal; last read: '
     "'9223372036854775808 x'; expected end of input"),
    (b'-9223372036854775809 x', 'line 1, column 22',
     'syntax error while parsing value - invalid literal; last read: '
     "'-9223372036854775809 x'; expected end of input"),
    (b'{"n_predict": -1.5e+3, "x": .}', 'line 1, column 29',
     'syntax error while parsing value - invalid literal; last read: \'"x": '
     ".'"),
]
# fmt: on


def message(position: str | None, what: str) -> str:
    return what if position is None else f"{PARSE_ERROR}{position}: {what}"


@pytest.mark.parametrize(("body", "position", "what"), REAL_ERRORS)
def test_message_is_the_real_servers(body: bytes, position: str | None, what: str) -> None:
    expected = JsonError(message(position, what))
    assert parse(body) == expected
    assert parse_exact(body) == expected


def test_a_long_string_is_all_in_last_read() -> None:
    # observed: everything since the string began, however long
    body = b'{"prompt":"' + b"x" * 300 + b'" y}'
    what = (
        "syntax error while parsing object - invalid literal; last read: "
        f"'\"{'x' * 300}\" y'; expected '}}'"
    )
    assert parse(body) == JsonError(message("line 1, column 314", what))


@pytest.mark.parametrize(
    ("body", "value"),
    [
        # the first three observed accepted by the real server (a NUL ends the input, a
        # number beyond 64 bits is a float); the rest as nlohmann's lexer reads them
        (b"{}\x00garbage", {}),
        (b"[1]\x00]", [1]),
        (b"18446744073709551616", 18446744073709551616.0),
        (b"\xef\xbb\xbf{}", {}),
        (b"-0", 0),
        (b"18446744073709551615", 18446744073709551615),
        (b"-9223372036854775808", -9223372036854775808),
        (b"-9223372036854775809", -9223372036854775809.0),
        (b"1e-400", 0.0),
        (
            b' {"a" : [1, 2.5, -3e2, true, false, null, "x"] } ',
            {"a": [1, 2.5, -300.0, True, False, None, "x"]},
        ),
        (b'{"a": 1, "a": 2, "b": 3}', {"a": 2, "b": 3}),
        (b'"\\u00e9\\ud83d\\ude00\\u0000\\t\\/"', "\u00e9\U0001f600\x00\t/"),
        ('"\u2581\U0001f600\uffff"'.encode(), "\u2581\U0001f600\uffff"),
        (b"[[[[]]]]", [[[[]]]]),
    ],
)
def test_values(body: bytes, value: Any) -> None:
    assert parse(body) == value
    assert parse_exact(body) == value
    assert type(parse(body)) is type(value)


def test_fast_path_and_lexer_agree() -> None:
    docs: list[Any] = [
        {"prompt": "Hello ▁ wörld \u2028 \x7f", "n": [0, -1, 1.5e300, 2**63, -(2**63)]},
        {"messages": [{"role": "user", "content": 'a\nb\t"c"\\'}], "stream": False},
        [None, True, {}, [], "", 0.1, 1e-7],
    ]
    for doc in docs:
        for raw in (json.dumps(doc).encode(), json.dumps(doc, ensure_ascii=False).encode()):
            assert parse(raw) == parse_exact(raw) == doc


# --- through the simulator's HTTP server -------------------------------------------------


@pytest.fixture
def fim_by_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model whose vocabulary has <fim_prefix>, <fim_suffix> and <fim_middle> but no
    metadata keys naming them."""
    add_uint32 = gguf.GGUFWriter.add_uint32

    def without_fim_keys(writer: Any, key: str, value: int) -> None:
        if "fim" not in key:
            add_uint32(writer, key, value)

    monkeypatch.setattr(gguf.GGUFWriter, "add_uint32", without_fim_keys)
    path = gguf_models.write_tiny_llama(tmp_path / "fim.gguf", fim=True)
    monkeypatch.undo()
    return path


@pytest.fixture
async def client(fim_by_text: Path) -> AsyncIterator[TestClient[Any, Any]]:
    info = load_model_info(fim_by_text)
    server = ModelServer(info, plan(info, 512, 0), ServeOptions(tokens_per_second=1e6))
    server.ready = True
    async with TestClient(TestServer(server.app)) as test_client:
        yield test_client


def test_fim_tokens_are_found_by_their_text(fim_by_text: Path, tmp_path: Path) -> None:
    # llama-vocab.cpp: without tokenizer.ggml.fim_*_token_id, "<fim_prefix>" etc. by text
    base = gguf_models.BYTE_BASE + 256
    assert load_model_info(fim_by_text).fim == (base, base + 1, base + 2, None, None)
    assert load_model_info(gguf_models.write_tiny_llama(tmp_path / "plain.gguf")).fim == (
        (None,) * 5
    )


@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions", "/tokenize"])
@pytest.mark.parametrize(("body", "position", "what"), [
    REAL_ERRORS[5], REAL_ERRORS[6], REAL_ERRORS[0], *REAL_ERRORS[-3:]
])  # fmt: skip
async def test_bad_json_is_a_500(
    client: TestClient[Any, Any], path: str, body: bytes, position: str | None, what: str
) -> None:
    response = await client.post(path, data=body, headers={"content-type": "application/json"})
    assert response.status == 500
    expected = {"error": {"code": 500, "message": message(position, what), "type": "server_error"}}
    assert json.loads(await response.read()) == expected


# observed from the real server over the same model (-c 512): the prompt it reports and
# the tokens it evaluated, or its error
INFILL: list[tuple[dict[str, Any] | list[Any], int, Any]] = [
    ({"input_prefix": "def f(", "input_suffix": "):", "n_predict": 3}, 200,
     ("<s><fim_prefix>▁def▁f(<fim_suffix>▁):<fim_middle>", 20)),
    ({"input_prefix": "def f(", "input_suffix": "):", "prompt": "x<fim_middle>", "n_predict": 2},
     200, ("<s><fim_prefix>▁def▁f(▁x<fim_middle><fim_suffix>▁):<fim_middle>", 25)),
    ({"input_prefix": "", "input_suffix": "", "n_predict": 1}, 200,
     ("<s><fim_prefix><fim_suffix><fim_middle>", 4)),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "hello"}],
      "n_predict": 1}, 200, ("<s><fim_prefix>▁a<fim_suffix>▁b<fim_middle>", 12)),
    ({"input_prefix": "a<fim_prefix>", "input_suffix": "b", "n_predict": 1}, 200,
     ("<s><fim_prefix>▁a<fim_prefix><fim_suffix>▁b<fim_middle>", 24)),
    ({"n_predict": 1}, 500, "[json.exception.out_of_range.403] key 'input_suffix' not found"),
    ({"input_suffix": "b"}, 500, "[json.exception.out_of_range.403] key 'input_prefix' not found"),
    ({"input_prefix": 5, "input_suffix": "b"}, 500,
     "[json.exception.type_error.302] type must be string, but is number"),
    ({"input_prefix": ["a", None], "input_suffix": "b"}, 500,
     "[json.exception.type_error.302] type must be number, but is null"),
    ([], 500, "[json.exception.type_error.305] cannot use operator[] with a string argument "
     "with array"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]}, 400,
     'extra_context chunk must contain a "text" field with a string value'),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "expected"), INFILL)
async def test_infill_as_the_real_server(
    client: TestClient[Any, Any], body: Any, status: int, expected: Any
) -> None:
    response = await client.post("/infill", json=body)
    assert response.status == status
    result = json.loads(await response.read())
    if status == 200:
        assert (result["prompt"], result["tokens_evaluated"]) == expected
    else:
        kind = "server_error" if status == 500 else "invalid_request_error"
        assert result == {"error": {"code": status, "message": expected, "type": kind}}
