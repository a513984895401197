"""OpenWhisk on Kubernetes, seen from the cluster: invoker nodes as Canary's workers, and the fate
of action pods (OOM-killed, deleted, evicted, unschedulable) sooner than activation records say it.

The functions here read API objects as the API serialises them (what ``kubectl get -o json``
prints and a watch's raw objects carry), so that they are tested on such objects without a
cluster. :class:`KubernetesCluster` is the part that talks to one (the ``kubernetes`` extra).

What OpenWhisk's invoker gives its action pods (reference/openwhisk.md §5): the labels
``user-action-pod=true``, ``invoker=invoker<N>``, ``release=<release>`` and, once initialised,
``openwhisk/action`` and ``openwhisk/namespace``; one container ``user-action`` whose memory
request and limit are the action's; ``restartPolicy: Always``. A pod whose container is OOM-killed
shows ``lastState.terminated.reason == "OOMKilled"`` (exit 137) with its restart count up, and the
invoker then deletes it. No label names the activation: a pod's fate corroborates an activation's
record (by action and time), it does not replace it.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from urllib3.util.retry import Retry

from faasdl.canary.core import ContainerLoss, ContainerLosses
from faasdl.errors import PlatformError, PlatformUnavailable, ValidationError
from faasdl.platform.classify import Failure, FailureKind
from faasdl.store.records import WorkerInfo

#: Every action pod an OpenWhisk invoker starts carries this label.
ACTION_POD_SELECTOR = "user-action-pod=true"
#: The action's container in its pod.
ACTION_CONTAINER = "user-action"
#: The label that marks invoker nodes (openwhisk-deploy-kube's README).
INVOKER_ROLE = ("openwhisk-role", "invoker")
#: The client's retries: a refused or failed connection is tried again (urllib3's three), a
#: request sent and not answered in time is not (urllib3 sent a GET that timed out three more
#: times, each waiting the request timeout again: a cut-off API server showed after four).
READ_RETRIES = Retry(3, read=False)

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
_FACTORS = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity_mb(quantity: str) -> int:
    """A Kubernetes memory quantity (``"2Gi"``, ``"2048Mi"``, ``"16308152Ki"``, ``"2G"``,
    ``"2147483648"``) in whole MiB, rounded down. (The client's ``kubernetes.utils.parse_quantity``
    does this too, but the client is an optional extra and these functions must work without it.)"""
    found = _QUANTITY.match(quantity.strip())
    if found is None:
        raise ValidationError(f"is not a Kubernetes quantity: {quantity!r}", field="memory")
    return int(float(found[1]) * _FACTORS[found[2]] // 2**20)


def timestamp_ms(text: str | None) -> int:
    """An RFC 3339 time of the API (``"2026-11-23T01:02:03Z"``) in epoch ms; 0 for none."""
    if not text:
        return 0
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind:
            found: dict[str, Any] = condition
            return found
    return None


# ---- nodes → workers ------------------------------------------------------------------------


def worker_from_node(node: dict[str, Any]) -> WorkerInfo:
    """The worker record of a node: alive while its kubelet reports Ready and it takes pods."""
    meta, spec, status = node["metadata"], node.get("spec", {}), node.get("status", {})
    ready = _condition(node, "Ready")
    addresses = {a["type"]: a["address"] for a in status.get("addresses") or []}
    memory = (status.get("allocatable") or {}).get("memory")
    return WorkerInfo(
        worker_id=meta["name"],
        host=addresses.get("InternalIP") or addresses.get("Hostname", ""),
        memory_mb=quantity_mb(memory) if memory else 0,
        alive=ready is not None
        and ready.get("status") == "True"
        and not spec.get("unschedulable", False),
        heartbeat_ms=timestamp_ms(ready.get("lastHeartbeatTime") if ready else None),
        labels=dict(meta.get("labels") or {}),
    )


def workers_from_nodes(nodes: list[dict[str, Any]]) -> list[WorkerInfo]:
    """The invoker nodes as workers: those labelled ``openwhisk-role=invoker``, or every node
    when none is (a cluster whose nodes all run invokers)."""
    key, value = INVOKER_ROLE
    invokers = [n for n in nodes if (n["metadata"].get("labels") or {}).get(key) == value]
    return [worker_from_node(n) for n in invokers or nodes]


# ---- action pods ----------------------------------------------------------------------------


class PodFate(StrEnum):
    OOM_KILLED = "oom_killed"  # its action container ran out of memory
    DELETED = "deleted"  # gone: deleted by the invoker (timeout, developer error) or by someone
    EVICTED = "evicted"  # evicted by the kubelet (node pressure) or a drain
    UNSCHEDULABLE = "unschedulable"  # no node has room for it
    FAILED = "failed"  # ended in phase Failed for another reason


@dataclass(frozen=True)
class ActionPodEvent:
    """What happened to an action pod, with what ties it to activations."""

    pod: str
    fate: PodFate
    at_ms: int
    message: str
    node: str | None
    action: str | None  # the ``openwhisk/action`` label (absent until the pod is initialised)
    namespace: str | None  # the ``openwhisk/namespace`` label
    invoker: str | None
    memory_mb: int | None  # the action container's memory limit
    restarts: int


def _action_container(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The action container's spec and status (empty when the pod has none yet)."""
    spec: dict[str, Any] = next(
        (c for c in pod.get("spec", {}).get("containers") or [] if c["name"] == ACTION_CONTAINER),
        {},
    )
    status: dict[str, Any] = next(
        (
            s
            for s in pod.get("status", {}).get("containerStatuses") or []
            if s["name"] == ACTION_CONTAINER
        ),
        {},
    )
    return spec, status


def _fate(
    event_type: str, pod: dict[str, Any], status: dict[str, Any]
) -> tuple[PodFate, str, int] | None:
    pod_status = pod.get("status", {})
    for state in (status.get("state") or {}, status.get("lastState") or {}):
        terminated = state.get("terminated")
        if terminated and terminated.get("reason") == "OOMKilled":
            return (
                PodFate.OOM_KILLED,
                f"container {ACTION_CONTAINER} OOMKilled (exit {terminated.get('exitCode')})",
                timestamp_ms(terminated.get("finishedAt")),
            )
    if pod_status.get("reason") == "Evicted":
        return PodFate.EVICTED, pod_status.get("message", "evicted"), 0
    if event_type == "DELETED":
        return PodFate.DELETED, "the pod was deleted", 0
    scheduled = _condition(pod, "PodScheduled")
    if pod_status.get("phase") == "Pending" and scheduled and scheduled.get("status") == "False":
        return (
            PodFate.UNSCHEDULABLE,
            scheduled.get("message") or scheduled.get("reason", "unschedulable"),
            timestamp_ms(scheduled.get("lastTransitionTime")),
        )
    if pod_status.get("phase") == "Failed":
        return PodFate.FAILED, pod_status.get("message") or "the pod failed", 0
    return None


def classify_pod(event_type: str, pod: dict[str, Any], *, now_ms: int) -> ActionPodEvent | None:
    """What a watch event (``ADDED``, ``MODIFIED``, ``DELETED``) says happened to an action pod;
    ``None`` when nothing went wrong (it starts, runs, or is ready)."""
    spec, status = _action_container(pod)
    found = _fate(event_type, pod, status)
    if found is None:
        return None
    fate, message, at_ms = found
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
    return ActionPodEvent(
        pod=meta["name"],
        fate=fate,
        at_ms=at_ms or now_ms,
        message=message,
        node=pod.get("spec", {}).get("nodeName"),
        action=labels.get("openwhisk/action"),
        namespace=labels.get("openwhisk/namespace"),
        invoker=labels.get("invoker"),
        memory_mb=quantity_mb(limit) if limit else None,
        restarts=int(status.get("restartCount", 0)),
    )


class PodFates:
    """The fates already told, so that a watch reports each once: an OOM kill stays in a pod's
    ``lastState`` through every later event of the pod, until its next restart."""

    def __init__(self) -> None:
        self._told: dict[str, tuple[PodFate, int]] = {}

    def update(self, event_type: str, pod: dict[str, Any], *, now_ms: int) -> ActionPodEvent | None:
        event = classify_pod(event_type, pod, now_ms=now_ms)
        name = pod["metadata"]["name"]
        gone = event_type == "DELETED"
        told = self._told.pop(name, None) if gone else self._told.get(name)
        if event is None or told == (event.fate, event.restarts):
            return None
        if event.fate is PodFate.DELETED and told is not None and told[0] is PodFate.OOM_KILLED:
            return None  # the invoker removing a pod whose kill was told already
        if not gone:
            self._told[name] = (event.fate, event.restarts)
        return event


def container_loss(event: ActionPodEvent) -> ContainerLoss | None:
    """What a pod's fate tells Canary: the attempt running in it is lost (its host name is the
    pod's name). An unschedulable pod ran nothing: its activation waits, it is not lost."""
    if event.fate is PodFate.UNSCHEDULABLE:
        return None
    kind = FailureKind.OUT_OF_MEMORY if event.fate is PodFate.OOM_KILLED else FailureKind.CRASH
    where = f" on {event.node}" if event.node else ""
    return ContainerLoss(
        host=event.pod,
        failure=Failure(kind, f"pod {event.pod}{where} {event.fate}: {event.message}"),
        at_ms=event.at_ms,
    )


# ---- the cluster ----------------------------------------------------------------------------


class KubernetesCluster:
    """The Kubernetes API next to an OpenWhisk deployment (the ``kubernetes`` extra): its invoker
    nodes, a watch on its action pods, and failure injection for experiments (kill a pod, drain a
    node). Constructed with no I/O; :meth:`open` loads the in-cluster configuration, or the
    kubeconfig file (``kubeconfig``, else ``$KUBECONFIG`` or ``~/.kube/config``)."""

    def __init__(
        self,
        *,
        namespace: str = "openwhisk",
        release: str = "owdev",
        kubeconfig: str | None = None,
        request_timeout_s: float = 10.0,
    ) -> None:
        self.namespace = namespace
        self.release = release
        self.kubeconfig = kubeconfig
        #: How long a call waits for the API's answer, and a watch for its next line beyond the
        #: renewal the API server ends it at, asked once (``READ_RETRIES``): the client's own
        #: default is forever, so an API server cut off without a reset held a watch, and the
        #: losses it reports, for good.
        self.request_timeout_s = request_timeout_s
        self._core: Any = None

    @property
    def selector(self) -> str:
        return f"{ACTION_POD_SELECTOR},release={self.release}"

    def open(self) -> None:
        try:
            from kubernetes import client, config
        except ImportError as exc:
            raise PlatformUnavailable(
                "the Kubernetes adapter needs the kubernetes client: "
                "pip install 'faasdl[kubernetes]'"
            ) from exc
        try:
            if self.kubeconfig is None:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
            else:
                config.load_kube_config(config_file=self.kubeconfig)
        except (config.ConfigException, OSError) as exc:
            raise PlatformUnavailable(f"no Kubernetes configuration: {exc}") from exc
        configuration = client.Configuration.get_default_copy()
        configuration.retries = READ_RETRIES
        self._core = client.CoreV1Api(client.ApiClient(configuration))

    def _api(self) -> Any:
        if self._core is None:
            raise PlatformUnavailable("the Kubernetes cluster is not open (call open() first)")
        return self._core

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """The API's ``method`` with ``args`` and ``kwargs``, waiting ``request_timeout_s`` for
        its answer; its failures as faasdl errors: 5xx and lost connections unavailable,
        anything else the API refused a platform error."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            call = getattr(self._api(), method)
            return call(*args, _request_timeout=self.request_timeout_s, **kwargs)
        except ApiException as exc:
            error = PlatformUnavailable if (exc.status or 500) >= 500 else PlatformError
            raise error(f"Kubernetes refused to {what}: {exc.status} {exc.reason}") from exc
        except HTTPError as exc:
            raise PlatformUnavailable(f"cannot reach Kubernetes to {what}: {exc}") from exc

    def workers(self) -> list[WorkerInfo]:
        nodes = self._call("list nodes", "list_node", _preload_content=False)
        return workers_from_nodes(_json(nodes)["items"])

    def action_pods(self) -> list[dict[str, Any]]:
        pods = self._call(
            "list action pods",
            "list_namespaced_pod",
            self.namespace,
            label_selector=self.selector,
            _preload_content=False,
        )
        items: list[dict[str, Any]] = _json(pods)["items"]
        return items

    def watch(
        self,
        on_event: Callable[[ActionPodEvent], None],
        stop: threading.Event,
        *,
        clock_ms: Callable[[], int],
        timeout_s: int = 30,
    ) -> None:
        """Report each action pod's fate to ``on_event`` until ``stop`` is set (the watch is
        renewed every ``timeout_s``, and started again from a fresh list when its resource
        version has expired)."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        fates = PodFates()
        version: str | None = None
        while not stop.is_set():
            stream = watch.Watch()
            try:
                for raw in _events(
                    stream,
                    self._api(),
                    self.namespace,
                    self.selector,
                    version,
                    timeout_s,
                    self.request_timeout_s,
                ):
                    pod = raw["object"]
                    version = pod["metadata"].get("resourceVersion", version)
                    event = fates.update(raw["type"], pod, now_ms=clock_ms())
                    if event is not None:
                        on_event(event)
                    if stop.is_set():
                        break
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: the version expired, list again
                    raise PlatformUnavailable(f"the pod watch failed: {exc}") from exc
                version = None
            except HTTPError as exc:
                raise PlatformUnavailable(f"the pod watch lost Kubernetes: {exc}") from exc
            finally:
                stream.stop()

    def report_losses(
        self, losses: ContainerLosses, stop: threading.Event, *, clock_ms: Callable[[], int]
    ) -> None:
        """Watch action pods until ``stop`` is set, reporting each lost one to ``losses``."""

        def on_event(event: ActionPodEvent) -> None:
            loss = container_loss(event)
            if loss is not None:
                losses.report(loss)

        self.watch(on_event, stop, clock_ms=clock_ms)

    def kill_pod(self, name: str) -> None:
        """Delete an action pod at once (no grace): a container killed mid-activation."""
        self._call(
            f"delete pod {name}",
            "delete_namespaced_pod",
            name,
            self.namespace,
            grace_period_seconds=0,
        )

    def drain(self, node: str) -> list[str]:
        """Cordon ``node`` and evict its action pods (node loss for the experiments); the pods
        evicted."""
        from kubernetes import client

        self._call(f"cordon node {node}", "patch_node", node, {"spec": {"unschedulable": True}})
        evicted = []
        for pod in self.action_pods():
            if pod.get("spec", {}).get("nodeName") != node:
                continue
            name = pod["metadata"]["name"]
            eviction = client.V1Eviction(
                metadata=client.V1ObjectMeta(name=name, namespace=self.namespace)
            )
            self._call(
                f"evict pod {name}",
                "create_namespaced_pod_eviction",
                name,
                self.namespace,
                eviction,
            )
            evicted.append(name)
        return evicted


def _json(response: Any) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(response.data)
    return found


def _events(
    stream: Any,
    api: Any,
    namespace: str,
    selector: str,
    version: str | None,
    timeout_s: int,
    wait_s: float,
) -> Iterator[dict[str, Any]]:
    """The watch's events; the API server ends it after ``timeout_s``, and one that says nothing
    for ``wait_s`` longer (cut off) ends it with urllib3's read timeout."""
    kwargs: dict[str, Any] = {
        "label_selector": selector,
        "timeout_seconds": timeout_s,
        "_request_timeout": timeout_s + wait_s,
    }
    if version is not None:
        kwargs["resource_version"] = version
    for event in stream.stream(api.list_namespaced_pod, namespace, **kwargs):
        # The raw object: the same JSON the pure functions are tested on.
        yield {"type": event["type"], "object": event["raw_object"]}
