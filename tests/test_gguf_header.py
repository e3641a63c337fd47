"""Reading GGUF headers without the weights: metadata, vocabularies, broken files,
and pairing checks on real files (the bundled Qwen pair, SmolLM2)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from edgespec.errors import ModelFileError
from edgespec.models.compat import pairing_problems
from edgespec.models.gguf_header import read_metadata, read_vocab_info


def write_header(path: Path, *, tokens=("<unk>", "<s>", "</s>", "a", "b"), model="llama", pre=None,
                 add_bos=None, bos=1, eos=2, template="{{ messages }}", arch="llama") -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test model")
    w.add_context_length(2048)
    w.add_file_type(15)
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(list(tokens))
    w.add_token_scores([0.0] * len(tokens))
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_metadata_has_the_scalar_keys_and_friendly_names(tmp_path):
    meta = read_metadata(write_header(tmp_path / "m.gguf"))
    assert meta["general.architecture"] == meta["architecture"] == "llama"
    assert meta["name"] == "tiny test model"
    assert meta["context_length"] == 2048
    assert meta["file_type"] == "Q4_K_M"
    assert meta["chat_template"] == "{{ messages }}"
    assert meta["n_vocab"] == 5
    assert "tokenizer.ggml.tokens" not in meta and "tokenizer.ggml.scores" not in meta


def test_vocab_info(tmp_path):
    info = read_vocab_info(write_header(tmp_path / "m.gguf"))
    assert info.vocab_type == "llama" and list(info.tokens) == ["<unk>", "<s>", "</s>", "a", "b"]
    assert (info.bos, info.eos, info.add_bos) == (1, 2, True)


@pytest.mark.parametrize("model, pre, add_bos, expected", [
    ("llama", None, None, True),       # SentencePiece adds BOS unless told not to
    ("gpt2", "qwen2", None, False),    # BPE does not ...
    ("gpt2", "llama-bpe", None, True),  # ... except Llama 3's
    ("gpt2", "qwen2", True, True),     # the file's own key wins
    ("llama", None, False, False),
])
def test_add_bos_follows_llama_cpp_defaults(tmp_path, model, pre, add_bos, expected):
    path = write_header(tmp_path / "m.gguf", model=model, pre=pre, add_bos=add_bos)
    assert read_vocab_info(path).add_bos is expected


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ModelFileError, match="not a GGUF model file"):
        read_metadata(path)


def test_a_truncated_header_is_reported_as_damaged(tmp_path):
    full = write_header(tmp_path / "full.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full[:60])
    with pytest.raises(ModelFileError, match="truncated or corrupt.*fetch it again"):
        read_vocab_info(cut)


def test_an_unsupported_version_is_reported(tmp_path):
    data = bytearray(write_header(tmp_path / "m.gguf").read_bytes())
    data[4:8] = (1).to_bytes(4, "little")
    path = tmp_path / "v1.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="GGUF version 1 is not supported"):
        read_metadata(path)


def test_a_file_without_a_tokenizer_cannot_give_vocab_info(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="no tokenizer"):
        read_vocab_info(tmp_path / "bare.gguf")


def test_only_the_header_is_read(tmp_path):
    """A header followed by gigabytes (sparse here) reads as fast as the header alone."""
    path = write_header(tmp_path / "big.gguf")
    with path.open("r+b") as f:
        f.truncate(8 << 30)
    assert read_vocab_info(path).n_tokens == 5


def test_synthetic_models_agree_with_the_pairing_rules(synth_target, synth_near_draft, synth_other_vocab):
    target = read_vocab_info(synth_target)
    assert pairing_problems(target, read_vocab_info(synth_near_draft)) == []
    assert pairing_problems(target, read_vocab_info(synth_other_vocab))


# --- real files ----------------------------------------------------------------------------------

@pytest.mark.qwen
def test_the_bundled_qwen_pair_is_compatible(qwen_pair):
    _, target, draft = qwen_pair
    t, d = read_vocab_info(target), read_vocab_info(draft)
    assert t.n_tokens == d.n_tokens == 151936 and t.vocab_type == "gpt2"
    assert pairing_problems(t, d) == []
    meta = read_metadata(target)
    assert meta["architecture"] == "qwen2" and meta["file_type"] == "Q4_K_M"
    assert meta["context_length"] == 32768 and "<|im_start|>" in meta["chat_template"]


@pytest.mark.qwen
def test_smollm2_cannot_draft_for_qwen(qwen_pair, smollm2):
    _, target, _ = qwen_pair
    problems = pairing_problems(read_vocab_info(target), read_vocab_info(smollm2))
    assert any("draft vocab has 49152 tokens, target 151936" in p for p in problems)


def test_an_absurd_tensor_count_is_reported_as_damaged(tmp_path):
    data = bytearray(write_header(tmp_path / "m.gguf").read_bytes())
    data[8:16] = (10 ** 12).to_bytes(8, "little")  # the tensor count, right after magic and version
    path = tmp_path / "absurd.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="10+ tensors, more than a file of .* can hold.*fetch it again"):
        read_metadata(path)


def test_a_file_cut_inside_its_tensor_data_is_reported_as_damaged(tmp_path):
    from tests.synthetic import write_model

    whole = write_model(tmp_path / "whole.gguf").read_bytes()
    assert read_metadata(tmp_path / "whole.gguf")["architecture"] == "llama"
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:-1000])
    with pytest.raises(ModelFileError, match=rf"tensors need \d+ bytes and the file has {len(whole) - 1000}"):
        read_vocab_info(cut)


def test_the_tensor_sizes_are_ggml_s():
    from edgespec.models.gguf_header import _TYPE_SIZES

    for type_id, sizes in _TYPE_SIZES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)] == sizes


def test_arrays_nested_past_any_use_are_reported_as_damaged(tmp_path):
    """A header value of 5,000 arrays each inside the next ended in a RecursionError
    traceback (llama.cpp itself reads no array of arrays)."""
    import struct

    depth = 5000
    value = struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)  # array of array ... of an empty uint32 array
    key = b"general.nested"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 9) + value
    path = tmp_path / "deep.gguf"
    path.write_bytes(header)
    with pytest.raises(ModelFileError, match="nested"):
        read_metadata(path)


def test_a_file_cut_inside_a_skipped_array_says_where_it_ends(tmp_path):
    """An array skipped with a seek (the tokens, when only metadata is read) may seek past
    the end: the message gave that position (5,000,009 for a file of 5,000,000 bytes)."""
    full = write_header(tmp_path / "full.gguf", tokens=tuple(f"t{i}" for i in range(2000))).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full[: len(full) // 2])
    with pytest.raises(ModelFileError, match=rf"file ends at byte {len(full) // 2}\b"):
        read_metadata(cut)
