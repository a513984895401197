import math

import pytest

from faasdl.aggregation.tree import aggregator_memory_mb, fan_in, plan_tree
from faasdl.errors import EstimationError


def test_one_trainer_is_its_own_root() -> None:
    tree = plan_tree(1, 4)

    assert tree.levels == ()
    assert tree.aggregators == 0


def test_trainers_within_the_fan_in_need_one_aggregator() -> None:
    tree = plan_tree(4, 4)

    assert tree.levels == (((0, 1, 2, 3),),)


def test_levels_are_added_until_one_root_and_each_level_is_balanced() -> None:
    tree = plan_tree(7, 4)

    assert tree.levels == (((0, 1, 2, 3), (4, 5, 6)), ((0, 1),))
    deep = plan_tree(17, 2)
    assert [len(level) for level in deep.levels] == [9, 5, 3, 2, 1]
    for below, level in zip([17, 9, 5, 3, 2], deep.levels, strict=True):
        covered = sorted(i for group in level for i in group)
        assert covered == list(range(below))
        assert max(map(len, level)) - min(map(len, level)) <= 1


def test_an_aggregator_sized_for_a_model_merges_the_most_it_may_whatever_the_model() -> None:
    # MobileNetV2 and ResNet50 with Adam's moments (26.0 and 270.2 MB): a streaming aggregator
    # holds one input at a time, so its fan-in is the time bound's, not what fits in its memory.
    assert aggregator_memory_mb(10) == 118
    for model_mb in (0.4, 26.0, 270.2):
        memory_mb = math.ceil(aggregator_memory_mb(model_mb))
        assert fan_in(model_mb=model_mb, memory_mb=memory_mb, max_fan_in=8) == 8
        assert fan_in(model_mb=model_mb, memory_mb=memory_mb, max_fan_in=3) == 3


def test_an_aggregator_short_of_the_streaming_mean_is_refused() -> None:
    with pytest.raises(EstimationError, match="needs aggregators of 228 MB"):
        fan_in(model_mb=60, memory_mb=224, max_fan_in=8)


@pytest.mark.parametrize(("leaves", "fan"), [(0, 4), (3, 1)])
def test_impossible_trees_are_refused(leaves: int, fan: int) -> None:
    with pytest.raises(EstimationError):
        plan_tree(leaves, fan)
