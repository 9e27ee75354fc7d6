"""Settings that carry their own help and range: the ranges accept exactly the numbers they say,
a config refuses the first bad one in one line, and the command line's flag names follow."""

import math
from dataclasses import dataclass

import pytest

from terngrad.util.settings import (
    FRACTION,
    INT64,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    check_settings,
    flag_name,
    setting,
    settings_of,
)


@pytest.mark.parametrize(
    ("r", "good", "bad"),
    [
        (POSITIVE_INT, [1, 2**40], [0, -1, 1.0, True, "1", None]),
        (NON_NEGATIVE_INT, [0, 7], [-1, 0.5, False]),
        (INT64, [-(2**63), 2**63 - 1, 0], [2**63, -(2**63) - 1, 1.5]),
        (POSITIVE, [1e-300, 3, 2.5], [0, -1e-9, math.inf, math.nan, True, "2"]),
        (FRACTION, [0, 0.0, 0.999], [1, 1.0, -0.1, math.nan, math.inf]),
    ],
)
def test_ranges_accept_exactly_what_they_say(r, good, bad):
    assert all(r.accepts(v) for v in good), [v for v in good if not r.accepts(v)]
    assert not any(r.accepts(v) for v in bad), [v for v in bad if r.accepts(v)]


@dataclass(frozen=True)
class _Run:
    lr: float = setting(0.01, "learning rate", "optimisation", POSITIVE)
    dropout: float | None = setting(None, "", "model", FRACTION)
    optimizer: str = setting("sgd", "", "optimisation", choices=lambda: ("sgd", "adam"))
    quiet: bool = setting(False, "", "output", flag="--silent")
    name: str = "not a setting"

    def __post_init__(self):
        check_settings(self)


def test_a_config_refuses_the_first_bad_setting_in_one_line():
    assert _Run(lr=2, dropout=None).lr == 2  # None where the default is None: "not set"
    with pytest.raises(ValueError, match=r"^lr must be a positive finite number, got -1$"):
        _Run(lr=-1)
    with pytest.raises(ValueError, match=r"dropout must be .* up to \(not including\) 1, or None"):
        _Run(dropout=1.0)
    with pytest.raises(ValueError, match=r"^unknown optimizer 'lbfgs'; choose one of: sgd, adam$"):
        _Run(optimizer="lbfgs")


def test_settings_and_their_flags():
    found = {f.name: flag_name(f, s) for f, s in settings_of(_Run)}
    assert found == {"lr": "--lr", "dropout": "--dropout", "optimizer": "--optimizer",
                     "quiet": "--silent"}  # fmt: skip
