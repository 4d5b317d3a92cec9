"""A GGUF file's metadata and tensor table, read in one pass with ``struct``.

The ``gguf`` package's ``GGUFReader`` builds every metadata value out of NumPy views,
one per string of a tokenizer's vocabulary and merges: about a second of SmolLM2's load,
of which the values themselves need a tenth. :func:`read_gguf` reads the same file format
(GGUF versions 2 and 3, either byte order) into the same shapes the rest of
``relayc.engine.checkpoints`` uses -- ``fields[key].contents()`` and ``.types``,
``tensors[i].name / tensor_type / shape / data`` -- with the tensors' data views of the
file's bytes, read once into memory (never memory-mapped: see :func:`read_whole`), and
``gguf``'s own type tables
(``GGMLQuantizationType``, ``GGML_QUANT_SIZES``, ``GGUFValueType``), so both readers agree
on every value and byte (tested). A file cut short, a value of an unknown type, a
duplicated tensor or a tensor past the end of the file is a ``ValueError`` saying which.
"""

from __future__ import annotations

import math
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = 0x46554747  # b"GGUF" read as a little-endian uint32
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS

# scalar value types: struct format and size
_SCALARS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
# element types a tensor's data is viewed as; every other type is its bytes
_ITEMS = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFField:
    """One metadata value: ``types`` as ``gguf`` lists them (``[ARRAY, element type]`` for
    an array, nested arrays flattened as ``gguf`` flattens them)."""

    name: str
    types: list[GGUFValueType]
    value: Any

    def contents(self) -> Any:
        return self.value


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: ``shape`` innermost dimension first (GGUF's order); ``data`` a view of the
    file's bytes in memory, as ``gguf`` gives it (elements for the plain types, else bytes
    ``[..., row bytes]``)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


@dataclass
class GGUFContents:
    fields: dict[str, GGUFField] = field(default_factory=dict)
    tensors: list[GGUFTensor] = field(default_factory=list)
    alignment: int = DEFAULT_ALIGNMENT
    data_offset: int = 0
    byte_order: Literal["<", ">"] = (
        "<"  # "<" little-endian (what llama.cpp writes on x86 and ARM), ">" big
    )


def _value_type(raw: int) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise ValueError(f"unknown value type {raw}") from None


class _Cursor:
    """Reads values in order from ``buf`` in one byte order (``<`` or ``>``)."""

    def __init__(self, buf: memoryview, order: Literal["<", ">"]) -> None:
        self.buf, self.order, self.offset = buf, order, 0
        self._u64 = struct.Struct(order + "Q")

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(self.order + fmt, self.buf, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        (size,) = self._u64.unpack_from(self.buf, self.offset)
        start = self.offset + 8
        end = start + size
        if end > len(self.buf):
            raise ValueError(f"a string of {size} bytes at byte {self.offset} runs past the end")
        self.offset = end
        return str(self.buf[start:end], "utf-8")

    def strings(self, count: int) -> list[str]:
        buf, unpack, offset, out = self.buf, self._u64.unpack_from, self.offset, []
        for _ in range(count):
            (size,) = unpack(buf, offset)
            offset += 8
            if offset + size > len(buf):
                raise ValueError(f"a string of {size} bytes at byte {offset - 8} runs past the end")
            out.append(str(buf[offset : offset + size], "utf-8"))
            offset += size
        self.offset = offset
        return out

    def value(self, kind: GGUFValueType) -> tuple[Any, list[GGUFValueType]]:
        if kind == GGUFValueType.STRING:
            return self.string(), [kind]
        fmt = _SCALARS.get(kind)
        if fmt is not None:
            return self.scalar(fmt), [kind]
        if kind == GGUFValueType.ARRAY:
            item = _value_type(self.scalar("I"))
            count = self.scalar("Q")
            if item == GGUFValueType.STRING:
                return self.strings(count), [kind, item]
            fmt = _SCALARS.get(item)
            if fmt is not None:
                size = struct.calcsize(fmt) * count
                if self.offset + size > len(self.buf):
                    raise ValueError(f"an array of {count} values runs past the end")
                dtype = np.dtype(fmt).newbyteorder(self.order)
                numbers = np.frombuffer(self.buf, dtype, count, self.offset).tolist()
                self.offset += size
                return numbers, [kind, item]
            # arrays of arrays: flattened, typed by the first element (as gguf reads them)
            values: list[Any] = []
            types: list[GGUFValueType] = [kind]
            for index in range(count):
                inner, inner_types = self.value(item)
                values.extend(inner)
                if index == 0:
                    types += inner_types
            return values, types
        raise ValueError(f"unknown value type {int(kind)}")


def read_gguf(path: str | Path) -> GGUFContents:
    """The metadata (every field, with ``gguf``'s ``GGUF.version`` / ``tensor_count`` /
    ``kv_count`` first) and tensor table of the GGUF file at ``path``."""
    plain = read_whole(path)
    if plain.size < 24:
        raise ValueError(f"{plain.size} bytes: shorter than a GGUF header")
    buf = plain.data
    try:
        return _read(plain, buf)
    except struct.error as exc:
        raise ValueError(f"the file ends inside its header ({exc})") from exc
    finally:
        buf.release()


def read_whole(path: str | Path) -> np.ndarray:
    """The bytes of the regular file ``path``, read into memory (uint8).

    Not memory-mapped: a mapped file cut short while it is read (a download or copy
    still being written, a file replaced) kills the process with SIGBUS at the first page
    past its new end. Read, a file that shrinks gives a short read, an error here. The
    loader copies every tensor into the model anyway, so the bytes are held only while it
    loads (93 MB for SmolLM2: a few tens of ms from the page cache).
    """
    # O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused just below)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        handle = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    with handle:
        size = info.st_size
        data = np.empty(size, dtype=np.uint8)
        view, done = data.data, 0
        while done < size:
            count = handle.readinto(view[done:])
            if not count:
                raise ValueError(
                    f"the file shrank while it was read ({done} of its {size} bytes came): "
                    "is it still being written?"
                )
            done += count
        view.release()
    return data


def _read(plain: np.ndarray, buf: memoryview) -> GGUFContents:
    size = plain.size
    (magic,) = struct.unpack_from("<I", buf, 0)
    if magic != MAGIC:
        raise ValueError("GGUF magic invalid")
    order: Literal["<", ">"] = "<"
    (version,) = struct.unpack_from("<I", buf, 4)
    if version & 0xFFFF == 0:  # written on a machine of the other byte order
        order = ">"
        (version,) = struct.unpack_from(">I", buf, 4)
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version}; this reader reads versions 2 and 3")
    cursor = _Cursor(buf, order)
    cursor.offset = 8
    contents = GGUFContents(byte_order=order)
    fields = contents.fields
    fields["GGUF.version"] = GGUFField("GGUF.version", [GGUFValueType.UINT32], version)
    tensor_count, kv_count = cursor.scalar("Q"), cursor.scalar("Q")
    fields["GGUF.tensor_count"] = GGUFField(
        "GGUF.tensor_count", [GGUFValueType.UINT64], tensor_count
    )
    fields["GGUF.kv_count"] = GGUFField("GGUF.kv_count", [GGUFValueType.UINT64], kv_count)
    for _ in range(kv_count):
        key = cursor.string()
        raw = cursor.scalar("I")
        try:
            value, types = cursor.value(_value_type(raw))
        except ValueError as exc:
            raise ValueError(f"metadata key `{key}`: {exc}") from exc
        fields[key] = GGUFField(key, types, value)
    table = []
    for _ in range(tensor_count):
        name = cursor.string()
        n_dims = cursor.scalar("I")
        if n_dims > MAX_DIMS:
            raise ValueError(f"tensor `{name}` has {n_dims} dimensions; GGUF allows {MAX_DIMS}")
        dims = tuple(cursor.scalar("Q") for _ in range(n_dims))
        raw_type, offset = cursor.scalar("I"), cursor.scalar("Q")
        try:
            kind = GGMLQuantizationType(raw_type)
        except ValueError as exc:
            raise ValueError(f"tensor `{name}` has unknown type {raw_type}") from exc
        table.append((name, dims, kind, offset))
    alignment = fields.get("general.alignment")
    if alignment is not None:
        if alignment.types != [GGUFValueType.UINT32] or alignment.value <= 0:
            raise ValueError("`general.alignment` must be a positive uint32")
        if alignment.value & (alignment.value - 1):
            raise ValueError("`general.alignment` must be a power of two")
        contents.alignment = alignment.value
    start = -(-cursor.offset // contents.alignment) * contents.alignment
    contents.data_offset = start
    names: set[str] = set()
    for name, dims, kind, offset in table:
        if name in names:
            raise ValueError(f"tensor `{name}` appears twice")
        names.add(name)
        elements = math.prod(dims)  # Python ints: a product past 2**63 must not wrap
        block, type_size = GGML_QUANT_SIZES[kind]
        n_bytes = elements * type_size // block
        begin = start + offset
        if begin + n_bytes > size:
            raise ValueError(
                f"tensor `{name}` ({n_bytes} bytes at byte {begin}) runs past the end of "
                f"the file ({size} bytes)"
            )
        shape = tuple(reversed(dims))
        item = _ITEMS.get(kind)
        if item is None:
            data = plain[begin : begin + n_bytes].reshape(quant_shape_to_byte_shape(shape, kind))
        else:
            data = plain[begin : begin + n_bytes].view(np.dtype(item).newbyteorder(order))
            data = data.reshape(shape)
        contents.tensors.append(GGUFTensor(name, kind, dims, elements, n_bytes, begin, data))
    return contents
