"""A one-node stand-in of the Kubernetes API that runs a pod's containers on the real dockerd (there is no cluster
in CI): enough of ``CoreV1Api`` for :class:`autodl.profile.pod.PodVenue` and the cncf provider's ``PodManager``.

What it does with a pod, as a kubelet would: each ``emptyDir`` becomes a Docker volume shared by the pod's
containers (mounted read-only where the mount says so); a ``persistentVolumeClaim`` is a host folder given by
``claims``; the init containers run to their end first, then the container; the pod's ``runAsUser``/``runAsGroup``,
``readOnlyRootFilesystem``, dropped capabilities, ``allowPrivilegeEscalation: false`` and memory limit are
Docker's options of the same meaning; the NetworkPolicy a dry-run pod requires stands as ``--network none``.
The namespace holds the deny-all policy when ``policy`` is true. ``image_binds`` are read-only host folders every
container gets (the test image's interpreter, :func:`tests.integration.paddle_image.python_mounts`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from kubernetes import client as k8s
from kubernetes.utils import parse_quantity


class _Chunks:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, amt=None, decode_content=True):
        for i in range(0, len(self.data), 4096):
            yield self.data[i:i + 4096]

    def close(self):
        pass

    def release_conn(self):
        pass


class DockerPodApi:
    """``CoreV1Api`` calls on one Docker engine (see the module docstring)."""

    def __init__(self, docker_client: Any, claims: dict[str, str] | None = None, policy: bool = True,
                 image_binds: list[dict] | None = None):
        from autodl.profile.pod import deny_all_policy

        self.docker = docker_client
        self.claims = dict(claims or {})
        self.image_binds = {m["source"]: {"bind": m["target"], "mode": "ro"} for m in image_binds or []}
        self.pods: dict[str, dict] = {}
        self.api_client = k8s.ApiClient()

        def call_api(*_a: Any, **_k: Any) -> Any:  # the one other call made: reading the namespace's policy
            if not policy:
                raise k8s.exceptions.ApiException(status=404, reason="Not Found")
            return deny_all_policy("standin")

        self.api_client.call_api = call_api

    # ------------------------------------------------------------------------ pods
    def create_namespaced_pod(self, namespace: str, body: Any) -> Any:
        spec = body.spec
        key = uuid.uuid4().hex[:8]
        volumes = {}
        for v in spec.volumes or []:
            if v.empty_dir is not None:
                volumes[v.name] = self.docker.volumes.create(name=f"standin-{key}-{v.name}").name
            elif v.persistent_volume_claim is not None:
                volumes[v.name] = self.claims[v.persistent_volume_claim.claim_name]
        shared = [v for v in volumes.values() if v.startswith(f"standin-{key}-")]
        # the kubelet makes emptyDirs writable for the pod's fsGroup; here: writable for its user
        self.docker.containers.run(spec.containers[0].image, ["/bin/chmod", "1777", *(f"/v/{v}" for v in shared)],
                                   user="0:0", network_mode="none", remove=True,
                                   volumes={v: {"bind": f"/v/{v}", "mode": "rw"} for v in shared})
        made: list[Any] = []
        entry = {"pod": body, "main": None, "made": made, "volumes": volumes, "key": key}
        try:
            for c in spec.init_containers or []:
                ctr = self._create(c, spec, volumes, f"standin-{key}-{c.name}")
                made.append(ctr)
                ctr.start()
                assert ctr.wait(timeout=120)["StatusCode"] == 0, ctr.logs()
            main = entry["main"] = self._create(spec.containers[0], spec, volumes, f"standin-{key}-main")
            made.append(main)
            main.start()
        except BaseException:
            self._remove(entry)
            raise
        self.pods[body.metadata.name] = entry
        return body

    def _create(self, c: Any, spec: Any, volumes: dict[str, str], name: str) -> Any:
        sc = c.security_context
        binds = dict(self.image_binds)  # what the test image lacks of its interpreter (tests/integration/paddle_image)
        binds.update({volumes[m.name]: {"bind": m.mount_path, "mode": "ro" if m.read_only else "rw"}
                      for m in c.volume_mounts or []})
        limits = (c.resources.limits or {}) if c.resources else {}
        return self.docker.containers.create(
            image=c.image, command=c.command, name=name, environment={e.name: e.value for e in c.env or []},
            user=f"{spec.security_context.run_as_user}:{spec.security_context.run_as_group}",
            read_only=bool(sc.read_only_root_filesystem), cap_drop=list(sc.capabilities.drop),
            security_opt=["no-new-privileges"] if sc.allow_privilege_escalation is False else [],
            mem_limit=int(parse_quantity(limits["memory"])) if "memory" in limits else None,
            network_mode="none", volumes=binds, labels={"autodl.test": "pod-standin"})

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        entry = self.pods[name]
        main = entry["main"]
        main.reload()
        state = main.attrs["State"]
        if state["Status"] == "running":
            phase, cstate = "Running", k8s.V1ContainerState(running=k8s.V1ContainerStateRunning())
        else:
            code = state["ExitCode"]
            phase = "Succeeded" if code == 0 else "Failed"
            cstate = k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(
                exit_code=code, finished_at=dt.datetime.now(dt.timezone.utc)))
        status = k8s.V1ContainerStatus(name=entry["pod"].spec.containers[0].name, image=main.image.id,
                                       image_id=main.image.id, ready=phase == "Running", restart_count=0, state=cstate)
        return k8s.V1Pod(metadata=entry["pod"].metadata, spec=entry["pod"].spec,
                         status=k8s.V1PodStatus(phase=phase, container_statuses=[status]))

    def read_namespaced_pod_log(self, name: str, namespace: str, container: str | None = None, **_: Any) -> Any:
        return _Chunks(self.pods[name]["main"].logs(stdout=True, stderr=True))

    def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> None:
        self._remove(self.pods.pop(name))

    def _remove(self, entry: dict) -> None:
        for ctr in entry["made"]:
            ctr.remove(force=True)
        for vname, source in entry["volumes"].items():
            if source.startswith(f"standin-{entry['key']}-"):
                self.docker.volumes.get(source).remove(force=True)
