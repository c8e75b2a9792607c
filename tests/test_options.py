"""Each option declared once (issue #29): the analysis options of AnalysisConfig generate the
flags of analyze / run / diff, the pipeline's [geometry] table and to_dict; the export
options of ExportOptions the flags of export and the pipeline's [export] table; InputOptions
and CountOptions the input and counting flags of count / run and the pipeline's [input] and
[count] tables. This file compares them so that they cannot drift."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from posstats.analysis import AnalysisConfig
from posstats.cli import build_parser
from posstats.errors import PosstatsError
from posstats.options import SAME, declared_options
from posstats.reports.export import ExportOptions
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


EXPORT = declared_options(ExportOptions)


def test_every_field_of_the_export_options_is_declared():
    assert {f.name for f in dataclasses.fields(ExportOptions)} == {d.name for d in EXPORT}


def test_the_export_command_line_is_the_declaration():
    actions = _actions("export")
    for d in EXPORT:
        action = actions[d.name]
        assert action.option_strings == [d.flag], d.name
        if d.kind == "bool":  # a switch flips the default
            assert isinstance(action, argparse._StoreFalseAction if d.default else argparse._StoreTrueAction), d.name
            continue
        assert action.default == ([] if d.option.repeat else d.default), d.name
        assert (tuple(action.choices) if action.choices else None) == d.choices, d.name
        assert action.help.replace("%%", "%").startswith(d.option.help), d.name
    assert actions["card"].option_strings == ["--no-card"] and actions["datasets"].option_strings == ["--dataset"]
    # what is not an option of the table: the run, the file, overwriting, the model folder
    assert set(actions) - {d.name for d in EXPORT} == {"help", "run_dir", "out", "force", "for_model", "match_norm",
                                                       "json", "quiet", "verbose"}


def test_the_pipeline_export_table_is_the_declaration():
    table = SCHEMA["export"]
    wanted = {d.name: d for d in EXPORT if d.option.pipeline}
    assert set(table) == set(wanted) | {"name"}  # name: the file's stem in export/
    assert all(d.option.why_not for d in EXPORT if not d.option.pipeline)
    for name, d in wanted.items():
        key = table[name]
        assert key.kind == d.kind
        if name != "dim":  # the pipeline's default width is the largest [geometry] dims
            assert key.help == d.option.help, name
            assert key.default == (d.default if d.option.config_default == SAME else d.option.config_default), name


def test_a_pipeline_export_key_reaches_the_export():
    from posstats.jobs.pipeline import _export_options

    cfg = parse_config({"store": {"url": "/tmp/s"}, "input": {"paths": ["/tmp/x"], "column": "ids"},
                        "count": {"vocab_size": 10}, "geometry": {"dims": [2, 8], "seed": 3},
                        "export": {"rank": 2, "rows": 6, "prefix": "bert.", "datasets": ["wiki"], "min_tokens": 4}})
    opts = _export_options(cfg)
    assert isinstance(opts, ExportOptions)
    assert (opts.dim, opts.rank, opts.rows, opts.prefix, opts.datasets, opts.min_tokens, opts.seed, opts.layout) == (
        8, 2, 6, "bert.", ("wiki",), 4, 3, "plain")


def _counting_declared():
    from posstats.corpus.inputs import CountOptions, InputOptions

    return {"input": declared_options(InputOptions), "count": declared_options(CountOptions)}


@pytest.mark.parametrize("command", ["count", "run"])
def test_the_input_and_counting_flags_are_the_declaration(command):
    actions = _actions(command)
    for d in [*_counting_declared()["input"], *_counting_declared()["count"]]:
        action = actions[d.name]
        assert action.option_strings == [d.flag], d.name
        if d.kind == "bool":
            assert isinstance(action, argparse._StoreTrueAction), d.name
            continue
        assert action.default == d.default, d.name
        assert (tuple(action.choices) if action.choices else None) == d.choices, d.name
        assert action.help.replace("%%", "%").startswith(d.option.help), d.name


def test_the_pipeline_input_and_count_tables_are_the_declaration():
    manual = {"input": {"paths", "storage_options"}, "count": {"shard_size_mib", "skip_bad_shards"}}
    for table, declared in _counting_declared().items():
        wanted = {d.option.key or d.name: d for d in declared if d.option.pipeline}
        assert set(SCHEMA[table]) == set(wanted) | manual[table], table
        assert all(d.option.why_not for d in declared if not d.option.pipeline)
        for name, d in wanted.items():
            key = SCHEMA[table][name]
            assert key.kind == (d.option.config_kind or d.kind) and key.help == d.option.help, name
            assert key.default == d.default, name
    assert "memory_budget_gib" in SCHEMA["count"]  # the config's name says its unit
    assert SCHEMA["input"]["tokenizer"].kind == "url"  # read relative to the config file


def test_pipeline_input_and_count_keys_reach_the_count():
    from posstats.corpus.inputs import CountOptions, InputOptions

    cfg = parse_config({"store": {"url": "/tmp/s"}, "input": {"paths": ["/tmp/x"], "column": "ids", "format": "jsonl"},
                        "count": {"vocab_size": 10, "positions": 16, "exclude_tokens": [], "memory_budget_gib": 0.5}})
    assert cfg.input_options() == InputOptions(column="ids", format="jsonl")
    counting = cfg.count_options()
    assert counting == CountOptions(positions=16, vocab_size=10, exclude_tokens=(), memory_budget=0.5)
    assert counting.budget_bytes == 2**29


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"positions": 0}, "positions must be >= 1; got 0"),
    ({"mode": "slide"}, "mode must be one of truncate, chunk, pack; got 'slide'"),
    ({"separator": 3}, "separator only applies in pack mode"),
    ({"memory_budget": 0.0}, "memory_budget must be > 0; got 0.0"),
])
def test_count_options_refuse_by_the_declared_rule(kwargs, message):
    from posstats.corpus.inputs import CountOptions
    from posstats.errors import OptionError

    with pytest.raises(OptionError, match=message.replace("(", r"\(")):
        CountOptions(**kwargs)


@pytest.mark.parametrize("value", [-1, 1025])
def test_geometry_ranges_is_bounded(value):
    """[ray] geometry_ranges starts one Ray actor per range: a config value cannot ask for more
    than 1,024 (or a negative count)."""
    with pytest.raises(PosstatsError, match="geometry_ranges"):
        parse_config({"store": {"url": "/tmp/s"}, "input": {"paths": ["/tmp/x"], "column": "ids"},
                      "count": {"vocab_size": 10}, "ray": {"geometry_ranges": value}})
