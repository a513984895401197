import numpy as np
import pytest

from faasdl.aggregation.average import CHUNK, WeightedMean, weighted_average
from faasdl.errors import AggregationError


def model(value: float) -> list[np.ndarray]:
    return [np.full((2, 3), value, np.float32), np.full((3,), -value, np.float32)]


def test_the_mean_is_weighted_by_example_count() -> None:
    merged = weighted_average([(model(1.0), 1), (model(4.0), 3)])

    assert np.allclose(merged[0], 3.25)
    assert np.allclose(merged[1], -3.25)
    assert merged[0].dtype == np.float32


def test_a_tree_of_averages_equals_the_flat_mean() -> None:
    rng = np.random.default_rng(0)
    leaves = [
        ([rng.normal(size=(4, 4)).astype(np.float32)], int(rng.integers(1, 100))) for _ in range(7)
    ]

    flat = weighted_average(leaves)
    left, right = leaves[:3], leaves[3:]
    tree = weighted_average(
        [
            (weighted_average(left), sum(n for _, n in left)),
            (weighted_average(right), sum(n for _, n in right)),
        ]
    )

    assert np.allclose(tree[0], flat[0], atol=1e-6)


def test_models_of_different_shapes_cannot_be_merged() -> None:
    mean = WeightedMean()
    mean.add(model(1.0), 5)

    with pytest.raises(AggregationError, match="shapes differ"):
        mean.add([np.zeros((3, 2), np.float32), np.zeros((3,), np.float32)], 5)


@pytest.mark.parametrize("examples", [0, -1])
def test_a_model_without_examples_is_refused(examples: int) -> None:
    with pytest.raises(AggregationError, match="cannot be weighed"):
        WeightedMean().add(model(1.0), examples)


def test_nothing_to_average_is_an_error() -> None:
    with pytest.raises(AggregationError, match="no models"):
        WeightedMean().result()


def test_arrays_longer_than_a_chunk_are_added_whole_and_the_mean_is_taken_once() -> None:
    rng = np.random.default_rng(1)
    long = [(rng.normal(size=2 * CHUNK + 3).astype(np.float32), n) for n in (1, 2, 5)]
    mean = WeightedMean()
    for array, n in long:
        mean.add([array.reshape(-1, 1)], n)

    merged = mean.result()

    expected = np.zeros(2 * CHUNK + 3)
    for array, n in long:
        expected += n * array.astype(np.float64)
    assert np.array_equal(merged[0].reshape(-1), (expected / 8).astype(np.float32))
    with pytest.raises(AggregationError, match="no models"):
        mean.result()  # the sums went into the result


def test_a_model_added_an_array_at_a_time_in_any_order_adds_as_one_added_whole() -> None:
    whole, streamed = WeightedMean(), WeightedMean()
    for value, examples in ((1.0, 1), (4.0, 3)):
        arrays = model(value)
        whole.add(arrays, examples)
        add = streamed.adding([a.shape for a in arrays], [a.dtype for a in arrays], examples)
        for position in reversed(range(len(arrays))):  # as a file's order may have them
            add(position, arrays[position])

    pairs = zip(streamed.result(), whole.result(), strict=True)

    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in pairs)


def test_an_array_that_is_not_the_shape_its_model_said_is_refused() -> None:
    add = WeightedMean().adding([(2, 3), (3,)], [np.dtype(np.float32)] * 2, 1)

    with pytest.raises(AggregationError, match=r"array 1 is \(2,\), not the \(3,\) its model said"):
        add(1, np.zeros(2, np.float32))
