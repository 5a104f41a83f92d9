"""The dry run in the training's own image as a Kubernetes pod: the pod spec, its network policy, and the run.

Details: docs/reference/estimator.md#autodlprofilepod.
"""

from __future__ import annotations

import collections
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from autodl.profile.container import (
    BUNDLE_DIR,
    CPU_CORES,
    ENTRY,
    FRAME,
    FRAME_END,
    MAX_LOG_BYTES,
    OUT_BYTES,
    OUT_DIR,
    START_GRACE_S,
    STDERR_TAIL_LINES,
    WORK_DIR,
    bundle_files,
    child_output,
    container_config,
    container_env,
    decode_report,
    sandbox_result,
)
from autodl.profile.dryrun import ChildOutput, DryRunConfig
from autodl.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, Staged

log = logging.getLogger(__name__)

DRY_RUN_LABEL = "autodl/dry-run"
"""Label (value ``"true"``) of every dry-run pod, selected by the deny-all NetworkPolicy :func:`deny_all_policy`."""

POLICY_NAME = "autodl-dry-run-deny-all"
"""Name of the NetworkPolicy :class:`PodVenue` requires in the dry run's namespace."""

MAX_READ_BYTES = 256 << 20
"""Bytes of the pod's log read at most (the script's own output and the framed report)."""

FILES_ENV = "AUTODL_DRYRUN_FILES"
WRITER = ("import json, os; d = os.environ['AUTODL_DRYRUN_DIR']\n"
          "for name, text in json.loads(os.environ['AUTODL_DRYRUN_FILES']).items():\n"
          "    p = os.path.join(d, name); os.makedirs(os.path.dirname(p), exist_ok=True)\n"
          "    open(p, 'w').write(text); os.chmod(p, 0o444)\n")
"""What the init container runs (the image's Python): writes autodl's files into the bundle's ``emptyDir``."""

POLL_S = 2.0
"""Seconds between two reads of the pod's phase while it runs."""


def deny_all_policy(namespace: str) -> Any:
    """The ``V1NetworkPolicy`` that takes every network from the dry-run pods of ``namespace``: it selects
    :data:`DRY_RUN_LABEL` and lists ``Ingress`` and ``Egress`` with no rule (Kubernetes: "a policy that selects a
    pod and has no rules denies all such traffic", https://kubernetes.io/docs/concepts/services-networking/
    network-policies/#default-deny-all-ingress-and-all-egress-traffic). Needs a network plugin that enforces
    policies (Calico, Cilium; not kindnet or flannel alone)."""
    from kubernetes import client as k8s

    return k8s.V1NetworkPolicy(
        api_version="networking.k8s.io/v1", kind="NetworkPolicy",
        metadata=k8s.V1ObjectMeta(name=POLICY_NAME, namespace=namespace,
                                  labels={"app.kubernetes.io/managed-by": "autodl"}),
        spec=k8s.V1NetworkPolicySpec(pod_selector=k8s.V1LabelSelector(match_labels={DRY_RUN_LABEL: "true"}),
                                     policy_types=["Ingress", "Egress"]))


def _files_env(cfg: DryRunConfig) -> str:
    return json.dumps({name: data.decode() for name, data in bundle_files(cfg).items()})


def dry_run_pod(script: Path, cfg: DryRunConfig, launcher: Any, *, limits: SandboxLimits, env: dict[str, str],
                namespace: str, name: str) -> Any:
    """The ``V1Pod`` of one dry run (see the module docstring); pure, never contacts the cluster.

    :param script: the training script on the worker (its name is the script's name in ``launcher.code_dir``).
    :param cfg: the dry-run child's config (:func:`autodl.profile.dryrun.run_dry_run`).
    :param launcher: the spec's launcher section (``image``, ``python``, ``user``, ``code_dir``, ``code_pvc``,
        ``image_pull_policy``, ``image_pull_secrets``).
    """
    from kubernetes import client as k8s

    from autodl.launch.docker import DEFAULT_IMAGE
    from autodl.launch.kubernetes import pod_uid_gid, quantity

    uid, gid = pod_uid_gid(launcher.user, name)
    inner = container_config(script, cfg, code=launcher.code_dir, limits=limits, user_dirs=[WORK_DIR])
    image = launcher.image or DEFAULT_IMAGE
    disk = limits.disk_bytes
    security = k8s.V1SecurityContext(read_only_root_filesystem=True, allow_privilege_escalation=False,
                                     run_as_non_root=True, capabilities=k8s.V1Capabilities(drop=["ALL"]))
    volumes = [
        k8s.V1Volume(name="autodl-dryrun", empty_dir=k8s.V1EmptyDirVolumeSource(size_limit="16Mi")),
        k8s.V1Volume(name="work", empty_dir=k8s.V1EmptyDirVolumeSource(size_limit=quantity(disk))),
        k8s.V1Volume(name="out", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=quantity(OUT_BYTES))),
        k8s.V1Volume(name="tmp", empty_dir=k8s.V1EmptyDirVolumeSource(size_limit=quantity(disk))),
        k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=quantity(disk))),
    ]
    mounts = [k8s.V1VolumeMount(name="autodl-dryrun", mount_path=BUNDLE_DIR, read_only=True),
              k8s.V1VolumeMount(name="work", mount_path=WORK_DIR), k8s.V1VolumeMount(name="out", mount_path=OUT_DIR),
              k8s.V1VolumeMount(name="tmp", mount_path="/tmp"), k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm")]
    if launcher.code_pvc:
        volumes.append(k8s.V1Volume(name="code", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
            claim_name=launcher.code_pvc, read_only=True)))
        mounts.append(k8s.V1VolumeMount(name="code", mount_path=launcher.code_dir, read_only=True))
    amounts = {"cpu": str(CPU_CORES), "memory": quantity(limits.memory_bytes),
               "ephemeral-storage": quantity(3 * disk)}
    init_amounts = {"cpu": "100m", "memory": "64Mi"}
    init = k8s.V1Container(
        name="autodl-files", image=image, image_pull_policy=launcher.image_pull_policy,
        command=[launcher.python, "-c", WRITER],
        env=[k8s.V1EnvVar(name="AUTODL_DRYRUN_DIR", value=BUNDLE_DIR), k8s.V1EnvVar(name=FILES_ENV, value=_files_env(inner))],
        volume_mounts=[k8s.V1VolumeMount(name="autodl-dryrun", mount_path=BUNDLE_DIR)],
        resources=k8s.V1ResourceRequirements(limits=init_amounts, requests=dict(init_amounts)),
        security_context=security)
    main = k8s.V1Container(
        name="dryrun", image=image, image_pull_policy=launcher.image_pull_policy,
        command=[launcher.python, f"{BUNDLE_DIR}/child/{ENTRY.name}", f"{BUNDLE_DIR}/dryrun.json"],
        env=[k8s.V1EnvVar(name=k, value=v) for k, v in env.items()], volume_mounts=mounts,
        resources=k8s.V1ResourceRequirements(limits=amounts, requests=dict(amounts)), security_context=security)
    spec = k8s.V1PodSpec(
        restart_policy="Never", init_containers=[init], containers=[main], volumes=volumes,
        active_deadline_seconds=int(limits.timeout_s + START_GRACE_S), automount_service_account_token=False,
        enable_service_links=False, host_network=False, host_pid=False, host_ipc=False,
        termination_grace_period_seconds=0,
        image_pull_secrets=[k8s.V1LocalObjectReference(name=s) for s in launcher.image_pull_secrets] or None,
        security_context=k8s.V1PodSecurityContext(run_as_non_root=True, run_as_user=uid, run_as_group=gid,
                                                  fs_group=gid, seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault")))
    labels = {"app.kubernetes.io/managed-by": "autodl", DRY_RUN_LABEL: "true"}
    return k8s.V1Pod(api_version="v1", kind="Pod", spec=spec,
                     metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels))


class PodVenue:
    """The dry run as a pod of the spec's launcher image (see the module docstring).

    :param launcher: the spec's launcher section.
    :param engine: :class:`~autodl.launch.kubernetes.KubernetesLauncher` keyword arguments (``namespace``,
        ``in_cluster``, ``config_file``, ``api``...), as the Airflow connection ``kubernetes_default`` gives them.
    """

    name = "kubernetes"

    def __init__(self, launcher: Any, engine: dict[str, Any] | None = None):
        self.launcher = launcher
        self.engine = dict(engine or {})

    @property
    def namespace(self) -> str:
        return self.launcher.namespace or self.engine.get("namespace") or "default"

    def _api(self) -> Any:
        from autodl.errors import LaunchError
        from autodl.launch.kubernetes import KubernetesLauncher

        try:
            return KubernetesLauncher(**self.engine).api
        except LaunchError as exc:
            raise SandboxUnavailable(f"the dry run cannot run in the launcher's image: {exc}") from None

    def _require_policy(self, api: Any) -> None:
        """:raises SandboxUnavailable: the namespace has no :data:`POLICY_NAME` (or it cannot be read)."""
        from kubernetes import client as k8s
        from kubernetes.client.exceptions import ApiException

        try:
            k8s.NetworkingV1Api(api.api_client).read_namespaced_network_policy(POLICY_NAME, self.namespace)
        except ApiException as exc:
            raise SandboxUnavailable(
                f"the dry run's pod would have the network of namespace {self.namespace}: NetworkPolicy {POLICY_NAME} "
                f"cannot be read there ({exc.status} {exc.reason}); apply it (docs/launchers.md, 'The dry run in a "
                "pod') and let the connection kubernetes_default read networkpolicies") from None

    def run(self, script: Path, cfg: DryRunConfig, *, limits: SandboxLimits, batch_env: int | None,
            launch_env: dict[str, str] | None) -> tuple[ChildOutput, SandboxResult, Staged]:
        """Create the pod, wait for it (at most its deadline), read its log with ``PodManager``, delete it.

        :raises SandboxUnavailable: no cluster configuration, no deny-all policy, or the API refuses the pod.
        """
        import urllib3
        from kubernetes.client.exceptions import ApiException

        api = self._api()
        self._require_policy(api)
        pod = dry_run_pod(script, cfg, self.launcher, limits=limits, env=container_env(batch_env, launch_env),
                          namespace=self.namespace, name=f"autodl-dryrun-{uuid.uuid4().hex[:12]}")
        t0 = time.monotonic()
        try:
            api.create_namespaced_pod(self.namespace, pod)
        except ApiException as exc:
            raise SandboxUnavailable(f"Kubernetes refused the dry run's pod in {self.namespace}: {exc.status} "
                                     f"{exc.reason}; check the namespace's quota and the connection's RBAC") from None
        try:
            killed, phase = _wait(api, pod, limits.timeout_s + START_GRACE_S)
            frames, tail = read_log(api, pod)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise SandboxUnavailable(f"the Kubernetes API failed during the dry run ({exc}); nothing of it is "
                                     "used") from None
        finally:
            try:
                api.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("could not delete the dry run's pod %s: %s", pod.metadata.name, exc.reason)
        rep = decode_report(frames)
        notes = [] if phase in ("Succeeded", "Failed") else [f"the pod did not end (phase {phase}) and was deleted."]
        res = sandbox_result(rep, venue="kubernetes", seconds=time.monotonic() - t0, stderr=tail, notes=notes,
                             killed=killed)
        staged = Staged(left_out=list(rep.left_out) if rep is not None else [])
        return child_output(rep), res, staged


def _wait(api: Any, pod: Any, deadline_s: float) -> tuple[bool, str | None]:
    """Poll the pod's phase until it ends or ``deadline_s``; :returns: (killed at the deadline, last phase)."""
    end = time.monotonic() + deadline_s
    phase = None
    while time.monotonic() < end:
        remote = api.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        phase = remote.status.phase if remote.status else None
        if phase in ("Succeeded", "Failed"):
            return False, phase
        time.sleep(POLL_S)
    return True, phase


def read_log(api: Any, pod: Any) -> tuple[str, str]:
    """The entry's frame lines and the last :data:`STDERR_TAIL_LINES` other lines of the pod's ``dryrun`` container,
    read with the cncf provider's ``PodManager`` (at most :data:`MAX_READ_BYTES`); where the provider is not
    installed (the ``autodl`` command outside Airflow), with the client's ``read_namespaced_pod_log``."""
    frames: list[str] = []
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
    seen = kept = 0
    for raw in _log_lines(api, pod):
        seen += len(raw)
        if seen > MAX_READ_BYTES:
            break
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith((FRAME, FRAME_END)) and kept + len(line) <= MAX_LOG_BYTES:
            frames.append(line)
            kept += len(line)
        else:
            tail.append(line)
    return "\n".join(frames), "\n".join(tail)


def _log_lines(api: Any, pod: Any) -> Any:
    """The ``dryrun`` container's log, line by line (bytes)."""
    try:
        from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager
    except ImportError:
        response = api.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace, container="dryrun",
                                               _preload_content=False)
        rest = b""
        for chunk in response.stream(4096, decode_content=True):
            *lines, rest = (rest + chunk).split(b"\n")
            yield from (line + b"\n" for line in lines)
        if rest:
            yield rest
        return
    yield from PodManager(kube_client=api).read_pod_logs(pod, "dryrun", follow=False)


__all__ = ["DRY_RUN_LABEL", "POLICY_NAME", "PodVenue", "deny_all_policy", "dry_run_pod", "read_log"]
