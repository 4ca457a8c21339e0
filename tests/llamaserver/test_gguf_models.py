"""The tiny GGUF writer: what it writes, read back with gguf's own reader."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from tests.llamaserver.gguf_models import (
    BYTE_BASE,
    EOS_ID,
    FIM_TOKENS,
    PRINTABLE,
    write_models_dir,
    write_tiny_llama,
)


def field(reader: gguf.GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


def test_header_says_llama_with_the_requested_shape(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=3, n_embd=32, n_head=4, n_head_kv=1)
    reader = gguf.GGUFReader(path)
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "general.name") == "m"
    assert field(reader, "llama.block_count") == 3
    assert field(reader, "llama.embedding_length") == 32
    assert field(reader, "llama.attention.head_count") == 4
    assert field(reader, "llama.attention.head_count_kv") == 1
    assert field(reader, "llama.context_length") == 512
    assert field(reader, "tokenizer.ggml.model") == "llama"
    assert "add_generation_prompt" in str(field(reader, "tokenizer.chat_template"))
    names = {t.name for t in reader.tensors}
    assert {f"blk.{i}.ffn_down.weight" for i in range(3)} <= names
    assert "blk.3.attn_q.weight" not in names
    k = next(t for t in reader.tensors if t.name == "blk.0.attn_k.weight")
    assert list(k.shape) == [32, 8]  # ne0 = n_embd, ne1 = n_head_kv * head_dim


def test_vocabulary_is_byte_level_with_special_tokens(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "m.gguf"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[BYTE_BASE + 0x0A] == "<0x0A>"
    assert len(tokens) == 3 + 256
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[BYTE_BASE] == gguf.TokenType.BYTE
    assert field(reader, "tokenizer.ggml.eos_token_id") == EOS_ID
    assert "tokenizer.ggml.pooling_type" not in reader.fields
    assert "llama.pooling_type" not in reader.fields
    assert "tokenizer.ggml.fim_pre_token_id" not in reader.fields


def test_fim_and_embedding_options(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "m.gguf", embedding=True, fim=True))
    assert field(reader, "tokenizer.ggml.tokens")[-3:] == list(FIM_TOKENS)
    fim_ids = [field(reader, f"tokenizer.ggml.fim_{k}_token_id") for k in ("pre", "suf", "mid")]
    assert fim_ids == [259, 260, 261]
    assert field(reader, "llama.pooling_type") == gguf.PoolingType.MEAN
    assert field(reader, "llama.vocab_size") == 3 + 256 + 3


def test_output_rows_ban_everything_but_printable_ascii(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "m.gguf"))
    output = next(t for t in reader.tensors if t.name == "output.weight").data
    anchor = output[:, 0].astype(np.float32)
    allowed = [BYTE_BASE + b for b in PRINTABLE]
    assert np.all(anchor[allowed] == 0.0)
    assert np.all(np.delete(anchor, allowed) < -100.0)
    for name in ("blk.0.attn_output.weight", "blk.1.ffn_down.weight"):
        rows = next(t for t in reader.tensors if t.name == name).data
        assert not rows[0].any()  # the anchor dimension is never written by a layer


def test_size_bounds_and_seeds(tmp_path: Path) -> None:
    a = write_tiny_llama(tmp_path / "a.gguf", seed=1)
    b = write_tiny_llama(tmp_path / "b.gguf", seed=2)
    big = write_tiny_llama(tmp_path / "big.gguf", n_layer=4, n_ff=256)
    assert 100_000 < a.stat().st_size < 400_000
    assert a.stat().st_size < big.stat().st_size < 1_000_000
    assert a.read_bytes() != b.read_bytes()
    assert write_tiny_llama(tmp_path / "a2.gguf", seed=1, name="a").read_bytes() == a.read_bytes()


def test_models_dir_names_files_as_the_router_lists_them(tmp_path: Path) -> None:
    paths = write_models_dir(tmp_path / "models", ["alpha", "beta", "gamma"])
    assert [p.name for p in paths] == ["alpha.gguf", "beta.gguf", "gamma.gguf"]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [p.name for p in paths]
    names = [field(gguf.GGUFReader(p), "general.name") for p in paths]
    assert names == ["alpha", "beta", "gamma"]
    assert len({p.read_bytes() for p in paths}) == 3


@pytest.mark.parametrize("bad", ["", "a/b", "vision-mmproj"])
def test_models_dir_refuses_names_the_router_would_not_list(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        write_models_dir(tmp_path, [bad])
