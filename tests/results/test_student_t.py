"""The stability trend's Student-t critical value matches scipy's, and costs no scipy import."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from scipy.special import stdtrit

from harness.results.student_t import central_t_probability, two_sided_t

LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99, 0.999)


@pytest.mark.parametrize("df", [*range(1, 60), 99, 100, 257, 500, 999, 1000, 4000])
def test_two_sided_t_matches_scipy(df: int) -> None:
    for level in LEVELS:
        want = float(stdtrit(df, 0.5 + level / 2))
        assert two_sided_t(df, level) == pytest.approx(want, rel=1e-12, abs=0)


def test_known_values_and_limits() -> None:
    for level in LEVELS:  # closed forms: Cauchy tan(π·l/2); ν = 2: √2·l/√(1 - l²)
        assert two_sided_t(1, level) == pytest.approx(math.tan(math.pi * level / 2), rel=1e-13)
        assert two_sided_t(2, level) == pytest.approx(
            math.sqrt(2) * level / math.sqrt(1 - level * level), rel=1e-13
        )
    # P(|T| <= q) at the ends of θ's range
    assert central_t_probability(0.0, 7) == 0.0
    assert central_t_probability(1.5707963267948966, 8) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("df, level", [(0, 0.95), (2.5, 0.95), (3, 0.0), (3, 1.0), (3, -1)])
def test_bad_arguments_are_refused(df: float, level: float) -> None:
    with pytest.raises(ValueError):
        two_sided_t(df, level)  # type: ignore[arg-type]


def test_summary_and_simulator_do_not_import_scipy() -> None:
    code = (
        "import sys, harness.cli.main, harness.engine.simulate, harness.results.summary, "
        "harness.results.stability; print('scipy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
