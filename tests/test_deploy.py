"""deploy/: every manifest parses, and the fields that matter hold: the image and rayVersion pin
the project's Ray version, the entrypoint is the pipeline job with the mounted config, the
RayJob cleans up after itself, the CronJob forbids overlap and its deadlines nest inside
its period, the example config is valid, and credentials only reach the Ray containers
from Kubernetes Secrets (never a literal value, the pipeline config or a job)."""

from __future__ import annotations

import datetime as dt
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from posstats.service.config import (
    config_secrets,
    load_config,
    parse_config,
    secret_env_reason,
)
from posstats.service.pipeline_store import validate_run_id
from posstats.service.schedule import parse_cron

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (it comes with ray[default])")

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"


def pinned_ray_version() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    (spec,) = [d for d in deps if d.startswith("ray")]
    return spec.split("==")[1]


VERSION = pinned_ray_version()


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def one(documents: list[dict], kind: str) -> dict:
    (doc,) = [d for d in documents if d["kind"] == kind]
    return doc


def containers(pod_spec: dict) -> list[dict]:
    return pod_spec["template"]["spec"]["containers"] if "template" in pod_spec else pod_spec["spec"]["containers"]


def rayjob_images(rayjob: dict) -> list[str]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    images = [c["image"] for g in groups for c in containers(g)]
    images += [c["image"] for c in rayjob["spec"]["submitterPodTemplate"]["spec"]["containers"]]
    return images


def test_dockerfile_pins_the_ray_version():
    text = (DEPLOY / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert froms == [f"rayproject/ray:{VERSION}-py311"]
    assert f'"ray[default]=={VERSION}"' in text
    assert re.search(r"COPY .*posstats \./posstats", text) and re.search(r"COPY .*jobs \./jobs", text)
    tag = re.search(r"docker build -f deploy/Dockerfile -t (\S+) \.", text).group(1)
    assert tag.endswith(f"ray{VERSION}")


def test_rayjob_manifest():
    documents = docs("rayjob.yaml")
    rayjob = one(documents, "RayJob")
    assert rayjob["apiVersion"] == "ray.io/v1"
    spec = rayjob["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec["ttlSecondsAfterFinished"], int) and spec["ttlSecondsAfterFinished"] > 0
    assert isinstance(spec["activeDeadlineSeconds"], int) and spec["activeDeadlineSeconds"] > 0
    assert spec["rayClusterSpec"]["rayVersion"] == VERSION
    images = rayjob_images(rayjob)
    assert images and len(set(images)) == 1 and images[0].endswith(f":0.1.0-ray{VERSION}")
    # the image the RayJob names is the one the Dockerfile builds
    assert images[0] in (DEPLOY / "Dockerfile").read_text()

    argv = shlex.split(spec["entrypoint"])
    assert argv[:3] == ["python", "-m", "posstats.jobs.pipeline"]
    config_path = argv[argv.index("--config") + 1]
    run_id = argv[argv.index("--run-id") + 1]
    assert validate_run_id(run_id) and rayjob["metadata"]["name"].endswith(run_id)
    # the config file is the ConfigMap mounted in the head container, and it is the example config
    head = containers(spec["rayClusterSpec"]["headGroupSpec"])[0]
    mounts = {m["name"]: m["mountPath"] for m in head["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"]}
    (cfg_volume,) = [n for n, p in mounts.items() if config_path.startswith(p + "/")]
    configmap_name = volumes[cfg_volume]["configMap"]["name"]
    configmap = one(documents, "ConfigMap")
    assert configmap["metadata"]["name"] == configmap_name
    key = config_path.rsplit("/", 1)[1]
    shipped = tomllib.loads(configmap["data"][key])
    example = tomllib.loads((DEPLOY / "pipeline.example.toml").read_text())
    assert shipped == example
    cfg = parse_config(shipped)
    # store, work folder and inputs live on the shared volume every pod mounts
    shared = [m["mountPath"] for m in head["volumeMounts"] if m["name"] == "data"]
    for group in spec["rayClusterSpec"]["workerGroupSpecs"]:
        assert [m["mountPath"] for m in containers(group)[0]["volumeMounts"] if m["name"] == "data"] == shared
    for path in (cfg.store.url, cfg.store.work_dir, *cfg.input.paths):
        assert path.startswith(shared[0] + "/")
    # token authentication stays on everywhere
    for c in [head, *[containers(g)[0] for g in spec["rayClusterSpec"]["workerGroupSpecs"]],
              *spec["submitterPodTemplate"]["spec"]["containers"]]:
        env = {e["name"]: e for e in c["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token" and "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]


def schedule_period_s(expr: str) -> float:
    """The shortest gap between consecutive ticks over four weeks."""
    cron = parse_cron(expr)
    t = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    ticks = [cron.first(t)]
    while ticks[-1] < t + dt.timedelta(days=28):
        ticks.append(cron.next_after(ticks[-1], ticks[-1]))
    return min((b - a).total_seconds() for a, b in zip(ticks, ticks[1:]))


def test_cronjob_manifest():
    documents = docs("cronjob.yaml")
    cron = one(documents, "CronJob")
    assert cron["apiVersion"] == "batch/v1"
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["timeZone"] == "Etc/UTC"
    period = schedule_period_s(spec["schedule"])
    assert period == 6 * 3600
    job = spec["jobTemplate"]["spec"]
    job_deadline = job["activeDeadlineSeconds"]
    assert 0 < job_deadline < period
    assert 0 < spec["startingDeadlineSeconds"] < period

    # the RayJob the CronJob creates: deploy/rayjob.yaml's, with the run id filled in
    template = one(documents, "ConfigMap")["data"]["rayjob.yaml"]
    assert "__RUN_ID__" in template
    run_id = "posstats-refresh-28612345"  # what the Job's name looks like
    created = yaml.safe_load(template.replace("__RUN_ID__", run_id))
    assert created["kind"] == "RayJob" and created["metadata"]["name"] == run_id
    reference = one(docs("rayjob.yaml"), "RayJob")
    strip = lambda spec: {k: v for k, v in spec.items() if k != "entrypoint"}  # noqa: E731
    assert strip(created["spec"]) == strip(reference["spec"])
    assert created["spec"]["entrypoint"] == reference["spec"]["entrypoint"].replace("manual-001", run_id)
    assert validate_run_id(run_id)
    assert created["spec"]["activeDeadlineSeconds"] < job_deadline < period
    assert created["spec"]["rayClusterSpec"]["rayVersion"] == VERSION
    assert all(i.endswith(f"ray{VERSION}") for i in rayjob_images(created))

    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    assert not container["image"].endswith(":latest") and ":" in container["image"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RUN_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['job-name']"
    script = container["args"][0]
    assert 'sed "s/__RUN_ID__/$RUN_ID/g"' in script and "kubectl create -f" in script
    assert "jobDeploymentStatus" in script and "SUCCEEDED" in script  # the Job lasts as long as the RayJob
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/etc/posstats-rayjob" in mounts and "/etc/posstats-rayjob/rayjob.yaml" in script
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "posstats-scheduler"
    role = one(documents, "Role")
    (rule,) = role["rules"]
    assert rule["resources"] == ["rayjobs"] and {"create", "get"} <= set(rule["verbs"])


def test_example_config_is_valid_and_schedules_like_the_cronjob():
    cfg = load_config(DEPLOY / "pipeline.example.toml")
    cron = one(docs("cronjob.yaml"), "CronJob")
    assert cfg.values["schedule"]["cron"] == cron["spec"]["schedule"]


def test_deploy_readme_covers_each_file():
    text = (DEPLOY / "README.md").read_text()
    for name in ("Dockerfile", "rayjob.yaml", "cronjob.yaml", "pipeline.example.toml", "posstats schedule"):
        assert name in text


def ray_containers(rayjob_or_cluster: dict) -> list[dict]:
    spec = rayjob_or_cluster["spec"]
    cluster = spec.get("rayClusterSpec", spec)
    return [c for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]] for c in containers(g)]


def test_credentials_come_from_secrets_only():
    """Issue #18.7: every Ray container of the RayCluster, the RayJob and the CronJob's RayJob
    gets the optional object-store Secret as environment (s3fs reads AWS_* from it), no
    container sets a credential-looking variable to a literal value, and the shipped pipeline
    configs hold no credential."""
    cron_template = yaml.safe_load(one(docs("cronjob.yaml"), "ConfigMap")["data"]["rayjob.yaml"].replace(
        "__RUN_ID__", "posstats-refresh-1"))
    kuberay = [d for d in yaml.safe_load_all((REPO / "cluster" / "kuberay-raycluster.yaml").read_text()) if d]
    owners = [one(docs("rayjob.yaml"), "RayJob"), cron_template, one(kuberay, "RayCluster")]
    for owner in owners:
        for c in ray_containers(owner):
            refs = [e["secretRef"] for e in c.get("envFrom", []) if "secretRef" in e]
            assert {"name": "posstats-object-store", "optional": True} in refs, (owner["metadata"]["name"], c["name"])
    everything = [c for o in owners for c in ray_containers(o)]
    everything += one(docs("rayjob.yaml"), "RayJob")["spec"]["submitterPodTemplate"]["spec"]["containers"]
    for c in everything:
        for e in c.get("env", []):
            if secret_env_reason(e["name"], str(e.get("value", ""))):
                assert "value" not in e and "secretKeyRef" in e["valueFrom"], (c["name"], e["name"])
    configs = [one(docs("rayjob.yaml"), "ConfigMap")["data"]["pipeline.toml"],
               (DEPLOY / "pipeline.example.toml").read_text()]
    for text in configs:
        assert config_secrets(parse_config(tomllib.loads(text))) == []
