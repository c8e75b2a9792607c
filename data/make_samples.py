"""Rebuild the sample corpora in this folder from the team's shared corpora.

    python data/make_samples.py [/work/shared/corpora]

Deterministic: the same inputs give byte-identical outputs.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
N_FORTUNES = 3000
PLAY = "Hamlet"


def fortunes(src: Path) -> list[str]:
    """The first N_FORTUNES records of fortunes.txt.gz (separated by lines holding '%')."""
    text = gzip.decompress(src.read_bytes()).decode("utf-8")
    records = (r.strip("\n").rstrip() for r in re.split(r"(?m)^%\n", text))
    return [r for r in records if r.strip()][:N_FORTUNES]


def speeches(src: Path, play: str) -> list[str]:
    """One line per speech of `play`: speaker names, headings and stage directions dropped."""
    lines = gzip.decompress(src.read_bytes()).decode("utf-8").splitlines()
    start = lines.index(f"# {play}")
    out: list[str] = []
    current: list[str] = []
    in_direction = False  # stage directions (_..._) may span several lines
    for line in lines[start + 1 :]:
        stripped = line.strip()
        if stripped.startswith("# ") and not stripped.startswith("# EPILOGUE"):
            break  # the next play
        if not in_direction and stripped.startswith("_"):
            in_direction = True
        is_markup = (
            in_direction
            or not stripped
            or stripped.startswith("#")
            or (stripped.startswith("**") and stripped.endswith("**"))
        )
        if in_direction and stripped.endswith("_"):
            in_direction = False
        if is_markup:
            if current:
                out.append(" ".join(current))
                current = []
            continue
        current.append(stripped)
    if current:
        out.append(" ".join(current))
    return out


def main(corpora: Path) -> None:
    with open(HERE / "fortunes-sample.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for record in fortunes(corpora / "fortunes.txt.gz"):
            f.write(json.dumps({"text": record}, ensure_ascii=False) + "\n")
    with open(HERE / "shakespeare-sample.txt", "w", encoding="utf-8", newline="\n") as f:
        for speech in speeches(corpora / "shakespeare.md.gz", PLAY):
            f.write(speech + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/shared/corpora"))
