"""The runtime manager on the embedded platform: replicas warm up in the background, and a warm-up
goes on after its job released its replicas until it is done (what ``settle`` waits for)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from faasdl.canary.runtime import RuntimeManager
from faasdl.platform.base import ActionSpec
from faasdl.platform.local import LocalPlatform
from tests.conftest import eventually
from tests.platform import actions


@pytest.fixture
def manager(make_local: Callable[..., LocalPlatform]) -> Iterator[RuntimeManager]:
    platform = make_local()
    platform.deploy(ActionSpec(name="slow", code=actions.WARMABLE_SLEEP, memory_mb=128))
    runtimes = RuntimeManager(platform, tick_s=0.05)
    runtimes.start()
    yield runtimes
    runtimes.close()


def test_settle_waits_for_a_released_jobs_warm_up(manager: RuntimeManager) -> None:
    platform = manager.platform
    assert isinstance(platform, LocalPlatform)
    manager.want("job", "slow", memory_mb=128, replicas=1, warmup={"warmup": True, "warm_s": 2})
    eventually(lambda: platform.pool_stats()["warming"] == 1, what="the replica warms up")

    manager.release("job")

    assert manager.settle(timeout_s=0) is False  # its warm-up is still going on
    assert manager.settle(timeout_s=30) is True
    stats = platform.pool_stats()
    assert (stats["warming"], stats["idle"]) == (0, 1)
    assert manager.ready("job") == 0


def test_closing_leaves_a_warm_up_in_flight_to_the_platforms_close(
    manager: RuntimeManager,
) -> None:
    platform = manager.platform
    assert isinstance(platform, LocalPlatform)
    manager.want("job", "slow", memory_mb=128, replicas=1, warmup={"warmup": True, "warm_s": 600})
    eventually(lambda: platform.pool_stats()["warming"] == 1, what="the replica warms up")

    manager.close()

    # It returned with the warm-up going on (it waited for it, up to the action's time limit, as
    # a controller stopped beside busy trainers did); closing the platform ends it.
    assert platform.pool_stats()["warming"] == 1
    platform.close()


def test_settle_returns_at_once_when_nothing_warms_up(manager: RuntimeManager) -> None:
    assert manager.settle(timeout_s=0) is True


def test_the_warm_up_time_is_the_shortest_of_the_latest_not_a_batchs(
    manager: RuntimeManager,
) -> None:
    """Several replicas warmed at once, or beside busy cores, take longer than one takes: the
    runtime's warm-up time stays the shortest of its latest warm-ups."""
    assert manager.warmup_s("slow") is None
    manager.want("job", "slow", memory_mb=128, replicas=1, warmup={"warmup": True, "warm_s": 0.2})
    assert manager.wait_ready("job", timeout_s=30) == 1
    first = manager.warmup_s("slow")
    assert first is not None
    assert first >= 0.2
    manager.release("job")

    # Two more at once, each a second longer than the first took (however long a busy machine
    # took to start its process): the call took that or more.
    longer = {"warmup": True, "warm_s": first + 1}
    manager.want("other", "slow", memory_mb=128, replicas=3, warmup=longer)
    assert manager.wait_ready("other", timeout_s=30) == 3
    assert manager.warmup_s("slow") == first
