"""-q, -v and --json, the same on every subcommand, and "did you mean" on a typo (issue #29)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from posstats.cli import SUBCOMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[1]
FORTUNES = str(REPO / "data" / "fortunes-sample.jsonl")
GPT2 = str(REPO / "data" / "tokenizers" / "gpt2.tokenizer.json")


def _help(command: str) -> str:
    parser = build_parser([command])
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return sub.format_help()


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_quiet_verbose_and_json_where_it_has_a_result(command):
    text = _help(command)
    assert "-q, --quiet" in text and "-v, --verbose" in text
    result = importlib.import_module(f"posstats.cli.{command}").JSON_RESULT
    assert ("--json" in text) == (result is not None), command
    if result is not None:
        assert result.split()[0] in " ".join(text.split())


def _count_args(out: Path) -> list[str]:
    return ["count", "--input", FORTUNES, "--text-column", "text", "--tokenizer", GPT2, "--positions", "32",
            "--out", str(out)]


def test_json_prints_one_document_and_moves_the_rest_to_stderr(tmp_path, capsys):
    assert main([*_count_args(tmp_path / "c"), "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # exactly one JSON document: json.loads refuses anything more
    written = json.loads((tmp_path / "c" / "count.json").read_text())
    assert doc["tokens_counted"] == written["tokens_counted"] > 0
    assert doc["fingerprint"] == written["fingerprint"]
    assert "counted" in captured.err  # the human line went to stderr


def test_quiet_prints_nothing_on_stdout_and_still_writes(tmp_path, capsys):
    assert main([*_count_args(tmp_path / "c"), "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (tmp_path / "c" / "count.json").is_file()


def test_verbose_prints_seconds_and_peak_memory(tmp_path, capsys):
    assert main([*_count_args(tmp_path / "c"), "-v"]) == 0
    err = capsys.readouterr().err
    assert "posstats: count took" in err and " s, peak memory " in err


def test_json_of_a_command_without_a_file_result(tmp_path, capsys):
    assert main(["influence", "--length", "32", "--depth", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "posstats.influence/1" and doc["config"]["length"] == 32


@pytest.mark.parametrize(("argv", "hint"), [
    (["cuont"], "(did you mean 'count'?)"),
    (["count", "--input", "x", "--out", "y", "--positons", "8"], "--positons 8 (did you mean '--positions'?)"),
    (["count", "--positons", "8"], "--positons (did you mean '--positions'?)"),  # with the required-flags error
    (["analyze", "--counts", "x", "--out", "y", "--mds-method", "dnese"], "(did you mean 'dense'?)"),
])
def test_a_typo_gets_did_you_mean(argv, hint, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert hint in capsys.readouterr().err


def test_an_unknown_encoding_gets_did_you_mean(tmp_path, capsys):
    assert main(_count_args(tmp_path / "c")) == 0
    rc = main(["analyze", "--counts", str(tmp_path / "c"), "--out", str(tmp_path / "a"), "--encodings", "sinusodial"])
    assert rc == 2
    assert "unknown encoding 'sinusodial' in 'sinusodial' (did you mean 'sinusoidal'?)" in capsys.readouterr().err


def test_no_hint_when_nothing_is_close(capsys):
    with pytest.raises(SystemExit):
        main(["count", "--input", "x", "--out", "y", "--zzzzzz", "1"])
    assert "did you mean" not in capsys.readouterr().err


def test_library_errors_name_parameters_and_the_cli_names_flags(tmp_path, capsys):
    """An OptionError names the Python parameters (dims, null_replicates); the command line
    prints its own flags (--dims, --null-replicates) in their place (issue #29)."""
    from posstats.analysis import AnalysisConfig
    from posstats.errors import OptionError

    with pytest.raises(OptionError) as info:
        AnalysisConfig(null_replicates=100_000)
    assert str(info.value).startswith("null_replicates 100000 is above 999") and "--" not in str(info.value)
    assert main(_count_args(tmp_path / "c")) == 0
    capsys.readouterr()
    rc = main(["analyze", "--counts", str(tmp_path / "c"), "--out", str(tmp_path / "a"), "--null-replicates", "100000"])
    assert rc == 2
    assert capsys.readouterr().err.startswith("posstats: error: --null-replicates 100000 is above 999")
    rc = main(["analyze", "--counts", str(tmp_path / "c"), "--out", str(tmp_path / "a"), "--null", "mp",
               "--noise-floor", "off"])
    assert rc == 2
    assert "the analytic null (--null mp) needs a noise floor (not --noise-floor off)" in capsys.readouterr().err


def test_an_error_names_each_option_as_the_users_interface_spells_it():
    """The same OptionError reads with the command's own flags, the flag of the command that
    sets an option it lacks (export naming the analysis' --dims), or, for a command configured
    by a pipeline TOML, the file's keys ([geometry] dims) where it has no flag."""
    from posstats.cli import build_parser
    from posstats.errors import OptionError
    from posstats.jobs.guard import error_text

    exc = OptionError("re-analyse with larger {dims}, or use another {store} ({null_replicates})")
    assert str(exc) == "re-analyse with larger dims, or use another store (null_replicates)"
    export = build_parser(["export"]).parse_args(["export", "run", "--out", "x.safetensors", "--dim", "8"])
    assert error_text(exc, export) == "re-analyse with larger --dims, or use another --store (--null-replicates)"
    pipeline = build_parser(["pipeline"]).parse_args(["pipeline", "--config", "p.toml"])
    assert error_text(exc, pipeline) == ("re-analyse with larger [geometry] dims, or use another --store "
                                         "([geometry] null_replicates)")


def test_triples_are_bounded_before_any_work(tmp_path, capsys):
    """--encoding-triples / --corpus-triples size three index arrays: refused in one line
    (naming the flag) outside [1, 20,000,000]; the same bound holds for the library."""
    from posstats.analysis import AnalysisConfig
    from posstats.errors import PosstatsError

    with pytest.raises(PosstatsError, match="encoding_triples 20000001 is above 20,000,000"):
        AnalysisConfig(encoding_triples=20_000_001)
    assert main(_count_args(tmp_path / "c")) == 0
    capsys.readouterr()
    for flag, value, text in (("--encoding-triples", "0", "encoding triples must be an integer >= 1, got 0"),
                              ("--corpus-triples", "100000000", "--corpus-triples 100000000 is above 20,000,000")):
        rc = main(["analyze", "--counts", str(tmp_path / "c"), "--out", str(tmp_path / "a"), flag, value])
        assert rc == 2 and text in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
