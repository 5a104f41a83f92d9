"""Each launcher's options, the spec's ``launcher:`` section (:data:`autodl.spec.LauncherSection`, their union keyed
on ``type``): what every launcher takes (``type``, ``env``), what the container launchers share (image, user, code
folder, limits), and Local's, Docker's and Kubernetes' own. Kept apart from the launchers' modules, which import
the placement policy (itself importing the spec).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from autodl.fields import UINT32_ID_MAX, Cpus, TolerationSeconds
from autodl.inputs import short
from autodl.launch.mounts import MountSpec, check_device_node, check_mount_layout
from autodl.registry import LAUNCHERS, check_choice
from autodl.section import Section, parse_size

_USER_RE = re.compile(r"([0-9]+)(?::([0-9]+))?")


def parse_container_user(value: str) -> tuple[int, int | None]:
    """``uid[:gid]`` as numbers, refusing root however it is spelt.

    Only numbers are taken: a user or group *name* is resolved inside the image, where autodl cannot see that it
    is not root (``root``, or any name mapped to uid 0). ``0``, ``00``, ``0:1000`` are uid 0; ``-0`` and
    ``+1000`` are not numbers; a uid above 4294967294 is not a uid (:data:`~autodl.fields.UINT32_ID_MAX`). The root
    group is refused too (``1000:0``, ``65534:0``): the training would share group root's access.

    :returns: ``(uid, gid or None)``.
    :raises ValueError: naming what is wrong and an example that works.
    """
    match = _USER_RE.fullmatch(value) if isinstance(value, str) and len(value) <= 40 else None
    if not match:
        raise ValueError(f"{short(value, 40)} is not a non-root numeric uid[:gid]; write numbers such as '1000:1000' "
                         "(a name resolves inside the image, where autodl cannot check that it is not root)")
    uid = int(match.group(1))
    gid = int(match.group(2)) if match.group(2) is not None else None
    if uid == 0:
        raise ValueError(f"{short(value, 40)} is uid 0, root; the training never runs as root: use a non-root uid "
                         "such as '1000:1000'")
    if gid == 0:
        raise ValueError(f"{short(value, 40)} has gid 0, the root group (files of group root in the image and on "
                         "mounted host folders become readable and writable to the training; a pod's fsGroup 0 gives "
                         "its volumes to group root); use a non-root gid such as '1000:1000'")
    if uid > UINT32_ID_MAX or (gid is not None and gid > UINT32_ID_MAX):
        raise ValueError(f"{short(value, 40)} is out of range (uid and gid are at most {UINT32_ID_MAX}); use a non-root "
                         "uid such as '1000:1000'")
    return uid, gid


class LauncherOptions(Section):
    """What every launcher takes: its name (``type``) and extra environment for the training.

    A subclass per launcher declares ``type`` as the ``Literal`` of its name (the union's tag) and its own fields;
    a key of another launcher is refused by the spec, naming the launcher that has it.
    """

    type: str = Field(description="The launcher, a name of autodl.registry.LAUNCHERS: local, docker or kubernetes.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the training.")

    @field_validator("type", mode="before")
    @classmethod
    def _known_launcher(cls, value: Any) -> Any:
        if not isinstance(value, str):  # {type: 3}: not "should be 'local'", which only the routing picked
            raise ValueError(f"a launcher's name: one of {', '.join(LAUNCHERS)}")
        return check_choice(value, LAUNCHERS, "launcher")

    @field_validator("env", mode="before")
    @classmethod
    def _env_list(cls, value: Any) -> Any:
        """docker-compose's list form (``- NAME=value``, ``environment:`` being a synonym of ``env``) as the mapping
        it means. An item without ``=`` (compose's "take it from the host") and a name given twice are refused."""
        if not isinstance(value, list):
            return value
        pairs: dict[str, Any] = {}
        for item in value:
            name, sep, val = item.partition("=") if isinstance(item, str) else ("", "", "")
            if not sep or not name:
                raise ValueError(f"{short(item, 40)} is not NAME=value; the list form gives each variable its value "
                                 "(autodl passes nothing from the host's environment), or write env as a mapping")
            if name in pairs:
                raise ValueError(f"{short(name, 40)} is given twice")
            pairs[name] = val
        return pairs

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", key):
                raise ValueError(f"{short(key, 40)} is not an environment variable name (letters, digits, _)")
            if "\x00" in val:
                raise ValueError(f"the value of {key} holds a NUL byte")
        return value


class ContainerOptions(LauncherOptions):
    """What the container launchers (Docker, Kubernetes) share: the image, the interpreter and command in it, the
    user, the code folder and the limits. Sizes are validated and stored as bytes; they may be written ``8g``
    (:func:`autodl.section.parse_size`)."""

    image: str | None = Field(None, description="Container image; default: the PaddlePaddle GPU image.")
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    python: str = Field("python", description="Interpreter inside the container (the host's is meaningless there).")
    command: list[str] | None = Field(
        None, description="Replaces the whole training command (argv) inside the container; for tests and odd images."
    )
    shm_size: int | None = Field(None, description="/dev/shm size, bytes (e.g. '8g'); overrides the profile's.")
    memory_limit: int | None = Field(None, description="Container memory limit, bytes (e.g. '32g').")
    cpus: Cpus | None = Field(None, description="CPU limit in cores.")
    user: str = Field("1000:1000", description="uid[:gid] the training runs as; never root.")
    code_dir: str = Field("/workspace", description="Where the code is mounted (read-only) inside the container.")

    @field_validator("shm_size", "memory_limit", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return parse_size(value)

    @field_validator("code_dir")
    @classmethod
    def _absolute_dir(cls, value: str) -> str:
        # normalised first, so '/.', '//' and '/a/..' are the root they name (issue 23)
        normal = posixpath.normpath(value) if value.startswith("/") else value
        if not normal.startswith("/") or normal.strip("/") == "":
            raise ValueError("must be an absolute folder other than '/', e.g. /workspace")
        return normal.rstrip("/")

    @field_validator("user")
    @classmethod
    def _non_root(cls, value: str) -> str:
        uid, gid = parse_container_user(value)
        return f"{uid}:{gid}" if gid is not None else str(uid)

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str | None) -> str | None:
        # a reference has no spaces or control characters (docker's grammar: distribution/reference)
        if value is not None and (not value or len(value) > 512 or any(c.isspace() or not c.isprintable() for c in value)
                                  or value.startswith("-")):
            raise ValueError(f"{short(value, 60)} is not an image reference (e.g. paddlepaddle/paddle:3.3.1-gpu-"
                             "cuda12.6-cudnn9.5); no spaces, no leading '-'")
        return value

    @field_validator("command")
    @classmethod
    def _nonempty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("an empty command runs nothing; remove the key or give argv")
        return value


class LocalOptions(LauncherOptions):
    """``launcher: local``: the training as a process of this host's interpreter, in its bubblewrap sandbox; it
    takes ``env`` only (no image, user or mounts: the process sees this host's files as the sandbox allows)."""

    type: Literal["local"] = "local"


class DockerOptions(ContainerOptions):
    """``launcher: docker``: the container options shared with Kubernetes (:class:`ContainerOptions`) and Docker's
    own: the IPC namespace, network, runtime, device nodes and host folders mounted. The mounts and device nodes are
    checked by name here and against the host that mounts at launch (:func:`autodl.launch.mounts.check_host_paths`).
    """

    type: Literal["docker"] = "docker"
    ipc_mode: Literal["private", "shareable", "host"] | None = Field(
        None, description="Docker IPC namespace; 'host' shares the host's /dev/shm instead of sizing one."
    )
    network: str | None = Field(None, description="Docker network ('none' to cut it off); default: Docker's.")
    runtime: str | None = Field(None, description="Docker runtime, e.g. 'nvidia' or 'ascend'; default: the daemon's.")
    devices: list[str] = Field(
        default_factory=list, description="Host device nodes passed through (AMD/Hygon/Kunlun), e.g. /dev/kfd."
    )
    mounts: list[MountSpec] = Field(default_factory=list, description="Host folders mounted into the container.")

    @field_validator("network")
    @classmethod
    def _own_network(cls, value: str | None) -> str | None:
        if value is None:
            return value
        name = value.strip().lower()
        if name == "host" or name.startswith(("container:", "ns:")) or not value or len(value) > 200 \
                or any(c.isspace() or ord(c) < 32 for c in value):
            raise ValueError(f"{short(value, 40)} is not allowed: 'host' puts the training on the host's network "
                             "(127.0.0.1: PostgreSQL, Airflow, the Docker API if exposed) and 'container:NAME' into "
                             "another container's; use 'none', 'bridge' or a user-defined network's name")
        return value

    @field_validator("devices")
    @classmethod
    def _accelerator_nodes(cls, value: list[str]) -> list[str]:
        for item in value:
            check_device_node(item)
        return value

    @model_validator(mode="after")
    def _mounts_distinct(self) -> "DockerOptions":
        check_mount_layout(self.mounts, self.code_dir)
        return self

    @model_validator(mode="after")
    def _shm_or_ipc(self) -> "DockerOptions":
        if self.ipc_mode == "host" and self.shm_size is not None:
            raise ValueError("shm_size and ipc_mode: host exclude each other (host IPC uses the host's /dev/shm); keep one")
        return self


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label that hands a pod or Job to Kueue's LocalQueue of that name
(https://kueue.sigs.k8s.io/docs/tasks/run/plain_pods/)."""

_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_RESERVED_PREFIXES = ("kubernetes.io", "k8s.io")
AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
"""The fields of a Kubernetes ``Affinity`` (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling)."""


def check_metadata_key(key: str) -> str:
    """Refuse a label or annotation key that is not ``[prefix/]name`` (a DNS subdomain and a 63-character name,
    https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set), that uses
    autodl's own ``autodl/`` prefix (its launches find their pods by it) or a prefix Kubernetes reserves for itself."""
    prefix, slash, name = key.rpartition("/")
    if not _LABEL_NAME.fullmatch(name) or (slash and not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(f"{short(key, 60)} is not a Kubernetes key ([prefix/]name: name of at most 63 letters, "
                         "digits, '-', '_', '.', prefix a DNS subdomain)")
    if prefix == "autodl":
        raise ValueError(f"{short(key, 60)}: the autodl/ prefix is autodl's own (its launches find their pods by it); "
                         "use a prefix of your own, e.g. example.com/team")
    if any(prefix == p or prefix.endswith("." + p) for p in _RESERVED_PREFIXES):
        raise ValueError(f"{short(key, 60)}: the kubernetes.io/ and k8s.io/ prefixes are reserved for Kubernetes' core "
                         "components; use a prefix of your own")
    return key


class TolerationSpec(Section):
    """A Kubernetes toleration (https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: TolerationSeconds | None = None


class KubernetesOptions(ContainerOptions):
    """``launcher: kubernetes``: the container options shared with Docker (:class:`ContainerOptions`) and the pod's
    own: namespace, scheduling (node selector, tolerations, affinity, priority class, Kueue queue), identity
    (service account, pull secrets), metadata, requests, the code's claim and a pod template."""

    type: Literal["kubernetes"] = "kubernetes"
    namespace: str | None = Field(None, description="Kubernetes namespace; default: the connection's, else 'default'.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Added to the GPU product selector.")
    tolerations: list[TolerationSpec] = Field(default_factory=list, description="Added to the GPU taint's.")
    service_account: str | None = None
    image_pull_secrets: list[str] = Field(default_factory=list)
    code_pvc: str | None = Field(
        None, description="PersistentVolumeClaim holding the code, mounted read-only at code_dir; default: code in the image."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels (Kubernetes).")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations (Kubernetes).")
    priority_class: str | None = Field(None, description="The pod's PriorityClass name (priorityClassName).")
    affinity: dict[str, Any] | None = Field(
        None, description="The pod's affinity, as in a manifest (nodeAffinity, podAffinity, podAntiAffinity).")
    cpu_request: Cpus | None = Field(None, description="CPU request in cores; default: from the estimate.")
    memory_request: int | None = Field(None, description="Memory request, bytes (e.g. '16g'); default: from the estimate.")
    pod_template_file: str | None = Field(
        None, description="Pod YAML merged under autodl's pod, as KubernetesPodOperator's pod_template_file.")
    kueue_queue: str | None = Field(
        None, description="Kueue LocalQueue: the pod is created gated and Kueue admits it; autodl does not queue it.")

    @field_validator("memory_request", mode="before")
    @classmethod
    def _request_size(cls, value: Any) -> int | None:
        return parse_size(value)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        # a Kubernetes namespace is a DNS-1123 label; the system ones are where admission policies are often exempt
        if value is not None and not re.fullmatch(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", value):
            raise ValueError(f"{short(value, 40)} is not a Kubernetes namespace name (lower-case letters, digits and "
                             "'-', at most 63)")
        if value in ("kube-system", "kube-public", "kube-node-lease"):
            raise ValueError(f"{value} is Kubernetes' own namespace (where admission policies are often exempt); "
                             "run the training in a namespace of its own")
        return value

    @field_validator("image_pull_secrets")
    @classmethod
    def _secret_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _DNS_SUBDOMAIN.fullmatch(name):
                raise ValueError(f"{short(name, 40)} is not a Kubernetes Secret name (lower-case letters, digits, '-' "
                                 "and '.', at most 253)")
        return value

    @field_validator("labels", "annotations")
    @classmethod
    def _metadata(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key, val in value.items():
            check_metadata_key(key)
            if info.field_name == "labels" and not (len(val) <= 63 and _LABEL_VALUE.fullmatch(val)):
                raise ValueError(f"the value of {short(key, 60)}, {short(val, 40)}, is not a label value (at most 63 "
                                 "letters, digits, '-', '_', '.', starting and ending alphanumeric); put free text in "
                                 "launcher.annotations")
        if info.field_name == "annotations" and sum(len(k) + len(v) for k, v in value.items()) > 256 * 1024:
            raise ValueError("annotations hold more than 256 KiB in all (Kubernetes' limit); keep large data elsewhere")
        return value

    @field_validator("service_account", "priority_class", "kueue_queue")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        if value is not None and not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(f"{short(value, 40)} is not a Kubernetes object name (lower-case letters, digits, '-' "
                             "and '.', at most 253)")
        return value

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            wrong = sorted(set(value) - set(AFFINITY_KEYS))
            if wrong or not all(isinstance(v, dict) for v in value.values()):
                raise ValueError(f"{short(', '.join(wrong) or 'a value', 60)}: an affinity holds only mappings under "
                                 f"{', '.join(AFFINITY_KEYS)} (the manifest's camelCase form)")
        return value

    @field_validator("pod_template_file")
    @classmethod
    def _template_path(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or "\x00" in value):
            raise ValueError(f"{short(value, 60)} must be an absolute path of a pod YAML file on the launching host")
        return value

    @model_validator(mode="before")
    @classmethod
    def _queue_from_label(cls, data: Any) -> Any:
        # a user following Kueue's docs writes the label; either spelling is the Kueue mode
        if isinstance(data, dict) and isinstance(data.get("labels"), dict) and KUEUE_QUEUE_LABEL in data["labels"]:
            labels = dict(data["labels"])
            named = labels.pop(KUEUE_QUEUE_LABEL)
            if data.get("kueue_queue") not in (None, named):
                raise ValueError(f"launcher.kueue_queue ({data['kueue_queue']}) and the label {KUEUE_QUEUE_LABEL} "
                                 f"({named}) name different queues; keep one")
            data = {**data, "labels": labels, "kueue_queue": named}
        return data

    @model_validator(mode="after")
    def _requests_within_limits(self) -> "KubernetesOptions":
        if self.memory_request and self.memory_limit and self.memory_request > self.memory_limit:
            raise ValueError("memory_request is above memory_limit (Kubernetes refuses such a pod); lower the request "
                             "or raise the limit")
        if self.cpu_request and self.cpus and self.cpu_request > self.cpus:
            raise ValueError("cpu_request is above cpus, the CPU limit (Kubernetes refuses such a pod); lower the "
                             "request or raise the limit")
        return self


ALL_OPTION_FIELDS = frozenset(LocalOptions.model_fields) | set(DockerOptions.model_fields) | set(KubernetesOptions.model_fields)
"""Every field of some launcher's options: the fields of the flat ``launcher:`` section they replace."""


__all__ = ["ALL_OPTION_FIELDS", "KUEUE_QUEUE_LABEL", "ContainerOptions", "DockerOptions", "KubernetesOptions", "LauncherOptions", "LocalOptions",
           "TolerationSpec", "check_metadata_key", "parse_container_user"]
