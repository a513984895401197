"""The exception tree: one root, HTTP statuses for the controller's handler, and a docstring
that draws every class."""

from __future__ import annotations

import inspect

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
