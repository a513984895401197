"""A job's fields read from YAML or JSON text (a job file, a ``--set`` value) as JSON's values.

The CLI sends what it reads to the controller as JSON, so it reads YAML as JSON's values (text,
numbers, true and false, null, lists and mappings keyed by text): an unquoted date stays text
(``name: 2026-12-04``) and ``1e-3`` is a number, as YAML 1.2 and JSON read them (PyYAML reads
YAML 1.1). Refused, naming their line, are the three things of YAML a job file has no use for,
each of which stopped the CLI: a tag (``!!binary``'s bytes, ``!!set``'s sets, ``!!timestamp``'s
dates are no JSON; PyYAML's constructors raise ``ValueError`` or ``KeyError`` for a tag on a value
that is not its kind, ``!!int null``); an alias (``*a``), which can hold its own anchor (a value
inside itself) or expand a few lines into gigabytes; and nesting past :data:`MAX_DEPTH` (PyYAML's
composer recurses, so a deep enough one ended in ``RecursionError``).
"""

from __future__ import annotations

import re
import sys
from typing import Any, Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

#: How deep a job file's lists and mappings may nest (a job's fields go three levels deep).
MAX_DEPTH: Final = 32
#: The most a job file may hold, the controller's default body limit (``MAX_BODY_BYTES``), for
#: what is a few lines: ``faasdl submit /dev/zero`` read until it ran out of memory, and a 67 MB
#: file took PyYAML 16 s to find no mapping in.
MAX_BYTES: Final = 1 << 20

_YAML_TAG: Final = "tag:yaml.org,2002:"
_TIMESTAMP: Final = f"{_YAML_TAG}timestamp"
_FLOAT: Final = f"{_YAML_TAG}float"


class Refused(yaml.MarkedYAMLError):
    """YAML this reader does not take; ``problem`` says why, ``problem_mark`` where."""

    def __init__(self, problem: str, node: Node | None = None, *, mark: Any = None) -> None:
        super().__init__(problem=problem, problem_mark=node.start_mark if node else mark)

    def said(self) -> str:
        """The refusal with its place: ``line 3, column 7: …``."""
        mark = self.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        return f"{where}{self.problem}"


class JobFileLoader(yaml.SafeLoader):
    """PyYAML's safe loader that builds only JSON's values (see the module)."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise Refused(
                f"an alias (*{event.anchor}) is not read in a job's fields: write its value out",
                mark=event.start_mark,
            )
        if getattr(event, "tag", None) is not None:
            tag = event.tag.replace(_YAML_TAG, "!!")
            raise Refused(
                f"a tag ({tag}) is not read in a job's fields: write the value as JSON would "
                "(text in quotes)",
                mark=event.start_mark,
            )
        if self._depth >= MAX_DEPTH:
            raise Refused(f"nested deeper than {MAX_DEPTH} levels", mark=event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)  # merge keys (``<<``) first, as the safe loader does
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise Refused(f"a field's name is {key!r}, not text (quote it)", key_node)
        return super().construct_mapping(node, deep=deep)

    def construct_json_int(self, node: ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # Python reads at most sys.get_int_max_str_digits() digits
            raise Refused(
                f"an integer of more than {sys.get_int_max_str_digits():,} digits", node
            ) from None


JobFileLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in {_TIMESTAMP, _FLOAT}]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# YAML 1.1's floats with JSON's too: an exponent without a point (``1e-3``), and one without a
# sign (``1.0e3``), which PyYAML's reads as text.
JobFileLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
        |\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)
JobFileLoader.add_constructor(f"{_YAML_TAG}int", JobFileLoader.construct_json_int)


def load(text: str) -> Any:
    """``text``'s one YAML (or JSON) document as JSON's values; raises :class:`Refused` for what
    this reader does not take, ``yaml.YAMLError`` for what is not YAML."""
    return yaml.load(text, Loader=JobFileLoader)
