"""The pipeline configuration: a TOML file, validated, with flag overrides (pure library).

A config file has optional top-level ``run_id`` and these tables (every key optional
unless marked; the full schema with defaults is :data:`SCHEMA`, documented in
docs/service.md, and an example is ``deploy/pipeline.example.toml``)::

    run_id = "corpus-2024-06"      # default: given by --run-id, else a UTC time stamp

    [store]      url (required), work_dir, storage_options, lock_stale_after_s, heartbeat_s
    [input]      paths (required), format, column | text_column + tokenizer, storage_options, document_per
    [count]      positions, vocab_size, mode, exclude_tokens, separator, memory_budget_gib,
                 shard_size_mib, skip_bad_shards
    [ray]        address, workers, geometry_cpus, geometry_retries, geometry_ranges
    [geometry]   every option of posstats.analysis.AnalysisConfig (generated from its declaration:
                 dims, encodings, ..., null, null_replicates, buckets, exact_limit, ...) but
                 bootstrap and tokenizer, which say why (posstats.options)
    [diff]       level, drift_dim   (the diff against the previous latest run, every run)
    [report]     width, max_positions
    [export]     dim, rank, layout, format, dtype, basis, method, name, card
    [schedule]   every | cron, timezone   (defaults for 'posstats schedule')

Rules: unknown tables and keys are errors (with a suggestion), values are type-checked,
relative local paths are resolved against the config file's folder (flag values against
the current directory), and ``storage_options`` values whose key names a secret (key,
secret, token, password, credential) and passwords inside URLs are never written to the
store or printed (:func:`redact`). A configuration holding such secrets is refused by
``posstats submit`` (:func:`refuse_secrets`): a job gets its credentials from the cluster's
environment, never from its configuration or job environment.
Overrides: ``--set TABLE.KEY=VALUE`` (VALUE in TOML syntax; a bare word is a string)
and the shortcut flags of ``posstats pipeline`` (see :func:`apply_overrides`).

Only :mod:`tomllib` reads TOML; :func:`dumps_toml` writes the resolved configuration
(what ``posstats submit`` ships to the cluster).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posstats.analysis import AnalysisConfig
from posstats.corpus.inputs import CountOptions, InputOptions
from posstats.corpus.remote import check_storage_options, parse_value
from posstats.errors import OptionError, PosstatsError, did_you_mean
from posstats.geometry.ranged import MAX_RANGES
from posstats.ids import validate_run_id
from posstats.options import SAME, declared_options
from posstats.reports.export import ExportOptions
from posstats.service.pipeline_store import is_url
from posstats.service.schedule import parse_cron, parse_interval, time_zone

__all__ = [
    "SCHEMA",
    "PipelineConfig",
    "apply_overrides",
    "config_secrets",
    "dumps_toml",
    "load_config",
    "parse_config",
    "redact",
    "refuse_secrets",
    "secret_env_reason",
]

_SECRET = re.compile(r"key|secret|token|password|passwd|passphrase|credential|session|connection_?string"
                     r"|authori[sz]ation|cookie|signature|private", re.IGNORECASE)
# scheme://user:password@host: the password part (a URL may carry credentials)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):(?P<password>[^/@\s]+)@")
# environment variable names of credentials. AWS_ACCESS_KEY_ID is an identifier rather than a
# secret, but it is refused too: it is only useful together with its secret (refused), and on
# its own it overrides the cluster's credential chain (botocore then finds a partial pair).
_SECRET_ENV = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|COOKIE|SIGNATURE"
                         r"|CONNECTION_?STRING|APIKEY|ACCESSKEY|(^|_)KEY($|_)", re.IGNORECASE)
# names whose value is the path of a file on the cluster (a mounted secret), not a secret
_PATH_ENV = re.compile(r"_(FILE|PATH|DIR|FILENAME)$|^GOOGLE_APPLICATION_CREDENTIALS$", re.IGNORECASE)
# gcsfs' token modes: not secrets
_TOKEN_MODES = frozenset({"anon", "google_default", "cache", "cloud", "browser"})
# an AWS access key id (long-term AKIA..., temporary ASIA...)
_AWS_KEY_ID = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")
# secrets recognised by the shape of the value, whatever the key that holds it: an HTTP
# Authorization header value, a credential in a URL's query string (pre-signed URLs, SAS
# tokens, ?token=), a JSON web token, the prefixed tokens of Hugging Face and GitHub
_VALUE_SECRETS = (
    ("an Authorization header value",
     re.compile(r"(?P<head>^\s*(?:Bearer|Basic|Token|Digest|AWS4-HMAC-SHA256|Negotiate)\s+)(?P<secret>\S.*)$",
                re.IGNORECASE | re.DOTALL)),
    ("a credential in a URL's query string",
     re.compile(r"(?P<head>[?&](?:[\w.-]*token|access_?token|sig|signature|x-amz-signature|x-amz-credential"
                r"|x-amz-security-token|x-goog-signature|x-goog-credential|key|api_?key|apikey|secret|password"
                r"|passwd|code|auth)=)(?P<secret>[^&#\s]+)", re.IGNORECASE)),
    ("a JSON web token", re.compile(r"(?P<head>)(?P<secret>\beyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]*)")),
    ("an access token", re.compile(r"(?P<head>)(?P<secret>\b(?:hf|ghp|gho|ghs|github_pat|glpat|xox[abp])_[\w-]{16,})")),
)
CREDENTIALS_HINT = ("give the cluster its own credentials instead (an IAM role / IRSA, a mounted secret, the "
                    "environment of the RayCluster spec or of the Ray worker processes): see 'Credentials' in "
                    "docs/service.md")
# [geometry] keys of the first configs: always in the result key. Those added since count only
# when set to something else than their default, so that a store's runs keep their keys.
_FIRST_GEOMETRY_KEYS = frozenset({"dims", "encodings", "min_occupancy", "rank_rtol", "mds_method", "seed",
                                  "noise_floor", "distances", "held_out", "smacof_limit"})


@dataclass(frozen=True)
class Key:
    """One configuration key: its type, default and help (the docs table is built from these).

    ``kind``: str | path | url | int | float | bool | str_list | url_list | int_list | table.
    ``check``: returns an error text for a bad value (already of the right type), or None.
    """

    kind: str
    default: Any
    help: str
    required: bool = False
    nullable: bool = True
    check: Callable[[Any], str | None] | None = None


def _ge(lo: float, *, strict: bool = False) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if (v <= lo) if strict else (v < lo):
            return f"must be {'>' if strict else '>='} {lo:g}"
        return None

    return check


def _one_of(options: Sequence[str]) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in options else f"must be one of {', '.join(options)}"

    return check


def _all_ge(lo: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if not v:
            return "must not be empty"
        bad = [x for x in v if x < lo]
        return f"must all be >= {lo} (got {bad[0]})" if bad else None

    return check


def _nonempty(v: Any) -> str | None:
    return "must not be empty" if not v else None


def _every(v: Any) -> str | None:

    try:
        parse_interval(v)
    except PosstatsError as exc:
        return str(exc)
    return None


def _cron(v: Any) -> str | None:

    try:
        parse_cron(v)
    except PosstatsError as exc:
        return str(exc)
    return None


def _timezone(v: Any) -> str | None:

    try:
        time_zone(v)
    except PosstatsError as exc:
        return str(exc)
    return None


_GEOMETRY = {d.name: d for d in declared_options(AnalysisConfig)}


def _json_default(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _option_keys(cls: type, /) -> dict[str, Key]:
    """A table's keys: every option of the options dataclass ``cls`` that the pipeline takes
    (``[geometry]``: :class:`~posstats.analysis.AnalysisConfig`; ``[export]``:
    :class:`~posstats.reports.export.ExportOptions`), generated from its declaration
    (:mod:`posstats.options`), so the two cannot drift."""
    keys = {}
    for d in declared_options(cls):
        if not d.option.pipeline:
            continue
        default = d.default if d.option.config_default == SAME else d.option.config_default
        keys[d.option.key or d.name] = Key(d.option.config_kind or d.kind, default, d.option.help,
                                           nullable=default is None, check=d.check)
    return keys


def _options_of(cls: type, table: Mapping[str, Any], /) -> Any:
    """``cls(...)`` from a table of :func:`_option_keys` (lists as tuples)."""
    return cls(**{d.name: tuple(v) if isinstance(v := table[d.option.key or d.name], list) else v
                  for d in declared_options(cls) if d.option.pipeline})


SCHEMA: dict[str, dict[str, Key]] = {
    "store": {
        "url": Key("url", None, "the run store: a local folder or an fsspec URL (s3://bucket/prefix)", required=True),
        "work_dir": Key("path", None, "local (or shared, on a cluster) folder for the counting store of per-shard "
                        "partials, the mirror of remote inputs and staging; default STORE/work for a local store, "
                        "~/.cache/posstats/work-<hash of the URL> for a remote one"),
        "storage_options": Key("table", {}, "fsspec options of the store (e.g. client_kwargs.endpoint_url); secrets "
                               "are never written out"),
        "lock_stale_after_s": Key("float", 600.0, "a lock whose heartbeat is older than this is stale", nullable=False,
                                  check=_ge(1)),
        "heartbeat_s": Key("float", None, "seconds between lock heartbeats (default: min(30, lock_stale_after_s / 10))",
                           check=_ge(0.1)),
    },
    "input": {
        "paths": Key("url_list", None, "input files, folders (HF datasets) or globs; local or s3://...", required=True,
                     check=_nonempty),
        **_option_keys(InputOptions),
        "storage_options": Key("table", {}, "fsspec options for remote inputs"),
    },
    "count": {
        **_option_keys(CountOptions),
        "shard_size_mib": Key("float", None, "target shard size: JSONL / text files above it are cut into line "
                              "ranges, Parquet row groups joined up to it (default: the run store's, else 2-4 "
                              "shards per worker within 16-256)", check=_ge(0, strict=True)),
        "skip_bad_shards": Key("bool", False, "finish without unreadable shards (listed in the count summary)",
                               nullable=False),
    },
    "ray": {
        "address": Key("str", None, "Ray cluster to join (default: $RAY_ADDRESS, else an embedded local Ray)"),
        "workers": Key("int", None, "counting actors (default: one per CPU of the cluster)", check=_ge(1)),
        "geometry_cpus": Key("float", None, "CPUs reserved by the geometry task, whose products use that many "
                             "threads (default: every CPU of the largest node that is free; on the 2-core VM "
                             "2 CPUs analyse 1 B tokens in 426 s instead of 736-851 s with 1, at 10.4 GB "
                             "instead of 9.9 GB, docs/benchmarks.md)", nullable=True, check=_ge(0)),
        "geometry_retries": Key("int", 2, "times Ray reruns a geometry task whose worker died", nullable=False,
                                check=_ge(0)),
        "geometry_ranges": Key("int", None, "position ranges the geometry task's analysis holds in Ray actors, so "
                               "that no process holds every count (default: as many as keep each range within "
                               "[count] memory_budget_gib, and none, the analysis in the task's own process, when "
                               "it fits there; 0: always in the task's process; docs/long-context.md)",
                               check=lambda v: None if 0 <= v <= MAX_RANGES else f"must be between 0 and {MAX_RANGES} "
                                                                                  "(one Ray actor per range)"),
    },
    "geometry": _option_keys(AnalysisConfig),
    "diff": {
        "level": Key("float", 0.05, "family-wise level of the per-position change decisions against the previous "
                     "latest run", nullable=False, check=lambda v: None if 0 < v < 1 else "must be in (0, 1)"),
        "drift_dim": Key("int", 16, "MDS coordinates aligned for the encoding drift", nullable=False, check=_ge(1)),
    },
    "report": {
        "width": Key("int", None, "model width of the rank / stress table (default: the largest dim)", check=_ge(1)),
        "max_positions": Key("int", 2048, "recompute distances on at most this many positions", nullable=False,
                             check=_ge(2)),
    },
    "export": {
        **_option_keys(ExportOptions),
        "dim": Key("int", None, "model width D of the exported table (default: the largest [geometry] dims)",
                   check=_ge(1)),
        "name": Key("str", "positions", "file stem of the table in export/", nullable=False,
                    check=lambda v: None if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v) and ".." not in v
                    else "must be a plain file stem (letters, digits, . _ -)"),
    },
    "schedule": {
        "every": Key("str", None, "default interval of 'posstats schedule' (e.g. 6h, 30m, 1h30m)", check=_every),
        "cron": Key("str", None, "default cron expression of 'posstats schedule' (5 fields, read in timezone)", check=_cron),
        "timezone": Key("str", "UTC", "IANA time zone the cron expression is read in (e.g. Europe/Paris)", check=_timezone),
    },
}
TOP_LEVEL = {"run_id": Key("str", None, "the run's name (default: --run-id, else a UTC time stamp)")}


@dataclass(frozen=True)
class PipelineConfig:
    """A validated pipeline configuration.

    Attributes:
        values: {table: {key: value}} with every key of :data:`SCHEMA` present (defaults
            filled in); lists are tuples, ``storage_options`` plain dicts.
        run_id: the top-level ``run_id`` (None: chosen at run time).
        source: the config file it came from (None for a dict).
    """

    values: Mapping[str, Mapping[str, Any]]
    run_id: str | None = None
    source: str | None = None

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "values")
        if name in values:
            return _Section(name, values[name])
        raise AttributeError(name)

    def to_dict(self, *, secrets: bool = False) -> dict[str, Any]:
        """JSON/TOML-ready nested dict (lists, not tuples); secrets (storage_options secrets,
        passwords in URLs) redacted unless asked."""
        out: dict[str, Any] = {}
        if self.run_id is not None:
            out["run_id"] = self.run_id
        for table, keys in self.values.items():
            out[table] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in keys.items()}
            if not secrets:
                out[table] = {k: (redact(v) if k == "storage_options" else redact_url(v))
                              for k, v in out[table].items()}
        return json.loads(json.dumps(out))

    def result_key(self) -> str:
        """sha256 (16 hex) of everything that decides a run's results: inputs, counting,
        geometry, report and export options (not the store, Ray, schedule, run id or
        storage options). A run id rerun with another result key is refused."""
        d = self.to_dict()
        parts = {t: d[t] for t in ("input", "count", "geometry", "report", "export")}
        parts["input"] = {k: v for k, v in parts["input"].items() if k != "storage_options"}
        parts["geometry"] = {k: v for k, v in parts["geometry"].items() if not _GEOMETRY[k].option.limit
                             and (k in _FIRST_GEOMETRY_KEYS or v != _json_default(_GEOMETRY[k].default))}
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def analysis_config(self) -> AnalysisConfig:
        """The :class:`posstats.analysis.AnalysisConfig` of ``[geometry]`` (validates the
        encodings and widths: unknown names, odd widths for sinusoidal/RoPE)."""
        g = self.values["geometry"]
        return AnalysisConfig(**{k: tuple(v) if isinstance(v, list | tuple) else v
                                 for k, v in g.items() if v is not None})

    def input_options(self) -> InputOptions:
        """``[input]``'s reader options (generated from :class:`InputOptions`)."""
        return _options_of(InputOptions, self.values["input"])

    def count_options(self) -> CountOptions:
        """``[count]``'s spec and memory budget (generated from :class:`CountOptions`)."""
        return _options_of(CountOptions, self.values["count"])

    def export_dim(self) -> int:
        """``[export] dim``, else the largest ``[geometry] dims``."""
        dim = self.values["export"]["dim"]
        return int(dim) if dim is not None else int(max(self.values["geometry"]["dims"]))

    def work_dir(self) -> str:
        """The local work folder (see ``[store] work_dir``)."""

        s = self.values["store"]
        if s["work_dir"]:
            return str(s["work_dir"])
        if not is_url(s["url"]):
            return os.path.join(s["url"], "work")
        digest = hashlib.sha256(s["url"].encode()).hexdigest()[:12]
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "posstats", f"work-{digest}")


class _Section:
    """Attribute access to one table: ``cfg.count.positions``."""

    def __init__(self, name: str, values: Mapping[str, Any]) -> None:
        self._name, self._values = name, values

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"[{self._name}] has no key {key!r}") from None


def _is_secret_option(key: Any, value: Any) -> bool:
    """An fsspec option whose name looks like a secret's and which has a value (not a table,
    a bool, an empty value or one of gcsfs' token modes such as "anon"; a list counts)."""
    if isinstance(value, Mapping | bool) or value is None or value == "" or value == []:
        return False
    if str(key).lower() == "token" and isinstance(value, str) and value in _TOKEN_MODES:
        return False
    return bool(_SECRET.search(str(key)))


def redact(options: Any, /) -> Any:
    """A copy of (nested) fsspec options with secret-looking values replaced by ``"***"``
    (and passwords inside URLs by ``***``)."""
    if isinstance(options, Mapping):
        return {k: ("***" if _is_secret_option(k, v) else redact(v)) for k, v in options.items()}
    if isinstance(options, list):
        return [redact(v) for v in options]
    return redact_url(options)


def redact_url(value: Any, /) -> Any:
    """A value with the secrets it carries by their shape replaced by ``***``:
    ``scheme://user:password@host/...`` -> ``scheme://user:***@host/...``,
    ``Bearer abc`` -> ``Bearer ***``, ``...?sig=abc&x=1`` -> ``...?sig=***&x=1``, AWS key
    ids, JSON web tokens and prefixed access tokens -> ``***``; other values as they are."""
    if isinstance(value, str):
        value = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:***@", value)
        for _, pattern in _VALUE_SECRETS:
            value = pattern.sub(lambda m: f"{m.group('head')}***", value)
        return _AWS_KEY_ID.sub("***", value)
    if isinstance(value, list):
        return [redact_url(v) for v in value]
    return value


def _secret_option_paths(options: Any, prefix: str) -> list[str]:
    out: list[str] = []
    if isinstance(options, Mapping):
        for k, v in options.items():
            where = f"{prefix}.{k}"
            if _is_secret_option(k, v):
                out.append(where)
            elif isinstance(v, Mapping | list):
                out += _secret_option_paths(v, where)
            elif _embedded_secret(v):
                out.append(f"{where} ({_embedded_secret(v)})")
    elif isinstance(options, list):
        for i, v in enumerate(options):
            out += _secret_option_paths(v, f"{prefix}[{i}]") if isinstance(v, Mapping | list) else (
                [f"{prefix}[{i}] ({_embedded_secret(v)})"] if _embedded_secret(v) else [])
    return out


def _embedded_secret(value: Any) -> str | None:
    """What secret a plain value carries: a password in a URL, an AWS access key id; else None."""
    if not isinstance(value, str):
        return None
    if _URL_PASSWORD.search(value):
        return "a password in a URL"
    if _AWS_KEY_ID.search(value):
        return "an AWS access key id"
    return next((what for what, pattern in _VALUE_SECRETS if pattern.search(value)), None)


def config_secrets(cfg: PipelineConfig, /) -> list[str]:
    """Where the configuration holds credentials: ``[table] storage_options.a.b`` for every
    option whose name looks like a secret (key, secret, token, password, credential, session)
    and has a value, and ``[table] key`` for a value with a password in a URL or an AWS
    access key id. Empty when the configuration is safe to ship."""
    out: list[str] = []
    for table, keys in cfg.values.items():
        for key, value in keys.items():
            if key == "storage_options":
                out += [f"[{table}] {p}" for p in _secret_option_paths(value, "storage_options")]
            else:
                for v in (value if isinstance(value, list | tuple) else [value]):
                    if _embedded_secret(v):
                        out.append(f"[{table}] {key} ({_embedded_secret(v)})")
                        break
    if cfg.run_id and _embedded_secret(cfg.run_id):
        out.append("run_id")
    return out


def secret_env_reason(name: str, value: str, /) -> str | None:
    """Why the job environment variable ``name=value`` looks like a credential, or None.

    Refused: names with SECRET, TOKEN, PASSWORD/PASSWD/PASSPHRASE, CREDENTIAL, PRIVATE,
    COOKIE, SIGNATURE, CONNECTION_STRING, APIKEY/ACCESSKEY or a KEY word (AWS_SECRET_ACCESS_KEY,
    AWS_SESSION_TOKEN, AWS_ACCESS_KEY_ID, HF_TOKEN, OPENAI_API_KEY, AZURE_STORAGE_KEY...);
    any value with a password in a URL or an AWS access key id. Allowed: names ending in
    _FILE, _PATH, _DIR, _FILENAME and GOOGLE_APPLICATION_CREDENTIALS (the path of a secret
    mounted on the cluster) unless the value itself looks like a secret's content."""
    embedded = _embedded_secret(value)
    if embedded:
        return f"its value holds {embedded}"
    if _SECRET_ENV.search(name):
        if _PATH_ENV.search(name) and "\n" not in value and not value.lstrip().startswith(("{", "-----")):
            return None
        return "the name is a credential's"
    return None


def refuse_secrets(cfg: PipelineConfig | None = None, /, *, env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`PosstatsError` (one line) when ``env`` (a job's environment variables) or
    the configuration holds credentials: what a job ships is stored by Ray in its job table,
    returned by the job API and written to the nodes (logs, runtime_resources)."""
    for name, value in (env or {}).items():
        why = secret_env_reason(name, value)
        if why:
            msg = (f"--env {name}: refusing to send a credential with the job ({why}); Ray stores a job's "
                   f"environment in its job table, returns it from the job API and logs it on the nodes; "
                   f"{CREDENTIALS_HINT}")
            raise PosstatsError(msg)
    where = config_secrets(cfg) if cfg is not None else []
    if where:
        more = f" (and {len(where) - 1} more)" if len(where) > 1 else ""
        msg = (f"{cfg.source or 'the configuration'}: {where[0]}{more} holds a credential; refusing to ship it with "
               f"the job (the config travels in the job's working_dir to every node); remove it and {CREDENTIALS_HINT}")
        raise PosstatsError(msg)


# ----------------------------------------------------------------------------- parsing


def _type_name(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "a list",
            dict: "a table"}.get(type(v), type(v).__name__)


def _resolve_path(value: str, base: str | None) -> str:

    if is_url(value) or base is None:
        return value
    value = os.path.expanduser(value)
    return value if os.path.isabs(value) else os.path.normpath(os.path.join(base, value))


def _coerce(where: str, key: Key, value: Any, base: str | None) -> Any:
    """Type-check ``value`` for ``key``; return the normalised value."""
    def bad(expected: str) -> PosstatsError:
        return PosstatsError(f"{where} must be {expected}, got {value!r} ({_type_name(value)})")

    if value is None:
        if not key.nullable:
            raise bad("set")
        return None
    kind = key.kind
    if kind in ("str", "path", "url"):
        if not isinstance(value, str) or (kind != "str" and not value):
            raise bad("a non-empty string" if kind != "str" else "a string")
        out: Any = _resolve_path(value, base) if kind in ("path", "url") else value
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        out = value
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad("a finite number")
        out = float(value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        out = value
    elif kind in ("str_list", "url_list"):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) and x for x in value):
            raise bad("a list of non-empty strings")
        out = tuple(_resolve_path(x, base) for x in value) if kind == "url_list" else tuple(value)
    elif kind == "int_list":
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            raise bad("a list of integers")
        out = tuple(value)
    elif kind == "table":
        if not isinstance(value, Mapping):
            raise bad("a table")
        out = json.loads(json.dumps(value, default=str))
        check_storage_options(out, where=where)  # the one kind of table: fsspec options
    else:  # schema error
        raise ValueError(kind)
    if key.check is not None:
        problem = key.check(out)
        if problem:
            msg = f"{where} {problem}, got {value!r}"
            raise PosstatsError(msg)
    return out


def parse_config(data: Mapping[str, Any], /, *, source: str | None = None, base_dir: str | None = None) -> PipelineConfig:
    """Validate a parsed TOML document (or an equivalent dict) into a :class:`PipelineConfig`.

    Args:
        data: the document.
        source: where it came from, for messages (a file name).
        base_dir: folder against which relative local paths are resolved (None: keep them).

    Raises:
        PosstatsError: one line naming the file, the table, the key and the value.
    """
    origin = f"{source}: " if source else ""
    values: dict[str, dict[str, Any]] = {}
    for name in data:
        if name not in SCHEMA and name not in TOP_LEVEL:
            msg = f"{origin}unknown table or key {name!r}{did_you_mean(name, [*SCHEMA, *TOP_LEVEL])}"
            raise PosstatsError(msg)
        if name in SCHEMA and not isinstance(data[name], Mapping):
            msg = f"{origin}[{name}] must be a table, got {data[name]!r}"
            raise PosstatsError(msg)
    for table, keys in SCHEMA.items():
        given = dict(data.get(table, {}))
        for k in given:
            if k not in keys:
                msg = f"{origin}unknown key [{table}] {k!r}{did_you_mean(k, list(keys))}; known: {', '.join(keys)}"
                raise PosstatsError(msg)
        section = {}
        for k, spec in keys.items():
            where = f"{origin}[{table}] {k}"
            if k not in given:
                if spec.required:
                    msg = f"{origin}[{table}] {k} is required ({spec.help})"
                    raise PosstatsError(msg)
                section[k] = spec.default
                continue
            section[k] = _coerce(where, spec, given[k], base_dir)
        values[table] = section
    run_id = data.get("run_id")
    if run_id is not None:

        if not isinstance(run_id, str):
            msg = f"{origin}run_id must be a string, got {run_id!r}"
            raise PosstatsError(msg)
        try:
            validate_run_id(run_id)
        except PosstatsError as exc:
            raise PosstatsError(f"{origin}{exc}") from None
    _check_consistency(values, origin)
    cfg = PipelineConfig(values=values, run_id=run_id, source=source)
    cfg.analysis_config()  # unknown encodings, odd widths: fail before any work
    return cfg


def _check_consistency(values: Mapping[str, Mapping[str, Any]], origin: str) -> None:
    inp, cnt, exp, sch = values["input"], values["count"], values["export"], values["schedule"]
    if inp["column"] and inp["text_column"]:
        raise PosstatsError(f"{origin}[input] give either column (token ids) or text_column (text), not both")
    if inp["column"] is None and not inp["tokenizer"]:
        raise PosstatsError(f"{origin}[input] give column (token ids) or tokenizer (to tokenise text)")
    if cnt["vocab_size"] is None and not inp["tokenizer"]:
        raise PosstatsError(f"{origin}[count] vocab_size is required when [input] has no tokenizer")
    if cnt["separator"] is not None and cnt["mode"] != "pack":
        raise PosstatsError(f"{origin}[count] separator only applies with mode = \"pack\"")
    if exp["rank"] is not None:
        dim = exp["dim"] if exp["dim"] is not None else max(values["geometry"]["dims"])
        if exp["rank"] > dim:
            raise PosstatsError(f"{origin}[export] rank {exp['rank']} exceeds the table width {dim}")
    try:  # the rules between export options (factors need a rank, a prefix's form), as the library checks them
        ExportOptions(**{d.name: tuple(v) if isinstance(v := exp[d.name], list) else v
                         for d in declared_options(ExportOptions) if d.option.pipeline})
    except OptionError as exc:
        raise PosstatsError(f"{origin}[export] {exc}") from None
    if sch["every"] and sch["cron"]:
        raise PosstatsError(f"{origin}[schedule] give either every or cron, not both")


def load_config(path: str | os.PathLike, /) -> PipelineConfig:
    """Read and validate a TOML config file (relative paths: against its folder).

    Raises:
        PosstatsError: a missing or unreadable file, bad TOML, or a bad value.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise PosstatsError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise PosstatsError(f"{path}: is a folder, not a TOML config file") from None
    except OSError as exc:
        raise PosstatsError(f"{path}: cannot read the config file ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PosstatsError(f"{path}: not valid TOML ({exc})") from None
    return parse_config(data, source=path, base_dir=os.path.dirname(os.path.abspath(path)))


# ----------------------------------------------------------------------------- overrides




def apply_overrides(cfg: PipelineConfig, /, *, sets: Sequence[str] = (), run_id: str | None = None,
                    store: str | None = None, inputs: Sequence[str] | None = None, address: str | None = None,
                    workers: int | None = None, base_dir: str | None = None) -> PipelineConfig:
    """A new config with flag values applied (flags win over the file).

    Args:
        sets: ``TABLE.KEY=VALUE`` strings (VALUE in TOML syntax; a bare word is a string).
        run_id, store, inputs, address, workers: the shortcut flags.
        base_dir: folder for relative paths in flag values (default: the current one).

    Raises:
        PosstatsError: a malformed ``--set``, an unknown key, a bad value.
    """
    base_dir = base_dir or os.getcwd()
    data = cfg.to_dict(secrets=True)
    for item in sets:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            msg = f"--set expects TABLE.KEY=VALUE, got {item!r}"
            raise PosstatsError(msg)
        name, text = item.split("=", 1)
        table, key = name.strip().split(".", 1)
        if table not in SCHEMA:
            msg = f"--set {name}: unknown table {table!r}{did_you_mean(table, list(SCHEMA))}"
            raise PosstatsError(msg)
        value = parse_value(text.strip())
        spec = SCHEMA[table].get(key)
        if spec is not None and spec.kind in ("path", "url", "url_list") and value is not None:
            # only strings are paths; anything else is left for parse_config to refuse by type
            value = [_resolve_path(v, base_dir) if isinstance(v, str) else v for v in value] if isinstance(
                value, list) else (_resolve_path(value, base_dir) if isinstance(value, str) else value)
        data.setdefault(table, {})[key] = value
    shortcuts = {("store", "url"): store, ("ray", "address"): address, ("ray", "workers"): workers}
    for (table, key), value in shortcuts.items():
        if value is not None:
            data[table][key] = _resolve_path(value, base_dir) if key == "url" else value
    if inputs:
        data["input"]["paths"] = [_resolve_path(p, base_dir) for p in inputs]
    if run_id is not None:
        data["run_id"] = run_id
    # drop unset keys so that defaults (None) stay defaults
    clean = {t: {k: v for k, v in keys.items() if v is not None} for t, keys in data.items() if isinstance(keys, dict)}
    if data.get("run_id") is not None:
        clean["run_id"] = data["run_id"]
    return parse_config(clean, source=cfg.source, base_dir=None)


# ----------------------------------------------------------------------------- TOML out


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_str(s: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped, the rest as is."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_str(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        text = repr(v)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_toml_key(str(k))} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    msg = f"cannot write {type(v).__name__} as TOML"
    raise TypeError(msg)


def dumps_toml(data: Mapping[str, Any], /) -> str:
    """Write a config dict (top-level scalars, then one table per mapping) as TOML.

    ``None`` values are left out (TOML has no null), so they read back as defaults.
    """
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if v is not None and not isinstance(v, Mapping)]
    for table, keys in data.items():
        if not isinstance(keys, Mapping):
            continue
        lines += ["", f"[{_toml_key(table)}]"]
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in keys.items() if v is not None]
    return "\n".join(lines).lstrip("\n") + "\n"


def config_names() -> dict[str, str]:
    """{parameter: its place in the pipeline's TOML} (``dims`` -> ``[geometry] dims``,
    ``store`` -> ``[store] url``, ``shard_size`` -> ``[count] shard_size_mib``): how an
    :class:`~posstats.errors.OptionError` names options to a pipeline's user."""
    names = {"store": "[store] url", "shard_size": "[count] shard_size_mib", "paths": "[input] paths"}
    for table, cls in (("geometry", AnalysisConfig), ("export", ExportOptions), ("input", InputOptions),
                       ("count", CountOptions)):
        names.update({d.name: f"[{table}] {d.option.key or d.name}" for d in declared_options(cls) if d.option.pipeline})
    return names


def schema_rows() -> list[tuple[str, str, str, str]]:
    """(table.key, kind, default, help) for every key: the docs table."""
    rows = [("run_id", "str", "-", TOP_LEVEL["run_id"].help)]
    for table, keys in SCHEMA.items():
        for k, spec in keys.items():
            default = "required" if spec.required else ("-" if spec.default is None else json.dumps(
                list(spec.default) if isinstance(spec.default, tuple) else spec.default))
            rows.append((f"{table}.{k}", spec.kind, default, spec.help))
    return rows
