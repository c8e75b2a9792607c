"""Loading a Hugging Face ``tokenizer.json`` and tokenising text into :class:`TokenBatch`.

Padding and truncation are always switched off: a positional count must see every token
of a document, and the BERT ``tokenizer.json`` ships with padding to 128 built in, which
would otherwise add ``[PAD]`` ids at every position past the end of the text.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError, PosstatsError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["as_tokenizer", "check_tokenizer", "encode_texts", "load_tokenizer", "resolve_tokenizer", "special_token_ids",
           "tokenizer_hash", "vocab_size"]

_HASH_CHARS = 16


def _hub_cache() -> str:
    """The local Hugging Face hub cache: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ~/.cache."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def resolve_tokenizer(name: str | os.PathLike[str], /) -> str:
    """The ``tokenizer.json`` file that ``name`` names: the file itself (``file://`` allowed),
    a model folder holding one, or a model name (``org/model``) found in the local Hugging
    Face cache (offline: nothing is downloaded). Anything else is returned as given, so that
    :func:`load_tokenizer` reports it."""
    text = os.fspath(name)
    if text.startswith("file://"):
        text = text[len("file://") :]
    if os.path.isdir(text):
        inside = os.path.join(text, "tokenizer.json")
        return inside if os.path.isfile(inside) else text
    if os.path.exists(text) or not text or text.startswith((".", "/", "~")) or text.endswith(".json"):
        return text
    repo = os.path.join(_hub_cache(), "models--" + text.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    ref = os.path.join(repo, "refs", "main")
    candidates = []
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as fh:
            candidates.append(os.path.join(snapshots, fh.read().strip(), "tokenizer.json"))
    if os.path.isdir(snapshots):
        found = [os.path.join(snapshots, s, "tokenizer.json") for s in os.listdir(snapshots)]
        candidates += sorted((f for f in found if os.path.isfile(f)), key=os.path.getmtime, reverse=True)
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    return text


def load_tokenizer(path: str | os.PathLike[str], /) -> Tokenizer:
    """Load a ``tokenizer.json`` (a file, a model folder, or a model name in the local Hugging
    Face cache: :func:`resolve_tokenizer`) with padding and truncation switched off.

    Raises:
        InputError: ``"<path>: not a tokenizer.json (<reason>)"`` when the file is missing,
            unreadable, or not a tokenizer.
    """
    given = os.fspath(path)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", given) and not given.startswith("file://"):
        msg = (f"{given}: tokenizers are read from local files; copy the tokenizer.json (a few MB) next to the job, "
               "or name a model in the local Hugging Face cache (posstats pipeline mirrors tokenizer URLs itself)")
        raise InputError(msg)
    path = resolve_tokenizer(given)
    if not os.path.isfile(path):
        if not os.path.exists(path) and not given.startswith((".", "/", "~", "file://")) and not given.endswith(".json"):
            msg = (f"{given}: no such tokenizer.json, model folder, or model in the local Hugging Face cache "
                   f"({_hub_cache()}); nothing is downloaded")
            raise InputError(msg)
        reason = "is a directory" if os.path.isdir(path) else "no such file"
        msg = f"{path}: not a tokenizer.json ({reason})"
        raise InputError(msg)
    st = os.stat(path)
    return _load_file(os.path.realpath(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _load_file(path: str, mtime_ns: int, size: int, /) -> Tokenizer:
    """One parse per tokenizer file and version (``mtime_ns``, ``size``): a count reads the
    vocabulary size and special tokens first and tokenises afterwards, from one object
    (nothing changes it after this: padding and truncation are off once and for all)."""
    from tokenizers import (
        Tokenizer,  # only commands that tokenize pay its import (~30 ms)
    )

    try:
        tok = Tokenizer.from_file(path)
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception
        msg = f"{path}: not a tokenizer.json ({_one_line(exc)})"
        raise InputError(msg) from exc
    tok.no_padding()
    tok.no_truncation()
    _check_unknown_token(tok, path)
    return tok


def as_tokenizer(tokenizer: Any, /) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` for counting from a tokenizer object: a
    ``tokenizers.Tokenizer`` or a transformers *fast* tokenizer (``AutoTokenizer``'s
    default; its ``backend_tokenizer``). The result is a copy with padding and truncation
    switched off (a count must see every token; the caller's object is left as it was).

    Raises:
        InputError: a slow (pure Python) transformers tokenizer, or any other object.
    """
    from tokenizers import Tokenizer  # noqa: PLC0415 - only commands that tokenize pay its import

    backend = tokenizer
    if not isinstance(backend, Tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        kind = type(tokenizer).__name__
        hint = (" (a slow transformers tokenizer: load it with AutoTokenizer.from_pretrained(..., use_fast=True))"
                if hasattr(tokenizer, "convert_tokens_to_ids") else "")
        msg = (f"tokenizer= must be a tokenizer.json path, a model name in the local Hugging Face cache, a "
               f"tokenizers.Tokenizer or a transformers fast tokenizer; got {kind}{hint}")
        raise InputError(msg)
    tok = Tokenizer.from_str(backend.to_str())
    tok.no_padding()
    tok.no_truncation()
    return tok


def _check_unknown_token(tok: Tokenizer, path: str) -> None:
    """A WordPiece model must hold its unknown token: it fails on the first character it
    cannot split otherwise (any emoji), deep inside a count."""
    model = tok.model
    unk = getattr(model, "unk_token", None)
    if type(model).__name__ == "WordPiece" and unk and tok.token_to_id(unk) is None:
        msg = f"{path}: its WordPiece unknown token {unk!r} is not in its vocabulary; text it cannot split would fail"
        raise InputError(msg)


def tokenizer_hash(path: str | os.PathLike[str], /) -> str:
    """Fingerprint of a tokenizer file: the first 16 hex digits (64 bits) of SHA-256 of its bytes.

    Stored in count metadata so that counts made with different tokenizers are never
    merged. It hashes the file, not the loaded object, so two byte-different files that
    tokenise identically get different hashes (conservative, never the reverse).
    """
    path = resolve_tokenizer(path)
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        msg = f"{path}: not a tokenizer.json ({exc.strerror or exc})"
        raise InputError(msg) from exc
    return digest.hexdigest()[:_HASH_CHARS]


def check_tokenizer(
    recorded: Mapping[str, Any], path: str | os.PathLike[str], /, *, counts: str = "the counts"
) -> str | None:
    """Check that the tokenizer file ``path`` is the one existing counts were made with.

    Every command that takes a tokenizer together with existing counts (``analyze``
    re-reading the corpus for a noise floor, ``refresh`` adding shards to a
    run store) calls this before using it: counts and text tokenised by another tokenizer
    would mix two vocabularies without any error.

    Args:
        recorded: what the counts record: ``tokenizer_hash`` (see :func:`tokenizer_hash`)
            and, for the message, ``tokenizer`` (the file name): the metadata of
            :class:`~posstats.counting.counts.PositionalCounts`, or a run store's configuration.
        path: the tokenizer.json given now.
        counts: the counts in words for the message (their file or store).

    Returns:
        The hash of ``path``; None when the counts record no tokenizer hash. Counts
        without one were counted from token ids (``--column``): there is nothing to
        compare, so the tokenizer is accepted without reading it (the commands that
        re-read such a corpus read its token ids and do not use the tokenizer).

    Raises:
        PosstatsError: ``"<path>: tokenizer hash H1 (bert-base-uncased.tokenizer.json)
            differs from hash H2 (gpt2.tokenizer.json) recorded with <counts>; give the
            tokenizer.json the counts were made with"``.
        InputError: ``path`` is not readable.
    """
    expected = recorded.get("tokenizer_hash") or None
    if expected is None:
        return None
    actual = tokenizer_hash(path)
    if actual != expected:
        name = recorded.get("tokenizer")
        msg = (
            f"{os.fspath(path)}: tokenizer hash {actual} ({os.path.basename(os.fspath(path))}) differs from hash "
            f"{expected}{f' ({name})' if name else ''} recorded with {counts}; give the tokenizer.json the counts "
            f"were made with"
        )
        raise PosstatsError(msg)
    return actual


def vocab_size(tok: Tokenizer, /) -> int:
    """Number of token ids, added tokens included: every id is in ``[0, vocab_size)``."""
    return int(tok.get_vocab_size(with_added_tokens=True))


def special_token_ids(tok: Tokenizer, /, *, include_unk: bool = False) -> list[int]:
    """Sorted ids of the tokenizer's added tokens marked special: the default exclude list.

    BERT: ``[PAD]=0, [CLS]=101, [SEP]=102, [MASK]=103``; GPT-2: ``<|endoftext|>=50256``.

    The model's unknown token (BERT's ``[UNK]=100``) is left out unless
    ``include_unk=True``: it stands for real text the vocabulary cannot spell, so it
    occupies a position like any other token, whereas the others are markup that a model
    adds around or between documents.
    """
    unk = getattr(tok.model, "unk_token", None)
    ids = {
        int(i)
        for i, added in tok.get_added_tokens_decoder().items()
        if added.special and (include_unk or added.content != unk)
    }
    return sorted(ids)


def encode_texts(
    tok: Tokenizer,
    texts: Iterable[str],
    /,
    *,
    add_special_tokens: bool = False,
    source: str = "<memory>",
    first_row: int = 0,
) -> TokenBatch:
    """Tokenise ``texts`` in one batched (multi-threaded) call; one sequence per text.

    ``add_special_tokens=False`` (default) gives the ids of the text alone; ``True`` adds
    what the tokenizer's post-processor adds (BERT: ``[CLS] ... [SEP]``; GPT-2: nothing).
    Counting removes excluded ids before assigning positions, so with the default exclude
    list both give the same counts.

    Raises:
        InputError: when an element of ``texts`` is not a string (names ``source`` and row).

    >>> tok = load_tokenizer("data/tokenizers/gpt2.tokenizer.json")  # doctest: +SKIP
    >>> encode_texts(tok, ["Hello world"]).values.tolist()  # doctest: +SKIP
    [15496, 995]
    """
    texts = texts if isinstance(texts, list) else list(texts)
    for r, text in enumerate(texts):
        if not isinstance(text, str):
            msg = f"{source}: row {first_row + r}: expected a text string, got {text!r:.80}"
            raise InputError(msg)
    # encode_batch_fast (tokenizers >= 0.20) skips computing character offsets we never use.
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    try:
        encodings = encode(texts, add_special_tokens=add_special_tokens)
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception (a WordPiece without [UNK]...)
        msg = (f"{source}: rows {first_row}-{first_row + len(texts) - 1}: the tokenizer failed on this text "
               f"({_one_line(exc)}); fix the tokenizer.json or choose another")
        raise InputError(msg) from None
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    offsets = np.zeros(len(encodings) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.fromiter(
        itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64, count=int(offsets[-1])
    )
    return TokenBatch(values, offsets, source, first_row)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else type(exc).__name__
