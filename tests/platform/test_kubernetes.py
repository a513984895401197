"""The Kubernetes adapter: its logic on API objects in the shape the API serialises them
(``tests/platform/data/k8s``: nodes and a watch's pod events of an OpenWhisk action, written after
the Kubernetes API reference and OpenWhisk's pod builder, reference/openwhisk.md §5), its client
against an API server that stops answering, and against a real cluster wherever a kubeconfig
reaches one."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from faasdl.errors import PlatformUnavailable, ValidationError
from faasdl.platform.classify import FailureKind
from faasdl.platform.kubernetes import (
    KubernetesCluster,
    PodFate,
    PodFates,
    classify_pod,
    container_loss,
    quantity_mb,
    timestamp_ms,
    worker_from_node,
    workers_from_nodes,
)
from tests.conftest import hung_http_server

DATA = Path(__file__).parent / "data" / "k8s"
NOW_MS = 1_795_000_000_000


def nodes() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads((DATA / "nodes.json").read_text())["items"]
    return items


def pod_events() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads((DATA / "pod_events.json").read_text())
    return events


@pytest.mark.parametrize(
    ("quantity", "mb"),
    [("16308152Ki", 15925), ("2Gi", 2048), ("1024Mi", 1024), ("2G", 1907), ("2147483648", 2048)],
)
def test_memory_quantities_in_mib(quantity: str, mb: int) -> None:
    assert quantity_mb(quantity) == mb


def test_a_bad_quantity_names_itself() -> None:
    with pytest.raises(ValidationError, match="'lots'"):
        quantity_mb("lots")


def test_invoker_nodes_become_workers_alive_only_when_ready_and_schedulable() -> None:
    workers = {w.worker_id: w for w in workers_from_nodes(nodes())}

    assert sorted(workers) == ["kind-worker", "kind-worker2", "kind-worker3"]  # not the core node
    ready, lost, cordoned = workers["kind-worker"], workers["kind-worker2"], workers["kind-worker3"]
    assert (ready.alive, ready.host, ready.memory_mb) == (True, "172.18.0.3", 15925)
    assert ready.heartbeat_ms == timestamp_ms("2026-11-23T01:02:03Z")
    assert ready.labels["openwhisk-role"] == "invoker"
    assert not lost.alive  # Ready Unknown: the kubelet stopped posting
    assert lost.heartbeat_ms < ready.heartbeat_ms
    assert (cordoned.alive, cordoned.memory_mb) == (False, 8192)


def test_with_no_node_labelled_invoker_every_node_is_a_worker() -> None:
    unlabelled = [{**n, "metadata": {**n["metadata"], "labels": {}}} for n in nodes()]

    assert len(workers_from_nodes(unlabelled)) == 4
    assert worker_from_node(unlabelled[3]).alive


def test_an_oom_killed_action_pod_is_told_once_and_its_deletion_not_again() -> None:
    fates = PodFates()

    told = [fates.update(e["type"], e["object"], now_ms=NOW_MS) for e in pod_events()]

    # The watch's events in order: pending and running say nothing; the OOM kill is told once
    # (its lastState repeats in the next event, and the invoker then deletes the pod).
    assert told[0] is None
    assert told[1] is None
    oom = told[2]
    assert oom is not None
    assert oom.fate is PodFate.OOM_KILLED
    assert oom.at_ms == timestamp_ms("2026-11-23T01:01:40Z")
    assert (oom.action, oom.namespace, oom.invoker) == (
        "faasdl-train-m1024-t120s",
        "guest",
        "invoker0",
    )
    assert (oom.node, oom.memory_mb, oom.restarts) == ("kind-worker", 1024, 1)
    assert "OOMKilled (exit 137)" in oom.message
    assert told[3] is None
    assert told[4] is None


def test_a_deleted_running_pod_an_unschedulable_one_and_an_evicted_one() -> None:
    fates = PodFates()

    told = [fates.update(e["type"], e["object"], now_ms=NOW_MS) for e in pod_events()]

    deleted, pending, evicted = told[5], told[6], told[7]
    assert deleted is not None
    assert deleted.fate is PodFate.DELETED
    assert deleted.at_ms == NOW_MS  # a deletion carries no time of its own: when it was seen
    assert pending is not None
    assert pending.fate is PodFate.UNSCHEDULABLE
    assert "Insufficient memory" in pending.message
    assert pending.node is None
    assert pending.action is None
    assert evicted is not None
    assert evicted.fate is PodFate.EVICTED
    assert "low on resource: memory" in evicted.message
    assert evicted.action == "faasdl-aggregate-m512-t60s"


def test_a_running_pod_says_nothing_and_a_second_oom_after_a_restart_is_told() -> None:
    events = pod_events()
    running, oom = events[1]["object"], events[2]["object"]
    again = json.loads(json.dumps(oom))
    again["status"]["containerStatuses"][0]["restartCount"] = 2
    fates = PodFates()

    first = fates.update("MODIFIED", oom, now_ms=NOW_MS)
    second = fates.update("MODIFIED", again, now_ms=NOW_MS)

    assert classify_pod("MODIFIED", running, now_ms=NOW_MS) is None
    assert first is not None
    assert second is not None
    assert (first.restarts, second.restarts) == (1, 2)


def test_lost_pods_become_container_losses_named_by_the_pod_and_a_pending_pod_does_not() -> None:
    fates = PodFates()
    told = [fates.update(e["type"], e["object"], now_ms=NOW_MS) for e in pod_events()]
    oom, deleted, pending, evicted = told[2], told[5], told[6], told[7]
    assert oom is not None
    assert deleted is not None
    assert pending is not None
    assert evicted is not None

    lost_oom, lost_deleted, lost_evicted = (container_loss(e) for e in (oom, deleted, evicted))

    assert lost_oom is not None
    assert lost_oom.host == oom.pod  # an action's host name in its pod is the pod's name
    assert lost_oom.failure.kind is FailureKind.OUT_OF_MEMORY
    assert lost_oom.at_ms == oom.at_ms
    assert "kind-worker" in lost_oom.failure.message
    assert lost_deleted is not None
    assert (lost_deleted.host, lost_deleted.failure.kind) == (deleted.pod, FailureKind.CRASH)
    assert lost_evicted is not None
    assert lost_evicted.failure.kind is FailureKind.CRASH
    assert container_loss(pending) is None  # it never ran: its activation waits


def test_calls_and_the_watch_of_an_api_server_that_stops_answering_end_unavailable(
    tmp_path: Path,
) -> None:
    pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
    # Arrange: a kubeconfig naming an API server that holds every request unanswered (cut off
    # without a reset); the client's own timeout is none, so both waited for good, and urllib3
    # sent each timed-out GET three more times.
    held: list[str] = []
    with hung_http_server(held=held) as url:
        kubeconfig = tmp_path / "config"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "hung", "cluster": {"server": url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "c", "context": {"cluster": "hung", "user": "u"}}],
                    "current-context": "c",
                }
            )
        )
        cluster = KubernetesCluster(kubeconfig=str(kubeconfig), request_timeout_s=0.2)
        cluster.open()

        # Act
        with pytest.raises(PlatformUnavailable) as listed:
            cluster.action_pods()
        asked_to_list = len(held)
        with pytest.raises(PlatformUnavailable) as watched:
            cluster.watch(lambda _: None, threading.Event(), clock_ms=lambda: NOW_MS, timeout_s=1)

    # Assert: each was asked once and said so (the controller watches again after
    # FAASDL_KUBERNETES__RETRY_S).
    assert asked_to_list == 1
    assert len(held) == 2
    assert "watch=true" in held[1]
    assert str(listed.value).startswith("cannot reach Kubernetes to list action pods: ")
    assert "Read timed out" in str(listed.value)
    assert str(watched.value).startswith("the pod watch lost Kubernetes: ")
    assert "Read timed out" in str(watched.value)


def _kubeconfig() -> str | None:
    path = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    return path if Path(path).is_file() else None


@pytest.mark.skipif(
    _kubeconfig() is None, reason="no Kubernetes cluster: no $KUBECONFIG or ~/.kube/config here"
)
def test_against_a_real_cluster_nodes_and_a_watch_that_ends_when_told() -> None:
    pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
    cluster = KubernetesCluster(
        namespace=os.environ.get("FAASDL_TEST_OPENWHISK_NAMESPACE", "openwhisk"),
        release=os.environ.get("FAASDL_TEST_OPENWHISK_RELEASE", "owdev"),
    )
    cluster.open()
    stop = threading.Event()
    stop.set()  # one pass of the watch: it must list, stream and return

    workers = cluster.workers()
    cluster.watch(lambda _: None, stop, clock_ms=lambda: NOW_MS, timeout_s=1)

    assert workers
    assert all(w.memory_mb > 0 for w in workers)
