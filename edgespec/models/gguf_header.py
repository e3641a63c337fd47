"""Read a GGUF file's metadata (the key/value header) without touching its tensors.

Enough to tell what a file is (architecture, context length, chat template,
quantization) and whether two files can be paired for speculation, in a fraction
of a second and a few MB of memory whatever the model's size.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (versions 2 and 3).
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from edgespec.config import expand_home, open_kept
from edgespec.errors import ModelFileError
from edgespec.models.compat import VocabInfo

GGUF_MAGIC = b"GGUF"

# value type id -> struct format of one value (strings and arrays are handled apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}
"""llama.cpp's llama_ftype values (general.file_type) by name."""

_WANTED_ARRAYS = {"tokenizer.ggml.tokens"}
"""Arrays worth reading; all others (scores, merges, ...) are skipped over."""

# llama.cpp adds BOS by default for these tokenizer kinds unless the file says otherwise
_ADD_BOS_BY_DEFAULT = {"llama", "bert"}
_ADD_BOS_BY_DEFAULT_PRE = {"llama3", "llama-bpe", "falcon3", "tekken"}


def check_magic(path: str | Path) -> Path:
    """The path, after checking that it exists and starts like a GGUF file."""
    path = expand_home(path, what="model file")
    if not path.exists():
        raise ModelFileError(f"{path}: no such file. Pass the path of a .gguf model file or a model name "
                             f"(`edgespec models` lists them).")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory; pass the .gguf file inside it.")
    try:
        with open_kept(path) as f:  # a regular file, as llama.cpp maps it: a FIFO would block the open
            head = f.read(4)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read it ({e.strerror or e}).") from e
    if head != GGUF_MAGIC:
        what = "is empty" if not head else f"starts with {head!r}, not b'GGUF'"
        raise ModelFileError(
            f"{path} is not a GGUF model file (it {what}). Use a .gguf file (llama.cpp's format); "
            f"if it was downloaded, the download may have failed: fetch it again.")
    return path


def read_metadata(path: str | Path, *, tensor_sizes: dict[str, int] | None = None) -> dict[str, Any]:
    """The header's scalar keys as stored ("general.architecture", "tokenizer.chat_template",
    ...), plus friendly ones: "architecture", "name", "context_length", "chat_template",
    "file_type" (e.g. "Q4_K_M"), "n_vocab" and "gguf_version". `tensor_sizes`, if given,
    is filled with each tensor's size in bytes by name."""
    header = _read_header(path, with_tokens=False, tensor_sizes=tensor_sizes)
    meta = {k: v for k, v in header.items() if not isinstance(v, list)}
    arch = meta.get("general.architecture")
    ftype = meta.get("general.file_type")
    meta.update(
        architecture=arch,
        name=meta.get("general.name"),
        context_length=meta.get(f"{arch}.context_length"),
        chat_template=meta.get("tokenizer.chat_template"),
        file_type=FILE_TYPES.get(ftype, str(ftype)) if ftype is not None else None,
    )
    return meta


def read_tensor_sizes(path: str | Path) -> tuple[dict[str, Any], dict[str, int]]:
    """read_metadata's keys and each tensor's size in bytes by name ("blk.0.attn_q.weight",
    "output.weight", ...): what placing a model's layers on devices needs to know."""
    sizes: dict[str, int] = {}
    return read_metadata(path, tensor_sizes=sizes), sizes


def read_vocab_info(path: str | Path) -> VocabInfo:
    """What speculative pairing needs to know about the file's vocabulary."""
    header = _read_header(path, with_tokens=True)
    tokens = header.get("tokenizer.ggml.tokens")
    vocab_type = header.get("tokenizer.ggml.model")
    if tokens is None or vocab_type is None:
        raise ModelFileError(f"{path}: the GGUF header has no tokenizer (tokenizer.ggml.model/tokens); "
                             f"it cannot be used for chat.")
    pre = header.get("tokenizer.ggml.pre")
    add_bos = header.get("tokenizer.ggml.add_bos_token")
    if add_bos is None:
        add_bos = vocab_type in _ADD_BOS_BY_DEFAULT or pre in _ADD_BOS_BY_DEFAULT_PRE
    return VocabInfo(
        vocab_type=str(vocab_type),
        tokens=tokens,
        bos=header.get("tokenizer.ggml.bos_token_id"),
        eos=header.get("tokenizer.ggml.eos_token_id"),
        add_bos=bool(add_bos),
    )


def _read_header(path: str | Path, *, with_tokens: bool, tensor_sizes: dict[str, int] | None = None) -> dict[str, Any]:
    path = check_magic(path)
    try:
        with path.open("rb") as f:
            reader = _Reader(f)
            reader.read(4)  # magic
            version = reader.scalar("<I")
            if version not in (2, 3):
                raise ModelFileError(f"{path}: GGUF version {version} is not supported (only 2 and 3); "
                                     f"convert it again with a recent llama.cpp.")
            n_tensors = reader.scalar("<Q")
            size = path.stat().st_size
            if n_tensors * _MIN_TENSOR_INFO > size:
                raise ValueError(f"it lists {n_tensors} tensors, more than a file of {size} bytes can hold")
            n_kv = reader.scalar("<Q")
            header: dict[str, Any] = {"gguf_version": version}
            for _ in range(n_kv):
                key = reader.string()
                vtype = reader.scalar("<I")
                if vtype == _ARRAY:
                    header[key] = reader.array(want=with_tokens and key in _WANTED_ARRAYS)
                else:
                    header[key] = reader.value(vtype)
            sizes = _check_tensors(reader, n_tensors, header.get("general.alignment", 32), size)
            if tensor_sizes is not None:
                tensor_sizes.update(sizes)
    except (struct.error, EOFError, UnicodeDecodeError, ValueError) as e:
        raise ModelFileError(f"{path}: the GGUF file is truncated or corrupt ({e}); "
                             f"the file is damaged: fetch it again.") from e
    tokens = header.get("tokenizer.ggml.tokens")
    if isinstance(tokens, _Skipped):
        header["n_vocab"] = tokens.count
    elif isinstance(tokens, list):
        header["n_vocab"] = len(tokens)
    return {k: v for k, v in header.items() if not isinstance(v, _Skipped)}


_MAX_ARRAY_DEPTH = 8
"""Arrays inside arrays, at most (llama.cpp reads none; deeper ones would exhaust Python's stack)."""
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8
"""Bytes of the shortest tensor entry: name length, dimension count, type, offset."""
_MAX_DIMS = 4
"""GGML_MAX_DIMS."""
_TYPE_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
}
"""ggml tensor type id -> (values per block, bytes per block); an unknown type counts as empty."""


def _check_tensors(reader: "_Reader", count: int, alignment: Any, size: int) -> dict[str, int]:
    """Read the tensor table and check that the file holds every tensor's data:
    a truncated download, or a header whose counts are garbage, fails here
    rather than inside llama.cpp. Returns each tensor's size in bytes by name."""
    if not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"general.alignment is {alignment!r}")
    end = 0
    sizes = {}
    for _ in range(count):
        name = reader.string()
        n_dims = reader.scalar("<I")
        if n_dims > _MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
        shape = [reader.scalar("<Q") for _ in range(n_dims)]
        block, block_bytes = _TYPE_SIZES.get(reader.scalar("<I"), (1, 0))
        offset = reader.scalar("<Q")
        sizes[name] = math.prod(shape) // block * block_bytes
        end = max(end, offset + sizes[name])
    data_start = -(-reader.f.tell() // alignment) * alignment
    if data_start + end > size:
        raise ValueError(f"its tensors need {data_start + end} bytes and the file has {size}")
    return sizes


class _Skipped:
    """An array that was stepped over; only its length is known."""

    def __init__(self, count: int):
        self.count = count


class _Reader:
    """Little-endian GGUF primitives over a buffered binary file."""

    def __init__(self, f: BinaryIO):
        self.f = f

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:  # (a skipped array may have sought past the end: the end is the file's size)
            raise EOFError(f"file ends at byte {min(self.f.tell(), os.fstat(self.f.fileno()).st_size)}, "
                           f"inside the header")
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > 1 << 30:
            raise ValueError(f"implausible string length {n}")
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        raise ValueError(f"unknown value type {vtype}")

    def array(self, *, want: bool, depth: int = 1) -> list | _Skipped:
        itype = self.scalar("<I")
        count = self.scalar("<Q")
        if count > 1 << 32:
            raise ValueError(f"implausible array length {count}")
        if itype == _ARRAY and depth >= _MAX_ARRAY_DEPTH:
            raise ValueError(f"arrays nested more than {_MAX_ARRAY_DEPTH} deep")
        if want:
            return list(self._items(itype, count, depth))
        if itype in _SCALARS:
            self.f.seek(struct.calcsize(_SCALARS[itype]) * count, 1)
        elif itype == _STRING:
            for _ in range(count):
                self.f.seek(self.scalar("<Q"), 1)
        else:
            for _ in self._items(itype, count, depth):
                pass
        return _Skipped(count)

    def _items(self, itype: int, count: int, depth: int) -> Iterator[Any]:
        if itype == _ARRAY:
            for _ in range(count):
                yield self.array(want=True, depth=depth + 1)
        elif itype in _SCALARS:
            fmt = _SCALARS[itype]
            size = struct.calcsize(fmt)
            data = self.read(size * count)
            yield from (v[0] for v in struct.iter_unpack(fmt, data))
        else:
            for _ in range(count):
                yield self.value(itype)
