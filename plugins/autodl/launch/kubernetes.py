"""Kubernetes launcher: the training in a pod that requests the booked number of devices from the vendor's device plugin.

Details: docs/launchers.md#autodllaunchkubernetes.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from functools import cached_property
from typing import Any

import yaml

from autodl.catalog import Catalog, VendorInfo, load_catalog
from autodl.errors import LaunchError
from autodl.hosts import UNKNOWN_HOSTS
from autodl.launch.base import (
    LaunchRequest,
    LogStream,
    container_script,
    launcher_options,
    run_labels,
    training_command,
)
from autodl.launch.docker import DEFAULT_IMAGE, LAUNCH_LOG_DIR, LOG_DRAIN_S
from autodl.launch.options import KUEUE_QUEUE_LABEL, KubernetesOptions, parse_container_user
from autodl.launch.packed import memory_cap
from autodl.redact import redact_env, redact_obj
from autodl.types import LaunchHandle

log = logging.getLogger(__name__)

LABEL_PREFIX = "autodl/"
"""Prefix of autodl's pod labels and annotations (a DNS-label prefix, as Kubernetes requires:
https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set)."""

RUN_KEY_HASH_LABEL = f"{LABEL_PREFIX}run-key-hash"
"""The label launches select by: a hash of the run key, since sanitised label values may collide."""

CONTAINER_NAME = "base"
"""Name of the training container: the cncf.kubernetes provider's convention (``KubernetesPodOperator``
names its main container ``base`` and reads logs from it), so a pod built here runs unchanged under it."""

STOP_GRACE_S = 30
"""Seconds between SIGTERM and SIGKILL when deleting a pod (Kubernetes' default
``terminationGracePeriodSeconds``)."""

EMPTYDIR_URL = "https://kubernetes.io/docs/concepts/storage/volumes/#emptydir"

_LABEL_VALUE_MAX = 63
_LIVE_PHASES = {"Pending", "Running"}
_PULL_FAILURES = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName"}


def safe_label_value(value: str) -> str:
    """``value`` made a valid label value: at most 63 characters of ``[A-Za-z0-9_.-]``, starting and
    ending alphanumeric. A changed or shortened value ends with a hash of the original so distinct
    inputs stay distinct (the rule of Airflow's ``make_safe_label_value`` in the cncf.kubernetes provider).
    """
    safe = re.sub(r"^[^A-Za-z0-9]*|[^A-Za-z0-9_.-]|[^A-Za-z0-9]*$", "", value)
    if len(safe) > _LABEL_VALUE_MAX or safe != value:
        digest = hashlib.md5(value.encode(), usedforsecurity=False).hexdigest()[:9]
        safe = re.sub(r"[^A-Za-z0-9]*$", "", safe[: _LABEL_VALUE_MAX - len(digest) - 1])
        safe = f"{safe}-{digest}" if safe else digest
    return safe


def run_key_hash(run_key: str) -> str:
    """First 16 hex digits of the SHA-1 of ``run_key``: the selector label of its pods."""
    return hashlib.sha1(run_key.encode()).hexdigest()[:16]


def pod_name(request: LaunchRequest) -> str:
    """A pod name unique per try: ``autodl-<slug>-<hash>-t<try>``, a DNS-1123 label (<= 63 chars)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", request.run_key.lower()).strip("-")[:36] or "run"
    try_number = request.labels.get("try_number")
    suffix = f"t{try_number}" if try_number not in (None, "") else "t0"
    return f"autodl-{slug}-{run_key_hash(request.run_key)[:8]}-{suffix}"


def quantity(n_bytes: int) -> str:
    """``n_bytes`` as a Kubernetes quantity (``8Gi``, ``512Mi``, or plain bytes)."""
    for unit, factor in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n_bytes % factor == 0:
            return f"{n_bytes // factor}{unit}"
    return str(n_bytes)


HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The well-known node label holding the node's name (https://kubernetes.io/docs/reference/labels-annotations-taints/#kubernetesiohostname)."""


def booked_node(request: LaunchRequest) -> str | None:
    """The node the booked devices are on, or None for a CPU run (a declared pool's host is not a node).

    A pool spans nodes and the lease names devices of one of them, so the pod must start there: a
    ``nodeSelector`` on :data:`HOSTNAME_LABEL` (rather than ``nodeName``) keeps the Kubernetes scheduler
    in charge of resources and taints. The node is the device's ``labels["kubernetes.io/hostname"]``
    when the inventory gives one, else its ``host`` (dcgm-exporter's ``Hostname``: the node name under
    the GPU Operator; NVML's: this machine's host name). A device whose host is unknown (``localhost``,
    ``unknown``, empty) pins nothing: the product selector alone places the pod, as on one node.

    :raises LaunchError: when the booked devices are on more than one node (one pod cannot span nodes).
    """
    if request.on_cpu or not request.devices:
        return None
    nodes = {d.labels.get(HOSTNAME_LABEL) or d.host for d in request.devices} - UNKNOWN_HOSTS
    if not nodes:
        return None
    if len(nodes) != 1:
        raise LaunchError(f"run {request.run_key}: the booked devices are on several nodes ({', '.join(sorted(nodes))}); "
                          "one pod runs on one node: book devices of one host.")
    return nodes.pop()


def product_label_value(model_name: str, catalog: Catalog, vendor: VendorInfo | None = None) -> str | None:
    """The node label value naming a catalog model, or ``None`` when unknown.

    The vendor table's ``k8s_product_values`` first (Ascend Device Plugin: ``accelerator=huawei-Ascend910``);
    else GPU Feature Discovery's form: the NVML product name with spaces replaced by dashes
    (``NVIDIA A100-SXM4-40GB`` -> ``NVIDIA-A100-SXM4-40GB``; https://github.com/NVIDIA/k8s-device-plugin/tree/main/docs/gpu-feature-discovery);
    the catalog's first ``nvml_names`` entry is that product name.
    """
    model = catalog.find(model_name)
    if model is None:
        return None
    if vendor is not None and model.name in vendor.k8s_product_values:
        return safe_label_value(vendor.k8s_product_values[model.name])
    name = model.nvml_names[0] if model.nvml_names else model.name
    return safe_label_value(re.sub(r"\s+", "-", name.strip()))


def mig_strategy(vendor: VendorInfo) -> str:
    """The NVIDIA device plugin's MIG strategy assumed for the cluster: ``$AUTODL_MIG_STRATEGY``, else the vendor table's.

    :raises LaunchError: for a value other than ``single`` or ``mixed``.
    """
    import os

    value = os.environ.get("AUTODL_MIG_STRATEGY") or vendor.k8s_mig_strategy or "single"
    if value not in ("single", "mixed"):
        raise LaunchError(f"AUTODL_MIG_STRATEGY={value!r}: use 'single' or 'mixed', as the cluster's NVIDIA device "
                          "plugin is configured (migStrategy).")
    return value


def shared_resource(vendor: VendorInfo) -> str | None:
    """The extended resource a packed 1-device pod asks for: ``$AUTODL_K8S_SHARED_RESOURCE``, else the vendor
    table's ``k8s_shared_resource`` (NVIDIA: ``nvidia.com/gpu``, which the device plugin hands out as time-sliced
    replicas once the node's plugin is configured with ``replicas: 2``; ``nvidia.com/gpu.shared`` with
    ``renameByDefault: true``: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html).
    None: the vendor has no shared resource.

    :raises LaunchError: for a value that is not an extended resource name (``<domain>/<name>``).
    """
    import os

    value = os.environ.get("AUTODL_K8S_SHARED_RESOURCE") or vendor.k8s_shared_resource
    if value is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", value):
        raise LaunchError(f"AUTODL_K8S_SHARED_RESOURCE={value!r} is not an extended resource name: use the one the "
                          "node's device plugin advertises for time-sliced replicas, e.g. nvidia.com/gpu or "
                          "nvidia.com/gpu.shared.")
    return value


def packed_resource(request: LaunchRequest, vendor: VendorInfo, resource: str) -> str:
    """``resource``, or the vendor's :func:`shared_resource` when ``request`` is a packed 1-device run on a whole
    device (its ``device_memory_cap_bytes`` is set); a MIG instance keeps its own resource."""
    device = request.devices[0] if len(request.devices) == 1 else None
    if request.device_memory_cap_bytes is None or device is None or (device.labels or {}).get("mig_profile"):
        return resource
    shared = shared_resource(vendor)
    if shared is None:
        log.warning("run %s is packed, but the vendor of %s has no shared Kubernetes resource: asking for %s",
                    request.run_key, device.model, resource)
        return resource
    log.info("run %s is packed: asking for %s (the node's device plugin must hand it out as time-sliced replicas, "
             "replicas: 2)", request.run_key, shared)
    return shared


def device_resource(device: Any, vendor: VendorInfo, catalog: Catalog) -> tuple[str, dict[str, str]]:
    """The extended resource and node selector for devices like ``device``.

    A MIG instance (``labels['mig_profile']``) under the ``single`` strategy is an ``nvidia.com/gpu``
    on nodes labelled ``nvidia.com/gpu.product=<product>-MIG-<profile>``; under ``mixed`` it is an
    ``nvidia.com/mig-<profile>`` on nodes of the parent product (NVIDIA k8s-device-plugin, "MIG
    support"; GPU Operator with MIG: https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-mig.html).
    A whole device: the model's (else the vendor's) resource, and the vendor's product label when it has one.
    """
    from autodl.inventory.effective import base_model

    profile = device.labels.get("mig_profile") if getattr(device, "labels", None) else None
    base = base_model(device, catalog)
    selector: dict[str, str] = {}
    if profile and base is not None:
        product = product_label_value(base.name, catalog, vendor)
        if mig_strategy(vendor) == "mixed":
            resource = f"nvidia.com/mig-{profile}"
        else:
            resource = vendor.k8s_resource
            product = safe_label_value(f"{product}-MIG-{profile}") if product else None
        if product and vendor.k8s_product_label:
            selector[vendor.k8s_product_label] = product
        return resource, selector
    resource = (base.k8s_resource if base and base.k8s_resource else None) or vendor.k8s_resource
    product = product_label_value(device.model, catalog, vendor)
    if product and vendor.k8s_product_label:
        selector[vendor.k8s_product_label] = product
    elif vendor.k8s_product_label is None:
        log.warning("vendor of %s documents no node label for the device model: no product node selector", device.model)
    else:
        log.warning("device model %s is not in the catalog: no product node selector", device.model)
    return resource, selector


def pod_uid_gid(user: str, run_key: str) -> tuple[int, int | None]:
    """(uid, gid or None) a pod of ``run_key`` runs as, from ``launcher.user``; never uid 0 (the spec's check)."""
    try:
        return parse_container_user(user)  # the same check as the spec's: never uid 0, however it is spelt
    except ValueError as exc:
        raise LaunchError(
            f"run {run_key}: launcher.user: {exc}; Kubernetes' securityContext.runAsUser takes a numeric uid."
        ) from None


def pod_resource_total(pod: dict[str, Any], resource: str) -> int:
    """What the scheduler counts for ``resource`` in a pod (JSON form, camelCase): the sum of the
    app containers' limits, or the largest init container's if larger (Kubernetes' effective
    request rule, https://kubernetes.io/docs/concepts/workloads/pods/init-containers/#resource-sharing-within-containers).
    """

    def amount(container: dict[str, Any]) -> int:
        limits = (container.get("resources") or {}).get("limits") or {}
        return int(limits.get(resource, 0))

    spec = pod.get("spec") or {}
    app = sum(amount(c) for c in spec.get("containers") or [])
    init = max((amount(c) for c in spec.get("initContainers") or []), default=0)
    return max(app, init)


KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"
"""The scheduling gate Kueue holds a plain pod behind until its Workload is admitted, then removes
(https://kueue.sigs.k8s.io/docs/tasks/run/plain_pods/; Kubernetes' pod scheduling readiness:
https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/)."""


def cpu_quantity(cores: float) -> str:
    """``cores`` as a Kubernetes CPU quantity in millicores (``1.5`` -> ``1500m``)."""
    return f"{max(1, round(cores * 1000))}m"


def pod_requests(request: LaunchRequest, opts: Any) -> dict[str, str]:
    """The pod's CPU and memory ``requests``: the spec's ``cpu_request`` / ``memory_request``, else the estimate's
    (:func:`autodl.launch.base.host_requests`, carried on the request), else one rank's floor; never above the
    spec's limits. With a CPU and memory request a pod's QoS class is Burstable, not BestEffort (evicted first:
    https://kubernetes.io/docs/concepts/workloads/pods/pod-qos/)."""
    from autodl.launch.base import RANK_HOST_MEMORY_FLOOR_BYTES

    cpu = opts.cpu_request or request.cpu_request or 1.0
    memory = opts.memory_request or request.memory_request_bytes or (
        RANK_HOST_MEMORY_FLOOR_BYTES + int(opts.shm_size or request.shm_bytes or 0))
    if opts.cpus and cpu > opts.cpus:
        log.info("run %s: the estimated %.1f CPU cores exceed launcher.cpus; requesting the limit", request.run_key, cpu)
        cpu = opts.cpus
    limit = opts.memory_limit or request.memory_limit_bytes
    if limit and memory > limit:
        log.warning("run %s: the estimated host memory (%d bytes) exceeds the memory limit (%d bytes); requesting "
                    "the limit, and the training may be OOM-killed: raise launcher.memory_limit", request.run_key,
                    memory, limit)
        memory = limit
    return {"cpu": cpu_quantity(cpu), "memory": quantity(int(memory))}


def pod_metadata(request: LaunchRequest, opts: Any) -> tuple[dict[str, str], dict[str, str]]:
    """The pod's labels and annotations: the spec's, then the run's identity (labels sanitised, annotations
    verbatim), :data:`RUN_KEY_HASH_LABEL`, ``app.kubernetes.io/managed-by`` and, in the Kueue mode, the
    :data:`KUEUE_QUEUE_LABEL` naming the LocalQueue."""

    identity = run_labels(request)
    labels = {**opts.labels, **{f"{LABEL_PREFIX}{k.replace('_', '-')}": safe_label_value(v) for k, v in identity.items()}}
    labels[RUN_KEY_HASH_LABEL] = run_key_hash(request.run_key)
    labels["app.kubernetes.io/managed-by"] = "autodl"
    if opts.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = opts.kueue_queue
    annotations = {**opts.annotations, **{f"{LABEL_PREFIX}{k.replace('_', '-')}": v for k, v in identity.items()}}
    return labels, annotations


def affinity_model(affinity: dict[str, Any] | None) -> Any:
    """The spec's affinity (manifest form, camelCase) as a ``V1Affinity``, or None."""
    if not affinity:
        return None
    from kubernetes.client import ApiClient, Configuration

    # the client's own deserializer (private; cncf.kubernetes' PodGenerator.deserialize_model_dict uses it too)
    return ApiClient(configuration=Configuration())._ApiClient__deserialize(affinity, "V1Affinity")


def merge_pod_template(pod: Any, path: str, run_key: str) -> Any:
    """``pod`` merged over the pod YAML at ``path`` as ``KubernetesPodOperator`` merges its ``pod_template_file``
    (the cncf.kubernetes provider's ``PodGenerator.reconcile_pods``): what autodl sets wins, the template fills in
    the rest; lists (volumes, env, mounts) are concatenated. The template's container named ``base`` is the one
    merged with the training container; its other containers stay as they are (sidecars).

    :raises LaunchError: when the file is missing or not a pod, or the provider is not installed.
    """
    try:
        from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
    except ImportError:
        raise LaunchError(f"run {run_key}: launcher.pod_template_file needs apache-airflow-providers-cncf-kubernetes "
                          "(pip install 'autodl[kubernetes]'), whose pod merge it uses.") from None
    from kubernetes import client as k8s

    try:
        with open(path, encoding="utf-8") as stream:
            data = yaml.safe_load(stream)
    except (OSError, yaml.YAMLError) as exc:
        raise LaunchError(f"run {run_key}: launcher.pod_template_file {path}: cannot read it ({exc}); give the "
                          "absolute path of a pod YAML file on the host that launches.") from None
    if not isinstance(data, dict) or data.get("kind", "Pod") != "Pod":
        raise LaunchError(f"run {run_key}: launcher.pod_template_file {path} is not a pod manifest (kind: Pod with "
                          "metadata and spec); fix the file.")
    template = PodGenerator.deserialize_model_dict(data)
    if template.spec is not None and template.spec.containers:
        base = [c for c in template.spec.containers if c.name == CONTAINER_NAME] or [k8s.V1Container(name=CONTAINER_NAME)]
        template.spec.containers = base + [c for c in template.spec.containers if c.name != CONTAINER_NAME]
    return PodGenerator.reconcile_pods(template, pod)


def _pod_volumes(request: LaunchRequest, opts: Any) -> tuple[list[Any], list[Any]]:
    """The pod's volumes and the training container's mounts: ``/dev/shm`` in memory, the code's claim read-only."""
    from kubernetes import client as k8s

    volumes = []
    mounts = []
    shm = opts.shm_size or request.shm_bytes
    if shm:
        volumes.append(k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory",
                                                                                    size_limit=quantity(int(shm)))))
        mounts.append(k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"))
    if opts.code_pvc:
        volumes.append(k8s.V1Volume(name="code", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
            claim_name=opts.code_pvc, read_only=True)))
        mounts.append(k8s.V1VolumeMount(name="code", mount_path=opts.code_dir, read_only=True))
    return volumes, mounts


def _training_container(opts: Any, argv: list[str], env: dict[str, str], limits: dict[str, str],
                        requests: dict[str, str], mounts: list[Any]) -> Any:
    """The pod's one training container (:data:`CONTAINER_NAME`): unprivileged, all capabilities dropped."""
    from kubernetes import client as k8s

    return k8s.V1Container(
        name=CONTAINER_NAME,
        image=opts.image or DEFAULT_IMAGE,
        image_pull_policy=opts.image_pull_policy,
        command=argv,
        working_dir=opts.code_dir,
        env=[k8s.V1EnvVar(name=k, value=v) for k, v in env.items()],
        resources=k8s.V1ResourceRequirements(limits=limits or None, requests=requests),
        volume_mounts=mounts or None,
        security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False, capabilities=k8s.V1Capabilities(drop=["ALL"])
        ),
    )


def _pod_spec(opts: Any, container: Any, node_selector: dict[str, str], tolerations: list[Any], volumes: list[Any],
              uid: int, gid: int | None) -> Any:
    """The ``V1PodSpec``: never restarted, non-root, no service account token unless a service account is named."""
    from kubernetes import client as k8s

    return k8s.V1PodSpec(
        restart_policy="Never",
        containers=[container],
        node_selector=node_selector or None,
        tolerations=tolerations or None,
        volumes=volumes or None,
        service_account_name=opts.service_account,
        automount_service_account_token=bool(opts.service_account),
        image_pull_secrets=[k8s.V1LocalObjectReference(name=s) for s in opts.image_pull_secrets] or None,
        termination_grace_period_seconds=STOP_GRACE_S,
        priority_class_name=opts.priority_class,
        affinity=affinity_model(opts.affinity),
        scheduling_gates=[k8s.V1PodSchedulingGate(name=KUEUE_ADMISSION_GATE)] if opts.kueue_queue else None,
        security_context=k8s.V1PodSecurityContext(
            run_as_non_root=True, run_as_user=uid, run_as_group=gid, fs_group=gid,
            seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"),
        ),
    )


class KubernetesLauncher:
    """Runs the training in a pod (kubernetes client's ``CoreV1Api``).

    :param namespace: namespace of the pods unless the spec's ``launcher.namespace`` says otherwise;
        default ``default``.
    :param in_cluster: use the service account of the pod Airflow runs in.
    :param config_file: kubeconfig path; default ``~/.kube/config`` / ``KUBECONFIG``.
    :param cluster_context: kubeconfig context.
    :param config_dict: a kubeconfig as a mapping (the connection's inline ``kube_config``).
    :param api: a ready ``CoreV1Api`` (tests, callers sharing one).
    :param catalog: the GPU catalog; default :func:`~autodl.catalog.load_catalog`.
    """

    name = "kubernetes"
    options = KubernetesOptions

    def __init__(
        self,
        namespace: str | None = None,
        *,
        in_cluster: bool | None = None,
        config_file: str | None = None,
        cluster_context: str | None = None,
        config_dict: dict[str, Any] | None = None,
        api: Any = None,
        catalog: Catalog | None = None,
        **_ignored: Any,
    ):
        self.namespace = namespace
        self.in_cluster = in_cluster
        self.config_file = config_file
        self.cluster_context = cluster_context
        self.config_dict = config_dict
        self._catalog = catalog
        if api is not None:
            self.__dict__["api"] = api

    @cached_property
    def api(self) -> Any:
        """``CoreV1Api`` from the in-cluster config, ``config_dict`` or the kubeconfig.

        :raises LaunchError: when no configuration can be loaded.
        """
        from kubernetes import client, config

        try:
            if self.in_cluster:
                configuration = client.Configuration()
                config.load_incluster_config(client_configuration=configuration)
                api_client = client.ApiClient(configuration)
            elif self.config_dict:
                api_client = config.new_client_from_config_dict(self.config_dict, context=self.cluster_context)
            else:
                api_client = config.new_client_from_config(config_file=self.config_file, context=self.cluster_context)
        except (config.ConfigException, OSError) as exc:
            raise LaunchError(
                f"cannot configure the Kubernetes client: {exc}; set in_cluster, kube_config_path or kube_config in "
                "the Airflow connection kubernetes_default (or KUBECONFIG)."
            ) from exc
        return client.CoreV1Api(api_client)

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    # ------------------------------------------------------------------------------- planning
    def _vendor(self, request: LaunchRequest) -> VendorInfo:
        if request.vendor is not None:
            return request.vendor
        return self.catalog.vendor(request.devices[0].vendor if request.devices else "nvidia")

    def build_pod(self, request: LaunchRequest) -> Any:
        """The ``V1Pod`` for ``request``; pure, never contacts the cluster.

        * ``limits`` and equal ``requests`` of ``N`` of the model's (else the vendor's) ``k8s_resource``
          on the one training container; memory and CPU limits from the spec or the request; CPU and
          memory requests always (:func:`pod_requests`), so the pod is never BestEffort.
        * the spec's ``labels``, ``annotations``, ``priority_class`` and ``affinity``; in the Kueue mode
          (``kueue_queue``) the queue label and :data:`KUEUE_ADMISSION_GATE`, and no pin to the booked node.
        * merged over ``pod_template_file`` when given (:func:`merge_pod_template`).
        * ``nodeSelector`` on the vendor's product label (GFD) plus the spec's ``node_selector``.
        * a toleration of the vendor's GPU taint plus the spec's ``tolerations``.
        * ``/dev/shm`` as an ``emptyDir`` with ``medium: Memory`` and ``sizeLimit`` (:data:`EMPTYDIR_URL`;
          its pages count against the container's memory limit).
        * ``runAsNonRoot`` with the spec's numeric ``user``; no privilege escalation, no service
          account token unless a service account is named.

        :raises LaunchError: for invalid launcher options.
        """
        from kubernetes import client as k8s

        opts = launcher_options(request, KubernetesOptions)
        vendor = self._vendor(request)
        on_cpu = request.on_cpu or not request.devices
        _, script_inside = container_script(request, opts.code_dir)
        # no visibility variable in the pod (the device plugin pins): --devices lists positions 0..n-1
        argv = list(opts.command) if opts.command else training_command(
            request, python=opts.python, script=script_inside, visible="", log_dir=LAUNCH_LOG_DIR)
        uid, gid = pod_uid_gid(opts.user, request.run_key)
        env = self._container_env(request, opts, vendor, on_cpu=on_cpu)
        limits, node_selector, tolerations = self._pod_placement(request, opts, vendor, on_cpu=on_cpu)
        requests = {**limits, **pod_requests(request, opts)}
        memory = opts.memory_limit or request.memory_limit_bytes
        if memory:
            limits["memory"] = quantity(int(memory))
        if opts.cpus:
            limits["cpu"] = cpu_quantity(opts.cpus)
        volumes, mounts = _pod_volumes(request, opts)
        labels, annotations = pod_metadata(request, opts)
        container = _training_container(opts, argv, env, limits, requests, mounts)
        spec = _pod_spec(opts, container, node_selector, tolerations, volumes, uid, gid)
        metadata = k8s.V1ObjectMeta(
            name=pod_name(request), namespace=self._namespace(opts), labels=labels, annotations=annotations
        )
        pod = add_measurement(k8s.V1Pod(api_version="v1", kind="Pod", metadata=metadata, spec=spec), request, opts)
        return merge_pod_template(pod, opts.pod_template_file, request.run_key) if opts.pod_template_file else pod

    def _container_env(self, request: LaunchRequest, opts: Any, vendor: VendorInfo, *, on_cpu: bool) -> dict[str, str]:
        """The training container's environment: the spec's, the memory cap, the run's identity; no visibility."""
        env = {"HOME": "/tmp", "PYTHONUNBUFFERED": "1", **request.env, **opts.env}
        cap_env, cap_notes = memory_cap(request, {**request.env, **opts.env})  # time-slicing isolates no memory
        env.update(cap_env)
        for note in cap_notes:
            log.info("%s", note)
        visibility = {v.visible_devices_env for v in self.catalog.vendors.values()} | {
            v.container_visible_env for v in self.catalog.vendors.values()
        }
        for key in sorted(visibility & env.keys()):
            log.warning("dropping %s=%s: in Kubernetes the device plugin chooses the devices", key, env[key])
            del env[key]
        if on_cpu:
            env.update(vendor.cpu_only_container_env)
        env["AUTODL_RUN_KEY"] = request.run_key
        env["AUTODL_PADDLE_DEVICE"] = "cpu" if on_cpu else vendor.paddle_device
        if request.labels.get("lease_id"):
            env["AUTODL_LEASE_ID"] = str(request.labels["lease_id"])
        return env

    def _pod_placement(self, request: LaunchRequest, opts: Any, vendor: VendorInfo, *,
                       on_cpu: bool) -> tuple[dict[str, str], dict[str, str], list[Any]]:
        """The device limits, node selector and tolerations that pin the pod to the booked devices' node."""
        from kubernetes import client as k8s

        limits: dict[str, str] = {}
        node_selector: dict[str, str] = {}
        tolerations: list[Any] = []
        if not on_cpu:
            resource, selector = device_resource(request.devices[0], vendor, self.catalog)
            limits[packed_resource(request, vendor, resource)] = str(len(request.devices))
            node_selector.update(selector)
            tolerations.append(k8s.V1Toleration(key=vendor.k8s_taint_key, operator="Exists", effect="NoSchedule"))
        for key, value in opts.node_selector.items():
            if node_selector.get(key, value) != value:  # the booked device's own label (e.g. its GPU product)
                raise LaunchError(
                    f"run {request.run_key}: launcher.node_selector sets {key}={value}, but the booked device "
                    f"{request.devices[0].device_id} needs {key}={node_selector[key]}; remove that selector (autodl selects "
                    "the booked device's label), or restrict the devices with resource_policy instead."
                )
        node_selector.update(opts.node_selector)
        node = None if opts.kueue_queue else booked_node(request)  # under Kueue, Kueue and the scheduler place it
        if node is not None:
            chosen = node_selector.get(HOSTNAME_LABEL)
            if chosen not in (None, node):
                raise LaunchError(
                    f"run {request.run_key}: launcher.node_selector pins {HOSTNAME_LABEL}={chosen}, but the booked "
                    f"devices are on node {node}; remove that selector (autodl pins the pod to the booked node)."
                )
            node_selector[HOSTNAME_LABEL] = node
        for t in opts.tolerations:
            tolerations.append(
                k8s.V1Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect,
                                 toleration_seconds=t.toleration_seconds)
            )
        return limits, node_selector, tolerations

    def _namespace(self, opts: Any) -> str:
        return opts.namespace or self.namespace or "default"

    def render(self, request: LaunchRequest) -> dict[str, Any]:
        """The pod for ``autodl plan --json`` and logs: its manifest (camelCase, as ``kubectl`` takes
        it), namespace, name, argv, limits and requests, priority class and Kueue queue (None outside the Kueue mode)."""
        from kubernetes.client import ApiClient

    
        pod = self.build_pod(request)
        manifest = ApiClient().sanitize_for_serialization(pod)
        container = manifest["spec"]["containers"][0]
        return {
            "launcher": self.name,
            "namespace": pod.metadata.namespace,
            "pod_name": pod.metadata.name,
            "image": container["image"],
            "command": container["command"],
            "env": redact_env({e["name"]: e.get("value", "") for e in container.get("env", [])}),
            "limits": (container.get("resources") or {}).get("limits", {}),
            "requests": (container.get("resources") or {}).get("requests", {}),
            "node_selector": manifest["spec"].get("nodeSelector", {}),
            "priority_class": manifest["spec"].get("priorityClassName"),
            "kueue_queue": (manifest["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL),
            "pod": redact_obj(manifest),
        }

    # ------------------------------------------------------------------------------ cluster
    def pods_of(self, run_key: str, namespace: str) -> list[Any]:
        """Pods of ``run_key`` in ``namespace``, newest first: selected by :data:`RUN_KEY_HASH_LABEL`, then kept
        only when their ``autodl/run-key`` annotation is the whole run key (a hash prefix may collide), so a
        launch never reattaches to (and a stop never deletes) another run's pod."""
        pods = self.api.list_namespaced_pod(namespace, label_selector=f"{RUN_KEY_HASH_LABEL}={run_key_hash(run_key)}")
        mine = [p for p in (pods.items or [])
                if ((p.metadata.annotations if p.metadata else None) or {}).get(f"{LABEL_PREFIX}run-key") == run_key]
        return sorted(mine, key=lambda p: str(p.metadata.creation_timestamp or ""), reverse=True)

    def launch(self, request: LaunchRequest) -> LaunchHandle:
        """Create the pod, or reattach to the run's live pod; ended pods of the run are deleted first.

        :raises LaunchError: when the API refuses the pod (quota, admission, RBAC), with its reason.
        """
        from kubernetes.client.exceptions import ApiException

        pod = self.build_pod(request)
        namespace = pod.metadata.namespace
        for existing in self.pods_of(request.run_key, namespace):
            phase = existing.status.phase if existing.status else None
            if phase in _LIVE_PHASES and not existing.metadata.deletion_timestamp:
                log.info("reattaching to pod %s/%s (%s) of run %s", namespace, existing.metadata.name, phase,
                         request.run_key)
                return self._handle(request, pod, existing.metadata.name, reattached=True)
            if not existing.metadata.deletion_timestamp:
                log.info("deleting ended pod %s/%s (%s)", namespace, existing.metadata.name, phase)
                self._delete(existing.metadata.name, namespace)
        self._ensure_output_claim(request, namespace)
        try:
            created = self.api.create_namespaced_pod(namespace, pod)
        except ApiException as exc:
            raise LaunchError(
                f"Kubernetes refused pod {namespace}/{pod.metadata.name} for run {request.run_key}: "
                f"{exc.status} {exc.reason}: {exc.body}; check the namespace, quota and RBAC of the connection "
                "kubernetes_default."
            ) from exc
        name = created.metadata.name if created is not None and created.metadata else pod.metadata.name
        return self._handle(request, pod, name, reattached=False)

    def _ensure_output_claim(self, request: LaunchRequest, namespace: str) -> None:
        """Create the model's output claim (:func:`output_claim`) unless it exists (an admin may create it
        beforehand with another size or storage class: autodl then uses that one).

        :raises LaunchError: when the API refuses it (quota, RBAC).
        """
        from kubernetes.client.exceptions import ApiException

        claim = output_claim(request, namespace)
        if claim is None:
            return
        try:
            self.api.read_namespaced_persistent_volume_claim(claim.metadata.name, namespace)
            return
        except ApiException as exc:
            if exc.status != 404:
                raise LaunchError(f"cannot read claim {namespace}/{claim.metadata.name}: {exc.status} {exc.reason}.") from exc
        try:
            self.api.create_namespaced_persistent_volume_claim(namespace, claim)
        except ApiException as exc:
            if exc.status != 409:  # created meanwhile by a concurrent launch
                raise LaunchError(
                    f"Kubernetes refused the output claim {namespace}/{claim.metadata.name} of run {request.run_key}: "
                    f"{exc.status} {exc.reason}; create it yourself (docs/launchers.md) or allow the connection "
                    "kubernetes_default to create persistentvolumeclaims."
                ) from exc

    def _handle(self, request: LaunchRequest, pod: Any, name: str, *, reattached: bool) -> LaunchHandle:
        return LaunchHandle(
            launcher=self.name,
            run_key=request.run_key,
            lease_id=request.labels.get("lease_id"),
            pod_name=name,
            namespace=pod.metadata.namespace,
            command=list(pod.spec.containers[0].command),
            device_ids=[d.device_id for d in request.devices],
            on_cpu=request.on_cpu or not request.devices,
            reattached=reattached,
        )

    def _read(self, handle: LaunchHandle) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api.read_namespaced_pod(handle.pod_name, handle.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise LaunchError(
                    f"pod {handle.namespace}/{handle.pod_name} of run {handle.run_key} no longer exists (deleted by "
                    "stop() or by hand); its exit code and logs are gone: relaunch the run."
                ) from None
            raise LaunchError(f"cannot read pod {handle.namespace}/{handle.pod_name}: {exc.status} {exc.reason}.") from exc

    def poll(self, handle: LaunchHandle) -> int | None:
        """0 when the pod succeeded, the training container's exit code when it failed, else ``None``.

        :raises LaunchError: when the pod is gone, or its image cannot be pulled (it would wait forever).
        """
        pod = self._read(handle)
        phase = pod.status.phase if pod.status else None
        statuses = (pod.status.container_statuses or []) if pod.status else []
        train = next((s for s in statuses if s.name == CONTAINER_NAME), None)
        if phase == "Succeeded":
            return 0
        if phase == "Failed":
            terminated = train.state.terminated if train and train.state else None
            return int(terminated.exit_code) if terminated and terminated.exit_code is not None else 1
        waiting = train.state.waiting if train and train.state else None
        if waiting and waiting.reason in _PULL_FAILURES:
            raise LaunchError(
                f"pod {handle.namespace}/{handle.pod_name} cannot pull its image ({waiting.reason}: {waiting.message}); "
                "fix launcher.image or add launcher.image_pull_secrets."
            )
        return None

    def ended_at(self, handle: LaunchHandle) -> float | None:
        """When the training container ended (epoch seconds): its ``state.terminated.finishedAt``; None while it
        runs or when the pod does not say."""
        pod = self._read(handle)
        statuses = (pod.status.container_statuses or []) if pod.status else []
        train = next((s for s in statuses if s.name == CONTAINER_NAME), None)
        terminated = train.state.terminated if train and train.state else None
        finished = getattr(terminated, "finished_at", None)
        return finished.timestamp() if finished is not None else None

    def unschedulable_reason(self, handle: LaunchHandle) -> str | None:
        """The scheduler's reason while the pod is Pending and cannot be scheduled (its ``PodScheduled``
        condition is False with reason ``Unschedulable``, the condition behind a ``FailedScheduling``
        event, e.g. "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."), else None."""
        pod = self._read(handle)
        status = pod.status
        if status is None or status.phase != "Pending":
            return None
        for cond in status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                return cond.message or "Unschedulable (the scheduler gave no message)"
        return None

    def read_logs(self, handle: LaunchHandle, offset: int = 0) -> tuple[str, int]:
        """The training container's log since ``offset`` (the timestamp of the last line read, ns; 0: the
        beginning) and the offset to pass next time; empty while the container has not started.

        One ``read_namespaced_pod_log(follow=True, timestamps=True, since_seconds=...)`` request follows the
        log (:class:`~autodl.launch.base.LogStream`, as the cncf provider's PodManager does), so nothing is
        fetched twice; a stream that ended while the pod runs (container still creating, connection dropped)
        is reopened at ``offset``. Once the pod ended, the read waits up to ``LOG_DRAIN_S`` for the last lines.
        """
        key = f"{handle.namespace}/{handle.pod_name}"
        stream = self._streams.get(key)
        if stream is not None and stream.done.is_set():
            text, cursor = stream.read()
            if text or key in self._final_streams:  # a stream opened after the pod ended has said all
                return text, cursor
            offset, stream = cursor, None  # it ended early (dropped, or the pod ended since): reopen at the cursor
        if stream is None:
            if self._pod_ended(handle):
                self._final_streams.add(key)
            stream = self._streams[key] = LogStream(self._log_opener(handle), offset)
        if not stream.done.is_set() and self._pod_ended(handle):
            stream.wait(LOG_DRAIN_S)
        return stream.read()

    def _log_opener(self, handle: LaunchHandle) -> Any:
        """``open(since_s)`` for :class:`LogStream`: a following log request of the training container,
        ``since_seconds`` covering the second of the last line read (the API takes relative whole seconds)."""
        def open_stream(since_s: int | None) -> Any:
            kwargs: dict[str, Any] = {"container": CONTAINER_NAME, "follow": True, "timestamps": True,
                                      "_preload_content": False}
            if since_s:
                kwargs["since_seconds"] = max(1, int(time.time()) - since_s + 1)
            return _ResponseChunks(self.api.read_namespaced_pod_log(handle.pod_name, handle.namespace, **kwargs))

        return open_stream

    def _pod_ended(self, handle: LaunchHandle) -> bool:
        try:
            pod = self._read(handle)
        except LaunchError:
            return True
        return bool(pod.status and pod.status.phase in ("Succeeded", "Failed"))

    @property
    def _streams(self) -> dict[str, LogStream]:
        return self.__dict__.setdefault("_log_streams", {})

    @property
    def _final_streams(self) -> set[str]:
        """Pods whose current log stream was opened after they ended (it brings their last lines, then nothing)."""
        return self.__dict__.setdefault("_log_streams_final", set())

    def close_logs(self, handle: LaunchHandle) -> None:
        """Stop following ``handle``'s log (the follower is done with it); idempotent."""
        key = f"{handle.namespace}/{handle.pod_name}"
        self._final_streams.discard(key)
        stream = self._streams.pop(key, None)
        if stream is not None:
            stream.close()

    def _delete(self, name: str, namespace: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.delete_namespaced_pod(name, namespace, grace_period_seconds=STOP_GRACE_S)
        except ApiException as exc:
            if exc.status != 404:
                raise LaunchError(f"cannot delete pod {namespace}/{name}: {exc.status} {exc.reason}.") from exc

    def stop(self, handle: LaunchHandle) -> None:
        """Delete every pod of the handle's run key (SIGTERM, SIGKILL after :data:`STOP_GRACE_S`); idempotent."""
        namespace = handle.namespace or self.namespace or "default"
        names = {p.metadata.name for p in self.pods_of(handle.run_key, namespace)}
        if handle.pod_name:
            names.add(handle.pod_name)
        for name in sorted(names):
            self._delete(name, namespace)


# ------------------------------------------------------------------ measurement and outputs of a pod
HOOK_SOURCE_ENV = "AUTODL_HOOK_SOURCE"
"""Variable of the init container holding the start-up hook's source, which it writes to ``HOOK_DIR``."""

OUTPUT_CLAIM_SIZE = "10Gi"
"""Size of an output claim autodl creates (checkpoints of one model); create the claim beforehand for another."""

HOOK_WRITER = ("import os; d = os.environ['AUTODL_HOOK_DIR']; "
               "open(os.path.join(d, 'sitecustomize.py'), 'w').write(os.environ['AUTODL_HOOK_SOURCE'])")
"""What the init container runs (with the training image's Python): writes the hook into the shared ``emptyDir``."""

INIT_RESOURCES = {"cpu": "100m", "memory": "64Mi"}
"""Requests and limits of the hook's init container (equal, so they never lower the pod's QoS class)."""


def output_claim_name(host_output_dir: str) -> str:
    """The PersistentVolumeClaim of one model's checkpoints: the Docker volume's name
    (:func:`autodl.launch.docker.output_volume_name`), lower-cased and cut to a DNS-1123 name (63)."""
    from autodl.launch.docker import output_volume_name

    name = re.sub(r"[^a-z0-9-]+", "-", output_volume_name(host_output_dir).lower())
    base, digest = name[:-13], name[-12:]
    return f"{base[:50].strip('-')}-{digest}"


def output_claim(request: LaunchRequest, namespace: str) -> Any:
    """The ``V1PersistentVolumeClaim`` autodl creates for the model's outputs (ReadWriteOnce,
    :data:`OUTPUT_CLAIM_SIZE`), or None when the run has no output folder."""
    from kubernetes import client as k8s

    from autodl.launch.docker import OUTPUT_DIR_ENV

    host_dir = request.env.get(OUTPUT_DIR_ENV)
    if not host_dir:
        return None
    return k8s.V1PersistentVolumeClaim(
        api_version="v1", kind="PersistentVolumeClaim",
        metadata=k8s.V1ObjectMeta(name=output_claim_name(host_dir), namespace=namespace,
                                  labels={"app.kubernetes.io/managed-by": "autodl"},
                                  annotations={f"{LABEL_PREFIX}output-dir": host_dir}),
        spec=k8s.V1PersistentVolumeClaimSpec(access_modes=["ReadWriteOnce"],
                                             resources=k8s.V1VolumeResourceRequirements(
                                                 requests={"storage": OUTPUT_CLAIM_SIZE})),
    )


def add_measurement(pod: Any, request: LaunchRequest, opts: Any) -> Any:
    """Make ``pod``'s measurement travel in its log, as a Docker run's does (:mod:`autodl.launch.docker`):

    * an init container (the training image, :data:`HOOK_WRITER`) writes the start-up hook into an
      ``emptyDir`` mounted read-only at ``HOOK_DIR`` in the training container, first on ``PYTHONPATH``;
    * the run's files (``$AUTODL_METRICS_FILE``, ``$AUTODL_REPORT_FILE``) go to an ``emptyDir`` at ``RUN_DIR``,
      relayed to the log (``AUTODL_RUNFACTS=log``);
    * ``AUTODL_OUTPUT_DIR`` is the model's claim (:func:`output_claim`) mounted at ``OUTPUT_DIR``.

    With ``launcher.command`` (an image that may have no Python) there is no init container and no hook:
    the run's files and outputs are still there, only Paddle's peaks are not reported.

    :returns: ``pod``, changed in place.
    """
    from pathlib import Path

    from kubernetes import client as k8s

    from autodl.launch.docker import HOOK_DIR, OUTPUT_DIR, OUTPUT_DIR_ENV, RUN_DIR, measurement_env
    from autodl.launch.local import CHILD_PATH

    container = pod.spec.containers[0]
    env = {e.name: e.value for e in container.env or []}
    prior = env.get("PYTHONPATH")
    env.update(measurement_env(request, self_vendor(request), env))
    env.pop("AUTODL_VISIBLE_ENV", None)  # the device plugin pins: no visibility variable maps places to devices
    with_hook = not opts.command
    if not with_hook:
        env.pop("PYTHONPATH")
        if prior:
            env["PYTHONPATH"] = prior
    container.env = [k8s.V1EnvVar(name=k, value=v) for k, v in env.items()]
    volumes = list(pod.spec.volumes or [])
    mounts = list(container.volume_mounts or [])
    volumes.append(k8s.V1Volume(name="autodl-run", empty_dir=k8s.V1EmptyDirVolumeSource(size_limit="1Gi")))
    mounts.append(k8s.V1VolumeMount(name="autodl-run", mount_path=RUN_DIR))
    if with_hook:
        volumes.append(k8s.V1Volume(name="autodl-hook", empty_dir=k8s.V1EmptyDirVolumeSource(size_limit="16Mi")))
        mounts.append(k8s.V1VolumeMount(name="autodl-hook", mount_path=HOOK_DIR, read_only=True))
    claim = output_claim(request, pod.metadata.namespace)
    if claim is not None and env.get(OUTPUT_DIR_ENV) == OUTPUT_DIR:
        volumes.append(k8s.V1Volume(name="autodl-output", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
            claim_name=claim.metadata.name)))
        mounts.append(k8s.V1VolumeMount(name="autodl-output", mount_path=OUTPUT_DIR))
    pod.spec.volumes, container.volume_mounts = volumes, mounts
    if not with_hook:
        return pod
    source = (Path(CHILD_PATH) / "sitecustomize.py").read_text()
    init = k8s.V1Container(
        name="autodl-hook", image=container.image, image_pull_policy=container.image_pull_policy,
        command=[opts.python, "-c", HOOK_WRITER],
        env=[k8s.V1EnvVar(name="AUTODL_HOOK_DIR", value=HOOK_DIR), k8s.V1EnvVar(name=HOOK_SOURCE_ENV, value=source)],
        volume_mounts=[k8s.V1VolumeMount(name="autodl-hook", mount_path=HOOK_DIR)],
        resources=k8s.V1ResourceRequirements(limits=dict(INIT_RESOURCES), requests=dict(INIT_RESOURCES)),
        security_context=container.security_context,
    )
    pod.spec.init_containers = [*(pod.spec.init_containers or []), init]
    return pod


def self_vendor(request: LaunchRequest) -> Any:
    """The request's vendor, else NVIDIA's (what :func:`measurement_env` needs: the visibility variable)."""
    return request.vendor or load_catalog().vendor("nvidia")


class _ResponseChunks:
    """The byte chunks of a streamed (``_preload_content=False``) log response, closable from another thread."""

    def __init__(self, response: Any):
        self.response = response

    def __iter__(self) -> Any:
        return iter(self.response.stream(4096, decode_content=True))

    def close(self) -> None:
        for name in ("close", "release_conn"):
            method = getattr(self.response, name, None)
            if method is not None:
                method()
