"""Pure helpers of the Platform seam."""

from __future__ import annotations

import json

import pytest

from faasdl.platform.base import MAX_JSON_DEPTH, parse_json, variant_name


def test_variant_names_carry_the_memory_and_time_class() -> None:
    assert variant_name("train", 512, 300_000) == "train-m512-t300s"
    assert variant_name("train", 256, 60_500) == "train-m256-t61s"  # rounded up to a second


def nested(depth: int) -> str:
    """An object holding arrays: ``depth`` levels in all."""
    return '{"x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"loss": NaN}', "NaN is not a JSON value"),
        ("[1, -Infinity]", "-Infinity is not a JSON value"),
        (nested(MAX_JSON_DEPTH + 1), f"nested deeper than {MAX_JSON_DEPTH} levels"),
        (nested(100_000), f"nested deeper than {MAX_JSON_DEPTH} levels"),  # past recursion
        ("{", "Expecting property name"),
        # JSON's escape of a surrogate half reads as a lone surrogate, which UTF-8 cannot hold.
        (
            '{"a": [1, "x\\ud800"]}',
            "a.1: is not Unicode text \\(a lone surrogate, '\\\\ud800' at 1",
        ),
        (b'{"\\uDC00": 1}', "a field's name holds a lone surrogate"),
    ],
    ids=["nan", "infinity", "one-too-deep", "recursion", "malformed", "surrogate", "in-a-name"],
)
def test_json_is_read_as_openwhisk_reads_it(text: str | bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_json(text)


def test_json_as_deep_as_allowed_reads_as_pythons_json_reads_it() -> None:
    # A surrogate pair's escapes are one character; an escaped backslash before "ud800" none.
    text = '{"a": [1, 2.5, "NaN", {"b": null}], "e": ["\\ud83d\\ude00", "\\\\ud800"], "c": '
    text += nested(MAX_JSON_DEPTH - 1) + "}"

    assert parse_json(text) == json.loads(text)
    assert parse_json(text.encode()) == json.loads(text)
