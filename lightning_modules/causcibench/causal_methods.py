"""CauSciBench's closed set of method labels and the mapping of the benchmark's raw labels onto it.

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
