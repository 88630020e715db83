"""A real English corpus installed offline: quotations from Debian's ``fortunes`` package.

``apt-get install fortunes`` puts the fortune-cookie files (plain text, one quotation after
another, separated by lines holding ``%``) under :data:`SYSTEM_DIR`. :data:`FILES` names the
ones read and their SHA-256; every file is checked at load, and a missing one raises
``DataNotFoundError`` naming the package to install. Nothing is downloaded.

The text is read as Latin-1 (a few files hold bytes past ASCII), tabs become spaces, the
``%`` separator lines become blank lines, and a character-level tokenizer
(:class:`CharTokenizer`: printable ASCII and the newline, one id for anything else) turns it
into ids. The last :data:`VALIDATION_FRACTION` of the stream is the validation split.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from multigpu.checks import check_count
from multigpu.errors import DataError, DataNotFoundError, InputError

__all__ = ["FILES", "SYSTEM_DIR", "CharTokenizer", "TextCorpus", "load_fortunes", "next_token_windows"]

#: Where ``apt-get install fortunes`` puts the files (``dpkg -L fortunes``); ``$MULTIGPU_FORTUNES`` overrides it.
SYSTEM_DIR = Path("/usr/share/games/fortunes")
PACKAGE = "fortunes"

#: The files read, in order, with the SHA-256 of Debian's fortunes 1:1.99.1 (about 649 KB in all).
FILES: Mapping[str, str] = {
    "science": "7ab350b142ee6c70c1d8517c5a1b3790c09b190a62859427cad98e6e35a19fcc",
    "people": "2afb4b9f577be114d2dca279bc5590ee8415e1405295d7d7626c888d82f338e8",
    "wisdom": "9b0bd6b9331a68c9172219784a411c417c055ed69734edc7b4406795b87d4e94",
    "humorists": "ffdf67e1f4049133bf904b769c364de45e5ae0abfb3ea7c9afb54b87b89acfc4",
    "education": "ba13321d6d6beb7a6e65296a47450bfc87b24a319fff2e94762011b59a31aa35",
    "politics": "b56ca45a046edd5c459090a5c6b335332661b436e814b41ac87bb58065ad6131",
    "work": "ad8a0e104160e2c4782fa86e143cd60ffab2872985d4293ffd0af6df19dbfa28",
}

#: The share of the token stream (its end) held out for validation.
VALIDATION_FRACTION = 0.1


class CharTokenizer:
    """Characters to ids: the newline is 0, printable ASCII (space to ``~``) 1..95, anything else 96."""

    vocab_size = 97
    unknown = 96

    def encode(self, text: str) -> np.ndarray:
        """Return the int64 ids of ``text``'s characters."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        ids = np.where((codes >= 32) & (codes <= 126), codes - 31, self.unknown)
        return np.where(codes == 10, 0, ids)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Return the text of ``ids`` (the unknown id as ``?``); InputError for an id outside 0..96."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        if ((ids < 0) | (ids >= self.vocab_size)).any():
            raise InputError(f"id {int(ids[(ids < 0) | (ids >= self.vocab_size)][0])} is outside 0..96")
        return "".join("\n" if i == 0 else "?" if i == self.unknown else chr(int(i) + 31) for i in ids)


@dataclass
class TextCorpus:
    """A tokenized corpus split into train and validation streams, cut into next-token windows.

    ``train_ids``/``train_labels`` and ``val_ids``/``val_labels`` are ``(N, seq_len)`` int64:
    each label is the id after its position (``multigpu.parallel.token_batches``).
    """

    name: str
    tokenizer: CharTokenizer
    train_tokens: np.ndarray
    val_tokens: np.ndarray
    seq_len: int
    train_ids: np.ndarray
    train_labels: np.ndarray
    val_ids: np.ndarray
    val_labels: np.ndarray

    @property
    def vocab_size(self) -> int:
        """The number of token ids."""
        return self.tokenizer.vocab_size


def next_token_windows(tokens: np.ndarray, seq_len: int, stride: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Cut a 1-D token stream into ``(ids, labels)`` windows of ``seq_len`` tokens (labels: the next tokens).

    Windows start every ``stride`` tokens (default ``seq_len``: no overlap); raises InputError
    when the stream is shorter than one window plus one token.
    """
    tokens = np.asarray(tokens, np.int64).reshape(-1)
    stride = seq_len if stride is None else stride
    if len(tokens) < seq_len + 1:
        raise InputError(f"a stream of {len(tokens)} tokens is too short for one window of seq_len={seq_len}")
    starts = np.arange(0, len(tokens) - seq_len, stride)
    idx = starts[:, None] + np.arange(seq_len)[None, :]
    return tokens[idx], tokens[idx + 1]


def _read_checked(folder: Path, name: str, sha256: str) -> bytes:
    path = folder / name
    if not path.is_file():
        raise DataNotFoundError(
            f"the corpus file {path} is missing; install the Debian package {PACKAGE!r} "
            f"(apt-get install {PACKAGE}) or point $MULTIGPU_FORTUNES at a folder holding {list(FILES)}"
        )
    data = path.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise DataError(
            f"{path} has SHA-256 {got}, not {sha256} (Debian's {PACKAGE} 1:1.99.1); reinstall the package "
            f"(apt-get install --reinstall {PACKAGE})"
        )
    return data


def fortunes_text(folder: str | os.PathLike[str] | None = None) -> str:
    """Return the corpus text (the files of :data:`FILES`, checked, cleaned and joined)."""
    folder = Path(folder or os.environ.get("MULTIGPU_FORTUNES") or SYSTEM_DIR)
    parts = []
    for name, digest in FILES.items():
        text = _read_checked(folder, name, digest).decode("latin-1").replace("\t", " ")
        lines = ["" if line.strip() == "%" else line.rstrip() for line in text.splitlines()]
        parts.append("\n".join(lines).strip() + "\n\n")
    return "".join(parts)


def load_fortunes(
    seq_len: int = 128, folder: str | os.PathLike[str] | None = None, stride: int | None = None
) -> TextCorpus:
    """Load the fortunes corpus as a :class:`TextCorpus` of ``seq_len``-token windows.

    Training windows start every ``stride`` tokens (default ``seq_len``), validation windows
    every ``seq_len``. Raises DataNotFoundError (the package to install) or DataError (a
    file that is not Debian's).
    """
    check_count(seq_len, "seq_len", example=128)
    tok = CharTokenizer()
    tokens = tok.encode(fortunes_text(folder))
    cut = int(len(tokens) * (1 - VALIDATION_FRACTION))
    train, val = tokens[:cut], tokens[cut:]
    train_ids, train_labels = next_token_windows(train, seq_len, stride)
    val_ids, val_labels = next_token_windows(val, seq_len)
    return TextCorpus("fortunes", tok, train, val, seq_len, train_ids, train_labels, val_ids, val_labels)
