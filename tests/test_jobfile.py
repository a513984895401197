import json

import pytest
import yaml

from faasdl import jobfile


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
        ("a: !!set {x}\n", "line 1, column 4: a set (!!set) is not a JSON value"),
        (
            "a: !!timestamp 2026-12-04\n",
            "line 1, column 4: a date (!!timestamp) is not a JSON value",
        ),
        ("a: !!omap [x: 1]\n", "line 1, column 4: an ordered mapping (!!omap) is not a JSON value"),
        ("a: !!pairs [x: 1]\n", "line 1, column 4: pairs (!!pairs) is not a JSON value"),
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
        "omap",
        "pairs",
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
