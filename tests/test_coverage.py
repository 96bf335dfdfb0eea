"""Coverage of a traced step by the cost formulas (advisor/profile/coverage.py): reported everywhere,
one warning line when the uncounted work may exceed 1% of the step."""

from __future__ import annotations

import json

import pytest

from advisor.cli.main import main
from advisor.profile.coverage import coverage_of
from advisor.profile.trace import OpRecord, StepTrace


def _record(op: str, nbytes: int, counted: bool = True) -> OpRecord:
    return OpRecord("forward", "m", op, 0.0, nbytes, 0, ("float32",), False, counted)


def _trace(*records: OpRecord) -> StepTrace:
    return StepTrace(1, "fp32", "sgd", 0, records)


def test_a_small_uncounted_elementwise_op_is_reported_without_a_warning() -> None:
    # 1 of 3 ops uncounted, 5 of 1,000 bytes: 0.5% of the step's bytes, below the 1% line
    coverage = coverage_of(_trace(_record("mm", 500), _record("add", 495), _record("sgn", 5, counted=False)))
    assert coverage.uncounted == {"sgn": 1} and coverage.bytes_share == 0.005
    assert coverage.warning() is None
    assert coverage.to_dict()["counted_fraction"] == pytest.approx(2 / 3)


def test_uncounted_bytes_over_one_percent_warn() -> None:
    # 20 of 1,000 bytes: 2%
    coverage = coverage_of(_trace(_record("mm", 980), _record("sgn", 20, counted=False)))
    assert coverage.warning() == ("Warning: 1 of 2 traced ops have no cost formula (sgn x1); they move 2.0% of "
                                  "the step's bytes and their FLOPs are not counted, so step times may be too low")


def test_an_uncounted_op_named_like_compute_warns_whatever_its_bytes() -> None:
    coverage = coverage_of(_trace(_record("mm", 10_000), _record("_grouped_mm", 1, counted=False)))
    assert coverage.compute_like == ("_grouped_mm",)
    assert coverage.warning() is not None


def test_fully_counted_steps_say_nothing(capsys) -> None:
    assert main(["estimate", "mlp", "--gpu", "t4"]) == 0
    out = capsys.readouterr().out
    assert "Warning" not in out
    assert main(["estimate", "mlp", "--gpu", "t4", "--json"]) == 0
    coverage = json.loads(capsys.readouterr().out)["coverage"]
    assert coverage["uncounted_ops"] == {} and coverage["warning"] is None
