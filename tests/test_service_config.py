"""posstats.service.config: the TOML schema, validation messages, overrides, the result key,
secret redaction, the refusal of credentials by `posstats submit` (issue #18.7) and the TOML
writer (round trip through tomllib)."""

from __future__ import annotations

import json
import math
import os
import socket
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.errors import PosstatsError
from posstats.service.config import (
    SCHEMA,
    apply_overrides,
    config_secrets,
    dumps_toml,
    load_config,
    parse_config,
    redact,
    redact_url,
    refuse_secrets,
    schema_rows,
    secret_env_reason,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "deploy" / "pipeline.example.toml"

MINIMAL = """
[store]
url = "store"
[input]
paths = ["corpus/*.parquet"]
column = "ids"
[count]
vocab_size = 64
"""


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_example_config_loads_and_is_complete():
    cfg = load_config(EXAMPLE)
    assert cfg.store.url == "/data/posstats-store" and cfg.store.work_dir == "/data/posstats-work"
    assert cfg.count.positions == 1024 and cfg.count.exclude_tokens == ()
    assert cfg.export_dim() == 768 and cfg.values["schedule"]["cron"] == "0 */6 * * *"
    assert cfg.analysis_config().encodings[0] == "mds"


def test_minimal_config_gets_defaults_and_paths_relative_to_the_file(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.store.url == str(tmp_path / "store")
    assert cfg.input.paths == (str(tmp_path / "corpus" / "*.parquet"),)
    assert cfg.count.positions == 512 and cfg.count.mode == "truncate" and cfg.count.exclude_tokens is None
    assert cfg.geometry.dims == (2, 16, 64) and cfg.export_dim() == 64
    assert cfg.work_dir() == str(tmp_path / "store" / "work")
    assert cfg.run_id is None and cfg.store.lock_stale_after_s == 600.0


def test_remote_urls_are_kept_and_get_a_local_work_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = load_config(write(tmp_path, MINIMAL.replace('"store"', '"s3://bucket/prefix"').replace(
        '"corpus/*.parquet"', '"s3://data/c/*.parquet"')))
    assert cfg.store.url == "s3://bucket/prefix" and cfg.input.paths == ("s3://data/c/*.parquet",)
    assert cfg.work_dir().startswith(str(tmp_path / "cache" / "posstats" / "work-"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t + "\n[cuont]\nx = 1\n", r"unknown table or key 'cuont' \(did you mean 'count'\?\)"),
        (lambda t: t.replace("vocab_size", "vocab_sise"), r"unknown key \[count\] 'vocab_sise' \(did you mean 'vocab_size'\?\)"),
        (lambda t: t.replace('url = "store"', ""), r"\[store\] url is required"),
        (lambda t: t.replace('paths = ["corpus/*.parquet"]', ""), r"\[input\] paths is required"),
        (lambda t: t.replace("vocab_size = 64", 'vocab_size = "64"'), r"\[count\] vocab_size must be an integer, got '64' \(a string\)"),
        (lambda t: t.replace("vocab_size = 64", "vocab_size = 0"), r"\[count\] vocab_size must be >= 1, got 0"),
        (lambda t: t.replace("vocab_size = 64", 'vocab_size = 64\nmode = "stride"'), r"\[count\] mode must be one of truncate, chunk, pack"),
        (lambda t: t.replace("vocab_size = 64", "vocab_size = 64\nseparator = 3"), r"separator only applies with mode = \"pack\""),
        (lambda t: t.replace('column = "ids"', 'column = "ids"\ntext_column = "t"'), "either column .* or text_column"),
        (lambda t: t.replace('column = "ids"', ""), "give column .* or tokenizer"),
        (lambda t: t.replace("vocab_size = 64", ""), "vocab_size is required when \\[input\\] has no tokenizer"),
        (lambda t: t + "\n[geometry]\ndims = [2, 0]\n", r"\[geometry\] dims must all be >= 1 \(got 0\)"),
        (lambda t: t + "\n[geometry]\ndims = []\n", r"\[geometry\] dims must not be empty"),
        (lambda t: t + "\n[geometry]\nencodings = [\"mds\", \"nope\"]\n", "unknown encoding"),
        (lambda t: t + "\n[geometry]\ndims = [3]\nencodings = [\"sinusoidal\"]\n", "even"),
        (lambda t: t + "\n[export]\ndim = 8\nrank = 9\n", r"\[export\] rank 9 exceeds the table width 8"),
        (lambda t: t + "\n[export]\nname = \"../evil\"\n", r"\[export\] name must be a plain file stem"),
        (lambda t: t + "\n[schedule]\nevery = \"soon\"\n", "invalid interval 'soon'"),
        (lambda t: t + "\n[schedule]\ncron = \"61 * * * *\"\n", "minute: 61 is outside 0-59"),
        (lambda t: t + "\n[schedule]\ntimezone = \"Mars/Olympus\"\n", "unknown time zone 'Mars/Olympus'"),
        (lambda t: t + "\n[store2]\n", "unknown table"),
        (lambda t: 'run_id = "../x"\n' + t, "invalid run id '../x'"),
        (lambda t: "store = 3\n" + t.replace("[store]\nurl = \"store\"", ""), r"\[store\] must be a table"),
        (lambda t: t + "\n[ray]\nworkers = true\n", r"\[ray\] workers must be an integer, got True \(a boolean\)"),
        (lambda t: t + "\n[store]\n", "not valid TOML"),  # a table defined twice
        (lambda t: t + "\n[count\n", "not valid TOML"),
        (lambda t: t.replace('paths = ["corpus/*.parquet"]', "paths = []"), r"\[input\] paths must not be empty"),
    ],
)
def test_bad_configs_get_one_line_messages_naming_file_table_and_key(tmp_path, edit, message):
    path = write(tmp_path, edit(MINIMAL))
    with pytest.raises(PosstatsError, match=message) as err:
        load_config(path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(str(path)) or "encoding" in str(err.value) or "even" in str(err.value)


def test_missing_and_unreadable_config_files(tmp_path):
    with pytest.raises(PosstatsError, match="no such config file"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(PosstatsError, match="is a folder"):
        load_config(tmp_path)


def test_overrides_win_and_resolve_against_the_current_folder(tmp_path, monkeypatch):
    cfg = load_config(write(tmp_path, MINIMAL))
    monkeypatch.chdir(tmp_path / ".")
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    got = apply_overrides(cfg, sets=["count.positions=128", "geometry.dims=[2, 4]", "export.layout=bert",
                                     "input.paths=['x.parquet']"],
                          run_id="v2", store="s2", workers=3, address="127.0.0.1:6379")
    assert got.count.positions == 128 and got.geometry.dims == (2, 4) and got.export.layout == "bert"
    assert got.run_id == "v2" and got.ray.workers == 3 and got.ray.address == "127.0.0.1:6379"
    assert got.store.url == str(other / "s2") and got.input.paths == (str(other / "x.parquet"),)
    assert got.count.vocab_size == 64  # untouched keys stay
    assert apply_overrides(cfg, inputs=["a.parquet", "b.parquet"]).input.paths == (
        str(other / "a.parquet"), str(other / "b.parquet"))


@pytest.mark.parametrize(
    ("item", "message"),
    [("positions=3", "expects TABLE.KEY=VALUE"), ("count.positions", "expects TABLE.KEY=VALUE"),
     ("cout.positions=3", "unknown table 'cout'"), ("count.positons=3", "unknown key \\[count\\] 'positons'"),
     ("count.positions=abc", "must be an integer")],
)
def test_bad_set_overrides(tmp_path, item, message):
    cfg = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(PosstatsError, match=message):
        apply_overrides(cfg, sets=[item])


def test_result_key_tracks_results_not_execution(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    key = cfg.result_key()
    same = [apply_overrides(cfg, workers=4), apply_overrides(cfg, run_id="x"), apply_overrides(cfg, store="/other"),
            apply_overrides(cfg, sets=["store.lock_stale_after_s=60", "schedule.every=1h",
                                       "input.storage_options={anon=true}"])]
    assert {c.result_key() for c in same} == {key}
    different = [apply_overrides(cfg, sets=["count.positions=128"]), apply_overrides(cfg, sets=["geometry.seed=1"]),
                 apply_overrides(cfg, sets=["export.dim=32"]), apply_overrides(cfg, inputs=["/x/*.parquet"])]
    assert len({c.result_key() for c in different} | {key}) == 5


def test_secrets_are_redacted_unless_asked(tmp_path):
    text = MINIMAL.replace('url = "store"', 'url = "s3://b/p"\nstorage_options = {key = "AKIA", secret = "s3cr3t", '
                                            'client_kwargs = {endpoint_url = "http://x", aws_session_token = "t"}}')
    cfg = load_config(write(tmp_path, text))
    shown = cfg.to_dict()["store"]["storage_options"]
    assert shown == {"key": "***", "secret": "***", "client_kwargs": {"endpoint_url": "http://x", "aws_session_token": "***"}}
    assert "s3cr3t" not in dumps_toml(cfg.to_dict())
    assert cfg.to_dict(secrets=True)["store"]["storage_options"]["secret"] == "s3cr3t"
    assert redact([{"password": 1}]) == [{"password": "***"}]
    assert redact({"token": ["a", "b"], "anon": True, "key": ""}) == {"token": "***", "anon": True, "key": ""}


def test_dumps_toml_round_trips_a_resolved_config(tmp_path):
    cfg = load_config(EXAMPLE)
    text = dumps_toml(cfg.to_dict())
    again = parse_config(tomllib.loads(text))
    assert again.to_dict() == cfg.to_dict() and again.result_key() == cfg.result_key()


scalars = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=20),
)
values = st.one_of(scalars, st.lists(st.integers(-1000, 1000), max_size=4), st.lists(st.text(max_size=8), max_size=4),
                   st.dictionaries(st.text(min_size=1, max_size=6), st.one_of(st.integers(), st.text(max_size=6)), max_size=3))
documents = st.dictionaries(
    st.sampled_from(list(SCHEMA)),
    st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=4),
    max_size=4,
)


@given(documents)
@settings(max_examples=200, deadline=None)
def test_dumps_toml_round_trip_property(doc):
    back = tomllib.loads(dumps_toml(doc))

    def same(a, b):
        if isinstance(a, float):
            return (math.isinf(a) and a == b) or a == b
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        return a == b

    assert same(doc, back)


def test_every_key_is_documented_in_docs_service():
    text = (REPO / "docs" / "service.md").read_text()
    missing = [name for name, *_ in schema_rows() if f"`{name}`" not in text]
    assert missing == []


def test_config_from_args_validates_the_run_id(tmp_path):
    from posstats.cli import main

    path = write(tmp_path, MINIMAL)
    assert main(["pipeline", "--config", str(path), "--run-id", "a/b", "--print-config"]) == 2


def test_print_config(tmp_path, capsys):
    from posstats.cli import main

    path = write(tmp_path, MINIMAL)
    assert main(["pipeline", "--config", str(path), "--set", "count.positions=32", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert tomllib.loads(out)["count"]["positions"] == 32
    assert os.path.isabs(tomllib.loads(out)["store"]["url"])


# ----------------------------------------------------------------------------- credentials (#18.7)

SECRET_ENV = ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "HF_TOKEN", "GITHUB_TOKEN",
              "RAY_AUTH_TOKEN", "OPENAI_API_KEY", "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING",
              "MY_DB_PASSWORD", "SOME_CLIENT_SECRET", "GPG_PASSPHRASE", "aws_secret_access_key"]
PLAIN_ENV = ["AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "POSSTATS_TEST_SHARD_DELAY",
             "HF_HUB_OFFLINE", "RAY_AUTH_MODE", "KEYBOARD_LAYOUT", "AWS_WEB_IDENTITY_TOKEN_FILE",
             "AWS_SHARED_CREDENTIALS_FILE", "GOOGLE_APPLICATION_CREDENTIALS", "RAY_AUTH_TOKEN_PATH"]


@pytest.mark.parametrize("name", SECRET_ENV)
def test_credential_env_names_are_refused(name):
    assert secret_env_reason(name, "x")
    with pytest.raises(PosstatsError, match=rf"--env {name}: refusing to send a credential") as err:
        refuse_secrets(env={"AWS_DEFAULT_REGION": "eu-west-1", name: "x"})
    assert "docs/service.md" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", PLAIN_ENV)
def test_other_env_names_are_allowed(name):
    assert secret_env_reason(name, "/var/run/secrets/x") is None
    refuse_secrets(env={name: "/var/run/secrets/x"})


def test_env_values_carrying_credentials_are_refused():
    assert "password in a URL" in secret_env_reason("DATABASE_URL", "postgres://u:pw@db/x")
    assert "access key id" in secret_env_reason("FOO", "AKIAABCDEFGHIJKLMNOP")
    # a path-named variable holding the secret itself, not its path
    assert secret_env_reason("GOOGLE_APPLICATION_CREDENTIALS", '{"type": "service_account"}')
    assert secret_env_reason("SSH_KEY_FILE", "-----BEGIN OPENSSH PRIVATE KEY-----")
    assert secret_env_reason("AWS_ENDPOINT_URL", "https://minio.internal:9000") is None


def test_config_secrets_are_found_and_refused(tmp_path):
    text = MINIMAL.replace('url = "store"', 'url = "s3://b/p"\nstorage_options = {key = "AKIA", secret = "s3cr3t", '
                                            'client_kwargs = {endpoint_url = "http://x", aws_session_token = "t"}}')
    text = text.replace('column = "ids"', 'column = "ids"\nstorage_options = {token = "anon", anon = true, '
                                          'password = "", profile = "prod"}')
    cfg = load_config(write(tmp_path, text))
    assert config_secrets(cfg) == ["[store] storage_options.key", "[store] storage_options.secret",
                                   "[store] storage_options.client_kwargs.aws_session_token"]
    with pytest.raises(PosstatsError, match=r"p.toml: \[store\] storage_options.key \(and 2 more\) holds a "
                                            r"credential; refusing to ship it") as err:
        refuse_secrets(cfg)
    assert "s3cr3t" not in str(err.value) and "docs/service.md" in str(err.value)
    # gcsfs' token modes, booleans, empty values and profiles are not credentials
    safe = load_config(write(tmp_path, MINIMAL.replace('column = "ids"', 'column = "ids"\nstorage_options = '
                                                       '{token = "anon", anon = true, password = "", profile = "p"}')))
    assert config_secrets(safe) == []
    refuse_secrets(safe)
    assert safe.to_dict()["input"]["storage_options"]["token"] == "anon"  # not redacted into "***"


def test_passwords_in_urls_are_refused_and_redacted(tmp_path):
    text = MINIMAL.replace('url = "store"', 'url = "s3://b/p"\nstorage_options = {client_kwargs = '
                                            '{endpoint_url = "https://user:pw123@minio:9000"}}')
    text = text.replace('paths = ["corpus/*.parquet"]', 'paths = ["https://me:pw456@host/c.parquet"]')
    cfg = load_config(write(tmp_path, text))
    assert config_secrets(cfg) == [
        "[store] storage_options.client_kwargs.endpoint_url (a password in a URL)",
        "[input] paths (a password in a URL)",
    ]
    shown = dumps_toml(cfg.to_dict())
    assert "pw123" not in shown and "pw456" not in shown and "https://me:***@host/c.parquet" in shown


HEADER_SECRETS = [
    ('{client_kwargs = {headers = {Authorization = "Bearer s3cr3t-value"}}}', "Authorization"),
    ('{client_kwargs = {headers = {"X-Api" = "Basic s3cr3t-value"}}}', "an Authorization header value"),
    ('{headers = {Cookie = "session=s3cr3t-value"}}', "Cookie"),
    ('{client_kwargs = {endpoint_url = "https://h/x?X-Amz-Signature=s3cr3t-value&y=1"}}', "query string"),
    ('{client_kwargs = {endpoint_url = "https://h/x?sv=1&sig=s3cr3t-value"}}', "query string"),
    ('{extra = "hf_s3cr3tvalueabcdefghijklmn"}', "an access token"),
    ('{extra = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.s3cr3t-value"}', "a JSON web token"),
]


@pytest.mark.parametrize(("options", "found"), HEADER_SECRETS)
def test_secrets_in_headers_and_by_value_shape_are_redacted_and_refused(tmp_path, capsys, options, found):
    """Secrets hide in headers and URLs under names that say nothing ('X-Api', 'extra'):
    they are recognised by the value's shape too, never written by --print-config or the
    config stage, and refused by submit."""
    from posstats.cli import main

    path = write(tmp_path, MINIMAL.replace('column = "ids"', f'column = "ids"\nstorage_options = {options}'))
    cfg = load_config(path)
    (where,) = config_secrets(cfg)
    assert where.startswith("[input] storage_options.") and (found in where or where.endswith(found)), where
    shown = json.dumps(cfg.to_dict()) + dumps_toml(cfg.to_dict())
    assert "s3cr3t" not in shown and "***" in shown
    assert main(["pipeline", "--config", str(path), "--print-config"]) == 0
    assert "s3cr3t" not in capsys.readouterr().out
    with pytest.raises(PosstatsError, match="holds a credential; refusing to ship it") as err:
        refuse_secrets(cfg)
    assert "s3cr3t" not in str(err.value)


def test_value_shapes_that_are_not_secrets_are_left_alone():
    for value in ("s3://bucket/data/*.parquet", "https://minio.internal:9000", "Bearer", "token",
                  "https://h/x?page=2&sort=asc", "monkey", "hf_short"):
        assert redact_url(value) == value and config_secrets_of(value) == []


def config_secrets_of(value: str) -> list[str]:
    return [w for w in [secret_env_reason("SOME_VALUE", value)] if w]


def test_submit_refuses_credentials_before_contacting_the_cluster(tmp_path, capsys):
    """`posstats submit` with a credential in --env or in the config: one line, exit 2, and the
    job server (a listening socket standing in for it) is never connected to."""
    from posstats.cli import main

    plain = write(tmp_path, MINIMAL)
    secret = write(tmp_path, MINIMAL.replace('column = "ids"', 'column = "ids"\nstorage_options = '
                                             '{key = "AKIAABCDEFGHIJKLMNOP", secret = "s3cr3t-value"}'), "s.toml")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        cases = [
            (["--config", str(plain), "--env", "AWS_SECRET_ACCESS_KEY=s3cr3t-value"], "--env AWS_SECRET_ACCESS_KEY"),
            (["--config", str(plain), "--env", "AWS_SESSION_TOKEN=s3cr3t-value"], "--env AWS_SESSION_TOKEN"),
            (["--config", str(plain), "--env", "AWS_ACCESS_KEY_ID=AKIAABCDEFGHIJKLMNOP"], "--env AWS_ACCESS_KEY_ID"),
            (["--config", str(secret)], "s.toml: [input] storage_options.key (and 1 more) holds a credential"),
            (["--config", str(plain), "--set", "store.storage_options={secret='s3cr3t-value'}"],
             "[store] storage_options.secret holds a credential"),
        ]
        for extra, expected in cases:
            assert main(["submit", "--address", url, *extra]) == 2, extra
            err = capsys.readouterr().err
            assert err.startswith("posstats: error: ") and err.count("\n") == 1, err
            assert expected in err and "s3cr3t-value" not in err, err
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody knocked


def test_document_per_is_an_input_key_with_the_readers_choices(tmp_path):
    from posstats.corpus.inputs import CountOptions, InputOptions
    from posstats.corpus.readers import DOCUMENT_UNITS, FORMATS
    from posstats.counting.counts import MODES
    from posstats.options import declared_options

    choices = {d.name: d.choices for cls in (InputOptions, CountOptions) for d in declared_options(cls)}
    assert (choices["document_per"], choices["format"], choices["mode"]) == (DOCUMENT_UNITS, FORMATS, MODES)
    ok = load_config(write(tmp_path, MINIMAL.replace('column = "ids"', 'column = "ids"\ndocument_per = "paragraph"')))
    assert ok.values["input"]["document_per"] == "paragraph"
    assert load_config(write(tmp_path, MINIMAL, "q.toml")).values["input"]["document_per"] is None
    with pytest.raises(PosstatsError, match="document_per"):
        load_config(write(tmp_path, MINIMAL.replace('column = "ids"', 'column = "ids"\ndocument_per = "page"'), "r.toml"))
