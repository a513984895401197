"""The exception tree: one root, HTTP statuses for the controller's handler, and a docstring
that draws every class."""

from __future__ import annotations

import inspect
import json

import pytest

import faasdl.errors as errors


def all_errors() -> list[type[Exception]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__ == errors.__name__
    ]


def test_every_error_is_a_faasdl_error_with_an_http_status() -> None:
    for cls in all_errors():
        assert issubclass(cls, errors.FaasdlError), cls
        assert 400 <= cls.status_code < 600, cls


def test_the_module_docstring_draws_every_class() -> None:
    doc = errors.__doc__ or ""
    for cls in all_errors():
        assert cls.__name__ in doc, f"{cls.__name__} is missing from the tree in errors.py"


def test_platform_errors_group_under_platform_error() -> None:
    for cls in (errors.Throttled, errors.ActionNotFound, errors.PlatformUnavailable):
        assert issubclass(cls, errors.PlatformError)
    assert errors.Throttled("x").status_code == 429
    assert errors.ValidationError("too big", field="batch_size").field == "batch_size"
    assert str(errors.ValidationError("too big", field="batch_size")) == "batch_size: too big"


def test_text_that_is_no_unicode_is_found_by_its_place_however_deep() -> None:
    deep: object = "x\udcff"
    for _ in range(5_000):  # past Python's recursion limit (1,000)
        deep = [deep]

    assert errors.not_unicode({"a": [1, "é", {"b": "x\ud800"}]}) == (
        "a.2.b",
        "a lone surrogate, '\\ud800' at 1",
    )
    assert errors.not_unicode({"ok": 1, "n\ud800": 2}) == (
        "",
        "a field's name holds a lone surrogate, '\\ud800' at 1",
    )
    assert errors.not_unicode(deep) == (
        ".".join(["0"] * 5_000),
        "a lone surrogate, '\\udcff' at 1",
    )
    assert errors.not_unicode({"a": ["é", "\U0001f600", None, 1.5]}) is None
    # A Python caller's value that holds itself is walked once (it looped for ever).
    cyclic: list[object] = ["é"]
    cyclic.append({"again": cyclic})
    assert errors.not_unicode(cyclic) is None
    cyclic.append("\ud800")
    assert errors.not_unicode(cyclic) == ("2", "a lone surrogate, '\\ud800' at 0")


def _wrapped() -> None:
    try:
        raise OSError(111, "Connection refused")
    except OSError as refused:
        raise RuntimeError("wrapped") from refused


def test_a_reason_is_the_innermost_exception_not_what_was_raised_from_none() -> None:
    with pytest.raises(json.JSONDecodeError) as not_json:
        json.loads("<html>")
    with pytest.raises(RuntimeError) as wrapped:
        _wrapped()

    # json raises its error from None over its scanner's StopIteration(0): the reason read "0".
    assert errors.reason(not_json.value) == "Expecting value: line 1 column 1 (char 0)"
    assert errors.reason(wrapped.value) == "[Errno 111] Connection refused"
