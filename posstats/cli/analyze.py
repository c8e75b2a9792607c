"""``posstats analyze``: geometry, MDS and encoding stress from saved counts."""

from __future__ import annotations

import argparse
from pathlib import Path

from posstats.cli._common import add_analysis_args, analysis_config

HELP = "analyse saved counts: Hellinger geometry, MDS spectrum, encoding stress"
DESCRIPTION = """\
Read counts written by 'posstats count' and compute the Hellinger geometry of the
occupied positions, classical MDS (the information-optimal encoding P_MDS, its spectrum
and rank) and, for every encoding and width, raw and scaled stress, optimal scale,
Pearson correlation, minimum separation and monotonicity (THEORY.md sections 2-6).

Writes OUT/report.json (schema in README.md; written last), OUT/report.html (figures
embedded, opens offline), OUT/figures/*.png, OUT/summary.md and OUT/report.md,
OUT/mds.safetensors (the MDS coordinates of the used positions) and
OUT/analysis-config.json, and prints a summary table.

example:
  posstats analyze --counts runs/counts --dims 2,16,64 --encodings mds,sinusoidal,rope --out runs/analysis

long contexts and honest estimates (docs/long-context.md):
  posstats analyze --counts runs/counts --buckets log:8 --noise-floor --distances corrected \
      --bootstrap 200 --out runs/analysis
The noise floor and the bootstrap need the corpus in parts: the shards of a Ray run store
(--store, or the store recorded by 'posstats count --ray'), explicit part counts (--parts),
or else the corpus named in the counts' config.json, re-read and split by document parity.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", required=True, metavar="DIR", help="folder (or file) written by 'posstats count'")
    add_analysis_args(p)
    p.add_argument("--store", metavar="DIR",
                   help="Ray run store of the counts: its shards give the noise-floor parts (by shard-id rank "
                        "parity) and the bootstrap's resampling units")
    p.add_argument("--parts", metavar="DIR,DIR[,DIR,DIR]",
                   help="2 or 4 count folders whose sum is the corpus, for the noise floor")
    p.add_argument("--tokenizer", metavar="TOKENIZER_JSON",
                   help="tokenizer for re-reading a text corpus by document parity (default: the recorded one)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.set_defaults(func=run)


BOOTSTRAP_DOCUMENT_PARTS = 16  # resampling units when the corpus is re-read (no run store)


def _corpus_config(*places) -> dict | None:
    """The counting config.json of the first place that has one."""
    import json

    for place in places:
        if place is None:
            continue
        path = Path(place)
        path = path / "config.json" if path.is_dir() else path.parent / "config.json"
        if path.is_file():
            return json.loads(path.read_text())
    return None


def _find_tokenizer(cfg: dict, override: str | None) -> str | None:
    """The tokenizer.json to re-read a text corpus with: ``override``, the recorded path, or a
    file of the recorded name (and hash) in the working directory, next to the inputs or in
    data/tokenizers."""
    from posstats.errors import PosstatsError
    from posstats.corpus.tokenizer import tokenizer_hash

    if cfg.get("column") is not None:
        return None
    if override:
        return override
    recorded = cfg.get("tokenizer")
    if not recorded:
        return None
    if Path(recorded).is_file():
        return recorded
    name = Path(recorded).name
    dirs = [Path.cwd(), Path.cwd() / "data" / "tokenizers", *(Path(i).parent for i in cfg.get("inputs", []))]
    for d in dirs:
        cand = d / name
        if cand.is_file() and (not cfg.get("tokenizer_hash") or tokenizer_hash(str(cand)) == cfg["tokenizer_hash"]):
            return str(cand)
    msg = f"cannot find the tokenizer {name!r} the corpus was counted with; give --tokenizer PATH"
    raise PosstatsError(msg)


def _reread(counts, cfg: dict | None, parts: int, tokenizer: str | None = None, counts_path=None):
    """Count the corpus of a config.json again as ``parts`` document-parity parts, with the
    tokenizer the counts were made with (checked by hash)."""
    from posstats.corpus.source import CorpusSource
    from posstats.counting.counts import CountSpec
    from posstats.errors import PosstatsError
    from posstats.estimates.noise import count_parts
    from posstats.corpus.tokenizer import check_tokenizer

    if not cfg or "inputs" not in cfg:
        msg = ("the noise floor / bootstrap needs the corpus in parts: give --store (Ray run store) or --parts, "
               "or analyse counts whose folder has the config.json written by 'posstats count'")
        raise PosstatsError(msg)
    tok_path = _find_tokenizer(cfg, tokenizer)
    if tok_path:
        check_tokenizer(counts.metadata, tok_path, counts=_describe_counts(counts_path))
    source = CorpusSource(
        inputs=tuple(cfg["inputs"]),
        format=cfg.get("format"),
        column=cfg.get("column"),
        text_column=cfg.get("text_column"),
        tokenizer=tok_path,
    )
    spec = CountSpec.from_metadata({k: str(v) for k, v in cfg.items() if k in counts.spec.to_metadata()})
    if spec != counts.spec:
        msg = f"config.json describes {spec}, but the counts were made with {counts.spec}"
        raise PosstatsError(msg)
    out = count_parts(source, spec, parts=parts, dense=not counts.is_sparse)
    if counts.fingerprint and out[0].fingerprint != counts.fingerprint:
        msg = "the corpus changed since it was counted (fingerprints differ); count it again first"
        raise PosstatsError(msg)
    return out


def _describe_counts(path=None) -> str:
    """The counts in words for messages: their file when known."""
    if path is None:
        return "the counts"
    from posstats.counting.io import counts_file

    try:
        name = counts_file(path).name
    except Exception:  # noqa: BLE001 - only for a message
        return f"the counts {path}"
    return f"the counts {Path(path) / name if Path(path).is_dir() else path}"


def _store_partials(store: str):
    from posstats.service.shard_store import RunStore, load_partial

    rs = RunStore(store)
    manifest = rs.manifest() or {}
    return [load_partial(rs.partial_dir(sid)) for sid in sorted(manifest.get("shard_ids", []))]


def corpus_parts(counts, config, *, store=None, parts_dirs=None, places=()) -> tuple:
    """(noise parts, bootstrap partials) as the analysis options ask for them."""
    from posstats.errors import PosstatsError
    from posstats.estimates.noise import parts_from_store
    from posstats.counting.io import load_counts

    cfg = _corpus_config(*places)
    where = next((p for p in reversed(places) if p is not None), None)  # the counts, for messages
    if store is None and cfg and isinstance(cfg.get("ray"), dict) and cfg["ray"].get("store"):
        if Path(cfg["ray"]["store"]).is_dir():
            store = cfg["ray"]["store"]
    parts = partials = None
    if config.noise_floor:
        if parts_dirs:
            parts = tuple(load_counts(d) for d in parts_dirs)
            if len(parts) not in (2, 4):
                raise PosstatsError(f"--parts needs 2 or 4 count folders, got {len(parts)}")
        elif store:
            parts = parts_from_store(store, parts=config.noise_parts)
        else:
            parts = _reread(counts, cfg, config.noise_parts, config.tokenizer, where)
    if config.bootstrap > 0:
        partials = (_store_partials(store) if store
                    else list(_reread(counts, cfg, BOOTSTRAP_DOCUMENT_PARTS, config.tokenizer, where)))
    return parts, partials


def analyze_to(counts, config, stage, *, counts_path=None, name=None, store=None, parts_dirs=None) -> dict:
    """Analyse ``counts`` and write mds.safetensors + report.json into ``stage``; return the report.

    A noise floor or bootstrap takes its parts from ``store`` / ``parts_dirs``, or re-reads
    the corpus named in the config.json of ``stage`` (``posstats run``) or ``counts_path``.
    """
    import numpy as np
    from safetensors.numpy import save_file

    from posstats.analysis import analyze
    from posstats.reports.html import write_html_report
    from posstats.reports.summary import format_markdown
    from posstats.counting.io import atomic_path, write_json_atomic

    write_json_atomic(stage / "analysis-config.json", config.to_dict())
    parts = partials = None
    if config.noise_floor or config.bootstrap > 0:
        parts, partials = corpus_parts(counts, config, store=store, parts_dirs=parts_dirs, places=(stage, counts_path))
    result = analyze(counts, config, parts=parts, partials=partials)
    with atomic_path(stage / "mds.safetensors") as tmp:
        save_file(
            {
                "positions": result.positions.astype("int64"),
                "eigenvalues": np.ascontiguousarray(result.mds.eigenvalues),
                "encoding": np.ascontiguousarray(result.mds.encoding),
            },
            str(tmp),
            metadata={"schema": "posstats.mds/1", "method": result.mds.method, "fingerprint": counts.fingerprint},
        )
    report = result.report()
    report["inputs"] = {"counts": str(Path(counts_path).resolve()) if counts_path else None}
    with atomic_path(stage / "report.md") as tmp:
        tmp.write_text(format_markdown(report))
    write_json_atomic(stage / "report.json", report)
    write_html_report(stage, name=name)
    return report


def run(args: argparse.Namespace) -> int:
    from posstats.runs.publish import staged_output
    from posstats.reports.summary import format_summary
    from posstats.counting.io import load_counts
    from posstats.corpus.tokenizer import check_tokenizer

    config = analysis_config(args)
    counts = load_counts(args.counts)
    if args.tokenizer:
        # even when no option re-reads the corpus: a tokenizer given with other counts is a mistake
        check_tokenizer(counts.metadata, args.tokenizer, counts=_describe_counts(args.counts))
    with staged_output(args.out, last=("report.json",)) as stage:
        report = analyze_to(counts, config, stage, counts_path=args.counts, name=Path(args.out).name,
                            store=args.store, parts_dirs=[d for d in (args.parts or "").split(",") if d] or None)
    print(format_summary(report))
    print(f"\nreport: {args.out}/report.html (summary.md, report.json)")
    return 0
