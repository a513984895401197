"""``faasdl demo`` (what ``make demo`` runs): a real job through its kills, to a model."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from faasdl.controller.validator import FaultTolerance, JobSpec
from faasdl.demo import demo_spec, run_demo
from faasdl.training.models import ARCHITECTURE
from faasdl.training.tensors import decode

pytestmark = pytest.mark.tensorflow


def demo_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **sizes: int) -> str:
    """Run the demo in ``tmp_path``; what it said, once it is checked to have ended done."""
    monkeypatch.chdir(tmp_path)
    shown = io.StringIO()

    ok = run_demo(**sizes, console=Console(file=shown, width=300))

    said = " ".join(shown.getvalue().split())
    assert ok, said
    assert re.search(r"job [0-9a-f]{16}: done", said), said
    return said


def test_the_demo_trains_through_its_kills_and_accounts_for_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Done, and each kill either a failure the controller reported and resumed or one that
    # landed after its attempt had committed (what run_demo's answer checks); said so. Run
    # beside the settings of an operator's own store (a TLS Redis), which are not the demo's:
    # its CA bundle had been refused beside the demo's SQLite store, a pydantic traceback.
    monkeypatch.setenv("FAASDL_STORE__URL", "rediss://cache.example:6380/0")
    monkeypatch.setenv("FAASDL_STORE__TLS_CA_FILE", __file__)
    said = demo_done(tmp_path, monkeypatch, workers=4, epochs=4, kills=2)

    assert "injected 2 failure(s); the controller reported" in said
    assert "the trained model: .faasdl/demo/model.safetensors" in said
    model = (tmp_path / ".faasdl" / "demo" / "model.safetensors").read_bytes()
    assert ARCHITECTURE in decode(model)[1]  # what load_model builds it from


@pytest.mark.parametrize("kills", [0, 2, 3, 7, 19])
def test_the_demo_job_survives_all_its_kills_landing_on_one_unit(kills: int) -> None:
    # The kills land at random, before a unit's first checkpoint too: four could take all four
    # of one unit's attempts, failing the demo's job (`--kills 20` did).
    spec = JobSpec.model_validate(demo_spec(workers=1, epochs=1, kills=kills))

    assert spec.fault_tolerance.max_attempts > kills
    assert spec.fault_tolerance.max_attempts >= FaultTolerance().max_attempts


def test_the_demo_of_one_unit_killed_nineteen_times_ends_done_saying_how_many_landed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every kill lands on the one unit; the job may commit before all nineteen have landed. Both
    # failed the demo: the first its job (four attempts), the second its exit status, unsaid.
    said = demo_done(tmp_path, monkeypatch, workers=1, epochs=1, kills=19)

    landed = int(re.findall(r"injected (\d+) failure\(s\)", said)[0])
    short = "(19 asked: the job ended before the rest could land)"
    assert (short in said) == (landed < 19), said
