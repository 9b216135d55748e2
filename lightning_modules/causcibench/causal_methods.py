"""CauSciBench's closed set of method labels, the mapping of the benchmark's raw labels onto it, and what a query's
specification may fix per method (`SPEC_KEYS`, `check_spec`).

Pure Python (no numpy), so both the estimators (`lightning_modules.causcibench.causal_estimators`) and the query data
(`datamodules.causal_queries`) read the one table.
"""
from __future__ import annotations

import re

from lightning_modules.shared.errors import UserInputError

# the closed set of method labels (the benchmark's raw labels map onto it, see `normalise_method`)
METHODS = ("ols", "regression_adjustment", "matching", "ipw", "did", "iv", "rdd", "frontdoor", "glm")
# raw label (lower case, runs of space/_/- as one space) -> closed label; the benchmark's labels
# (ols, iv, rdd, did, "did ", diff-in-diff, IV-2SLS, propensity score matching, matching, glm; synthetic designs
# rct, observational, iv_encouragement, did_canonical, did_twfe, frontdoor) and common synonyms
SYNONYMS = {
    "ols": "ols", "linear regression": "ols", "regression": "ols", "rct": "ols", "difference in means": "ols",
    "diff in means": "ols", "randomized controlled trial": "ols",
    "regression adjustment": "regression_adjustment", "outcome regression": "regression_adjustment",
    "backdoor adjustment": "regression_adjustment",
    "matching": "matching", "propensity score matching": "matching", "psm": "matching",
    "observational": "matching",  # the synthetic "observational" design: a backdoor-adjustment reference
    "ipw": "ipw", "inverse probability weighting": "ipw", "propensity score weighting": "ipw",
    "did": "did", "diff in diff": "did", "difference in differences": "did", "did canonical": "did",
    "did twfe": "did", "twfe": "did", "two way fixed effects": "did",
    "iv": "iv", "iv 2sls": "iv", "2sls": "iv", "instrumental variable": "iv", "instrumental variables": "iv",
    "iv encouragement": "iv",
    "rdd": "rdd", "regression discontinuity": "rdd", "regression discontinuity design": "rdd", "sharp rdd": "rdd",
    "frontdoor": "frontdoor", "front door": "frontdoor", "front door adjustment": "frontdoor",
    "glm": "glm", "logistic regression": "glm", "logit": "glm", "probit": "glm", "poisson regression": "glm",
}
SYNONYMS.update({m.replace("_", " "): m for m in METHODS})


def normalise_method(raw, where: str = "") -> str:
    """The closed label of a raw method label (case, spaces, ``_``/``-`` and synonyms); `UserInputError` naming
    ``where`` (file, query) if unknown."""
    key = re.sub(r"[\s_\-]+", " ", str(raw).strip().lower()).strip()
    if key not in SYNONYMS:
        raise UserInputError(f"{where}unknown method label {raw!r}; use one of {list(METHODS)} or a synonym "
                             f"({sorted(SYNONYMS)}).")
    return SYNONYMS[key]


# what a query's ``spec`` may fix, per method, and the allowed values (`causal_estimators.estimate` and its
# ``rdd`` read them)
SPEC_KEYS = {"rdd": ("bandwidth", "kernel", "polynomial", "regressor")}
KERNELS = ("triangular", "uniform")
REGRESSORS = ("cutoff", "treatment")


def check_spec(method: str, spec: dict | None) -> dict:
    """``spec`` validated for ``method``: only the keys of `SPEC_KEYS`, a positive bandwidth (or None), a kernel of
    `KERNELS`, an integer polynomial order of 1 to 4, a regressor of `REGRESSORS`; `UserInputError` naming the first
    bad entry."""
    spec = dict(spec or {})
    allowed = SPEC_KEYS.get(method, ())
    unknown = [key for key in spec if key not in allowed]
    if unknown:
        raise UserInputError(f"the {method} specification has unknown keys {unknown}; {method} takes "
                             f"{list(allowed) or 'none'}.")

    def number(key):
        try:
            return float(spec[key])
        except (TypeError, ValueError):
            return float("nan")

    if spec.get("bandwidth") is not None:
        if not number("bandwidth") > 0:
            raise UserInputError(f"bandwidth={spec['bandwidth']!r} must be a positive number (or None: every row).")
        spec["bandwidth"] = number("bandwidth")
    if "polynomial" in spec:
        if number("polynomial") not in (1.0, 2.0, 3.0, 4.0):
            raise UserInputError(f"polynomial={spec['polynomial']!r} must be an integer order from 1 to 4.")
        spec["polynomial"] = int(number("polynomial"))
    if spec.get("kernel", "triangular") not in KERNELS:
        raise UserInputError(f"kernel={spec['kernel']!r}; choose one of {list(KERNELS)}.")
    if spec.get("regressor", "cutoff") not in REGRESSORS:
        raise UserInputError(f"regressor={spec['regressor']!r}; choose one of {list(REGRESSORS)}.")
    return spec
