import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from faasdl import jobfile
from tests.conftest import keras_architecture


def test_a_keras_config_pasted_into_a_job_file_reads_as_the_json_it_is() -> None:
    # Arrange: what model.to_json() writes, pasted after "architecture:" (the README's way)
    own = keras_architecture()
    text = f"model: custom\narchitecture: {json.dumps(own, indent=2)}\n"

    # Execute
    loaded = jobfile.load(text)

    # Assert
    assert loaded == {"model": "custom", "architecture": own}


def test_a_job_file_reads_as_json_values_with_dates_kept_as_text() -> None:
    text = (
        "name: 2026-12-04\n"
        "started: 2026-12-04T10:00:00Z\n"
        "epochs: 3\n"
        "learning_rate: 1e-3\n"
        "shuffle: true\n"
        "init_model: null\n"
        "tags: [a, 'b']\n"
        "dataset: {name: digits}\n"
    )

    loaded = jobfile.load(text)

    assert loaded == {
        "name": "2026-12-04",  # YAML 1.1 made it a date, which no job field takes
        "started": "2026-12-04T10:00:00Z",
        "epochs": 3,
        "learning_rate": 0.001,
        "shuffle": True,
        "init_model": None,
        "tags": ["a", "b"],
        "dataset": {"name": "digits"},
    }
    assert json.loads(json.dumps(loaded)) == loaded


def test_json_text_reads_as_json_reads_it() -> None:
    body = {"model": "mlp", "dataset": {"name": "npz", "path": "a.npz"}, "epochs": 2, "x": [1.5]}
    text = json.dumps(body)[:-1] + ', "lr": 1e-3, "big": 2E+10, "small": -1.5e-07}'

    assert jobfile.load(text) == {**body, "lr": 0.001, "big": 2e10, "small": -1.5e-07}
    assert jobfile.load(text) == json.loads(text)


def test_a_merge_key_with_a_mapping_written_out_is_read() -> None:
    assert jobfile.load("epochs: 1\n<<: {name: merged, epochs: 9}\n") == {
        "epochs": 1,
        "name": "merged",
    }


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a: &x [1, *x]\n", "line 1, column 11: an alias (*x) is not read in a job's fields"),
        # A few lines an alias expands into 10**9 values (the "billion laughs").
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n"
                for a, b in zip("abcdefgh", "bcdefghi", strict=True)
            ),
            "line 2, column 8: an alias (*a) is not read",
        ),
        ("a: !!set {x}\n", "line 1, column 4: a tag (!!set) is not read in a job's fields"),
        ("a: !!timestamp 2026-12-04\n", "line 1, column 4: a tag (!!timestamp) is not read"),
        ("a: !!binary aGk=\n", "line 1, column 4: a tag (!!binary) is not read"),
        # PyYAML's constructors raised ValueError, KeyError, IndexError for a tag on a value
        # that is not its kind.
        ("a: !!int null\n", "line 1, column 4: a tag (!!int) is not read"),
        ("a: !!bool maybe\n", "line 1, column 4: a tag (!!bool) is not read"),
        ("a: !!map x\n", "line 1, column 4: a tag (!!map) is not read"),
        ("a: !!int\n", "line 1, column 4: a tag (!!int) is not read"),
        ("a: {null: 1}\n", "line 1, column 5: a field's name is None, not text (quote it)"),
        ("a: {true: 1}\n", "line 1, column 5: a field's name is True, not text"),
        ("a: " + "[" * 32 + "]" * 32 + "\n", "line 1, column 35: nested deeper than 32 levels"),
        ("a: -" + "1" * 4_301 + "\n", "line 1, column 4: an integer of more than 4,300 digits"),
    ],
    ids=[
        "alias-in-itself",
        "billion-laughs",
        "set",
        "timestamp",
        "binary",
        "int-null",
        "bool-maybe",
        "map-text",
        "int-nothing",
        "null-name",
        "bool-name",
        "too-deep",
        "too-many-digits",
    ],
)
def test_what_json_cannot_hold_is_refused_naming_its_line(text: str, said: str) -> None:
    with pytest.raises(jobfile.Refused) as refused:
        jobfile.load(text)

    assert refused.value.said().startswith(said)


def test_nesting_to_the_limit_is_read() -> None:
    assert jobfile.load("a: " + "[" * 31 + "]" * 31 + "\n") is not None


def test_what_is_not_yaml_is_yaml_s_own_error() -> None:
    with pytest.raises(yaml.YAMLError) as raised:
        jobfile.load("a: [1\n")

    assert not isinstance(raised.value, jobfile.Refused)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["2026-12-04", "1e-3", "0x10", "1:30", "~", ".inf", ".nan", "yes", "<<"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_MARKS = st.sampled_from(["", "!!binary ", "!!int ", "!!bool ", "!!map ", "!x ", "&a ", "*a "])


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    value=_VALUES,
    mark=_MARKS,
    at=st.integers(0, 1_000),
    flow=st.booleans(),
)
def test_any_yaml_reads_as_json_values_or_is_a_yaml_error(
    value: object, mark: str, at: int, flow: bool
) -> None:
    text = yaml.safe_dump(value, default_flow_style=flow, allow_unicode=True)
    places = [i + 1 for i, char in enumerate(text) if char in ":-[,"]
    if places:  # a tag, an anchor or an alias before some value
        place = places[at % len(places)]
        text = f"{text[:place]} {mark}{text[place:]}"

    try:
        loaded = jobfile.load(text)
    except yaml.YAMLError:  # what the CLI says in a line; PyYAML raised ValueError, KeyError…
        return
    assert _json_kinds(loaded)


def _json_kinds(value: object) -> bool:
    """Whether ``value`` is JSON's values only, its mappings keyed by text."""
    if isinstance(value, list):
        return all(map(_json_kinds, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_kinds(v) for k, v in value.items())
    return value is None or isinstance(value, str | int | float)  # bool is an int
