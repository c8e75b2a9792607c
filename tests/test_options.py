"""Each option declared once (issue #29): the analysis options of AnalysisConfig generate the
flags of analyze / run / diff, the pipeline's [geometry] table and to_dict; this file
compares the three so that they cannot drift."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from posstats.analysis import AnalysisConfig
from posstats.cli import build_parser
from posstats.options import SAME, declared_options
from posstats.service.config import SCHEMA, parse_config, schema_rows

REPO = Path(__file__).resolve().parents[1]
DECLARED = declared_options(AnalysisConfig)


def _actions(command: str) -> dict[str, argparse.Action]:
    parser = build_parser([command])
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {a.dest: a for a in sub._actions}


def test_every_field_of_the_analysis_options_is_declared():
    fields = {f.name for f in dataclasses.fields(AnalysisConfig) if f.init}
    assert fields == {d.name for d in DECLARED}


@pytest.mark.parametrize("command", ["analyze", "run", "diff"])
def test_the_command_line_is_the_declaration(command):
    actions = _actions(command)
    for d in DECLARED:
        if not d.option.cli:
            assert d.option.why_not, d.name
            continue
        action = actions[d.name]
        assert action.option_strings == [d.flag]
        assert action.default == d.default, d.name
        assert (tuple(action.choices) if action.choices else None) == d.choices, d.name
        assert action.help.replace("%%", "%").startswith(d.option.help), d.name


def test_the_pipeline_table_is_the_declaration():
    geometry = SCHEMA["geometry"]
    wanted = {d.name: d for d in DECLARED if d.option.pipeline}
    assert set(geometry) == set(wanted)
    for d in DECLARED:
        if not d.option.pipeline:
            assert d.option.why_not, d.name
    for name, key in geometry.items():
        d = wanted[name]
        assert key.kind == d.kind and key.help == d.option.help
        assert key.default == (d.default if d.option.config_default == SAME else d.option.config_default)


def test_to_dict_is_every_option_but_the_limits():
    doc = AnalysisConfig(dims=(2,)).to_dict()
    assert set(doc) == {d.name for d in DECLARED if not d.option.limit} | {"sweeps"}


def test_a_new_pipeline_key_reaches_the_analysis():
    cfg = parse_config({"store": {"url": "/tmp/s"}, "input": {"paths": ["/tmp/x"], "column": "ids"},
                        "count": {"vocab_size": 10},
                        "geometry": {"null_replicates": 99, "buckets": "log:8", "exact_limit": 512, "null": "mp"}})
    analysis = cfg.analysis_config()
    assert (analysis.null_replicates, analysis.buckets, analysis.exact_limit, analysis.null) == (99, "log:8", 512, "mp")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("null", "maybe", "must be one of auto, shuffle, mp, none"),
    ("noise_parts", 3, "must be one of 2, 4"),
    ("stress_halfwidth", 0.0, "must be > 0"),
    ("dims", [2, 0], "must all be >= 1 (got 0)"),
])
def test_a_bad_pipeline_value_is_refused_by_the_declared_rule(key, value, message):
    from posstats.errors import PosstatsError

    with pytest.raises(PosstatsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config({"store": {"url": "/tmp/s"}, "input": {"paths": ["/tmp/x"], "column": "ids"},
                      "count": {"vocab_size": 10}, "geometry": {key: value}})


def test_the_docs_table_is_the_schema():
    """docs/service.md's key table is exactly schema_rows() (rewrite it from there)."""
    text = (REPO / "docs" / "service.md").read_text()
    rows = [f"| `{k}` | {kind} | {d} | {h.replace('|', chr(92) + '|')} |" for k, kind, d, h in schema_rows()]
    table = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert [r for r in rows if r not in table] == []
