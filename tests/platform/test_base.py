"""Pure helpers of the Platform seam."""

from __future__ import annotations

from faasdl.platform.base import variant_name


def test_variant_names_carry_the_memory_and_time_class() -> None:
    assert variant_name("train", 512, 300_000) == "train-m512-t300s"
    assert variant_name("train", 256, 60_500) == "train-m256-t61s"  # rounded up to a second
