"""Treatment-effect estimators of the CauSciBench agents, on statsmodels and linearmodels, behind one closed set
of method labels.

Paper: "CauSciBench: Can LLMs Automate Causal Inference in Real-World Scientific Research?" (Acharya, Zhang et al.,
ICML 2026, PMLR v306; no arXiv id). A benchmark query names a reference method (``ols``, ``iv``, ``rdd``, ``did``,
``propensity score matching``, ...); the answer is a point estimate scored by relative error. This file holds the
estimators an agent calls once it has chosen a method and the variables (their roles: treatment, outcome,
controls, instrument, running variable and cutoff, time and group, mediator), and the closed label set.

Every estimator takes a pandas DataFrame and a `Roles` and returns an `Estimate` (effect, standard error, rows
used). Rows with a missing value in a used column are dropped (the benchmark's data files have NaNs). Choices
that the paper does not fix are documented per function:

- ``ols``: OLS of the outcome on the treatment and the controls, HC1 standard errors (difference in means without
  controls: the RCT reference of the benchmark's synthetic designs).
- ``regression_adjustment``: OLS with treatment x centred-control interactions; the treatment coefficient is the
  ATE (Imbens & Wooldridge 2009, sec. 5.3), HC1 standard error.
- ``matching``: 1-nearest-neighbour matching on a logistic propensity score (statsmodels Logit), with
  replacement, both directions (ATE); standard error from the matched differences (ignores the first-stage
  estimation, an approximation).
- ``ipw``: normalised (Hajek) inverse-probability weighting, ATE; logistic propensity clipped to [0.01, 0.99];
  the standard error is a plug-in of the weighted influence terms (ignores the first stage).
- ``did``: two-way fixed effects, OLS of the outcome on the treatment indicator (treated unit in a treated period),
  group and time dummies and the controls, standard errors clustered by group. With two periods and two groups it
  is the 2x2 difference in differences; with staggered adoption and a constant effect it is unbiased (with
  heterogeneous effects TWFE is not; the benchmark's references use it).
- ``iv``: two-stage least squares (linearmodels ``IV2SLS``), robust standard errors; the encouragement design is
  the same estimator with a binary treatment (LATE).
- ``rdd``: local-polynomial regression on each side of the cutoff (``polynomial`` order, default 1: separate
  slopes), rows within ``bandwidth`` of the cutoff weighted by a triangular (default) or uniform ``kernel`` (no
  bandwidth: every row, equal weights, i.e. a global fit), HC1 standard errors. Sharp designs regress on the side
  indicator; when a treatment column is given and does not equal the side indicator the design is fuzzy and the
  estimate is the Wald ratio of the outcome jump over the treatment jump. ``regressor="treatment"`` instead puts
  the treatment column itself in place of the side indicator (OLS of ``outcome ~ treatment * (x + ... + x^p)``,
  x the centred running variable), the form of the CauSciBench replications (``replications/real/paper10.py``,
  ``paper13.py``): the same estimate for a sharp design, and for a treatment that is no threshold of the running
  variable the treatment coefficient of that regression, not an RDD estimate.
- ``frontdoor``: the linear front-door formula (Pearl 2009, sec. 3.3.2): (effect of treatment on mediator) x
  (effect of mediator on outcome given treatment), each by OLS with the controls; delta-method standard error.
- ``glm``: g-computation with a GLM (Binomial/logit for a 0/1 outcome, else Gaussian): mean predicted outcome with
  everyone treated minus with no one treated; no standard error (NaN).

Two fields of the benchmark's query files reach the estimators through `Roles`:

- ``interaction`` (the release's ``interaction_var``, "the variable interacting with the treatment"): ``ols`` adds
  it and the product treatment x interaction to the regression and reports the treatment coefficient (the effect
  where the interaction variable is 0) as ``effect`` and the product's coefficient as ``interaction_effect``;
  ``glm`` adds both terms to its model, so its g-computation averages the heterogeneous effect over the rows;
  ``regression_adjustment`` adds the variable to the controls it interacts with the treatment (its effect is the
  ATE over the rows); ``did`` uses treatment x interaction as the treated indicator (e.g. a treated-group flag
  times a post-period flag), with both main effects in the model. The benchmark's interaction queries ask for
  query-specific contrasts (the difference between subgroups, the effect at an age of 25, ...) that the fields do
  not name, so no estimator answers those exactly. ``matching``, ``ipw``, ``iv``, ``rdd`` and ``frontdoor`` cannot
  use the field yet: with an interaction they raise `EstimationError` rather than ignore it.
- ``treatment_arm`` (the release's ``multirct_treatment``, one arm of a treatment column with several arms): every
  estimator sees the treatment as 1 for that arm and 0 for the comparison arm, the level whose name contains
  "control" (case-insensitive) when exactly one does, else the most frequent other level; rows of the other arms
  are dropped (`arm_indicator`).

``iv`` accepts several instruments (a list in ``Roles.instrument``; the release writes them as one comma string).

A query may also fix how its method is run (``spec`` of `estimate`, the keys of `SPEC_KEYS`): the real queries
of `datamodules.causal_queries` carry the benchmark's window, kernel and polynomial order of each RDD.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from lightning_modules.causcibench.causal_methods import (  # noqa: F401 (re-exported)
    KERNELS, METHODS, REGRESSORS, SPEC_KEYS, SYNONYMS, check_spec, normalise_method)
from lightning_modules.shared.errors import UserInputError


@dataclass
class Roles:
    """The variables of a query by role (column names of its data file; None/empty where the design has none)."""
    treatment: str | None = None
    outcome: str | None = None
    controls: list[str] = field(default_factory=list)
    instrument: str | None = None
    running: str | None = None
    cutoff: float | None = None
    time: str | None = None
    group: str | None = None
    mediator: str | None = None
    interaction: str | None = None  # the release's interaction_var (see the module docstring)
    treatment_arm: str | None = None  # the release's multirct_treatment: the arm of a multi-arm treatment column

    def instruments(self) -> list[str]:
        if not self.instrument:
            return []
        return [self.instrument] if isinstance(self.instrument, str) else list(self.instrument)

    def columns(self) -> list[str]:
        named = [self.treatment, self.outcome, *self.instruments(), self.running, self.time, self.group,
                 self.mediator, self.interaction]
        return [c for c in named if c] + list(self.controls)


@dataclass
class Estimate:
    effect: float
    std_error: float
    n: int
    interaction_effect: float | None = None  # the treatment x interaction coefficient (``ols`` with an interaction)


class EstimationError(RuntimeError):
    """The chosen method cannot be applied to this query (a role it needs is missing, or the fit failed)."""


# which roles each method needs (beyond the outcome)
NEEDS = {"ols": ("treatment",), "regression_adjustment": ("treatment",), "matching": ("treatment",),
         "ipw": ("treatment",), "glm": ("treatment",), "did": ("treatment", "time", "group"),
         "iv": ("treatment", "instrument"), "rdd": ("running", "cutoff"), "frontdoor": ("treatment", "mediator")}


# the methods that use an interaction variable (see the module docstring); the others refuse a query with one
USES_INTERACTION = ("ols", "regression_adjustment", "glm", "did")


def arm_indicator(values, arm: str, name: str = "treatment") -> np.ndarray:
    """1.0 where a multi-arm treatment column ``values`` equals ``arm``, 0.0 at the comparison arm (the one level
    whose name contains "control", case-insensitive, else the most frequent other level), NaN elsewhere."""
    import pandas as pd

    values = pd.Series(values).reset_index(drop=True)
    present = values.notna()
    text = values.astype(str).str.strip()
    numeric = pd.to_numeric(values, errors="coerce")
    try:
        arm_number = float(arm)
    except ValueError:
        arm_number = None
    is_arm = (numeric == arm_number) if arm_number is not None and numeric[present].notna().all() else text == arm
    is_arm &= present
    if not is_arm.any():
        raise EstimationError(f"the treatment arm {arm!r} is not a value of {name!r}")
    others = text[present & ~is_arm]
    if others.empty:
        raise EstimationError(f"{name!r} has no rows outside the arm {arm!r} to compare with")
    named = sorted({v for v in others.unique() if "control" in v.lower()})
    comparison = named[0] if len(named) == 1 else others.value_counts().index[0]
    out = np.full(len(values), np.nan)
    out[is_arm.to_numpy()] = 1.0
    out[(present & ~is_arm & (text == comparison)).to_numpy()] = 0.0
    return out


def _frame(data, roles: Roles, extra: list):
    flat = [c for item in extra for c in (item if isinstance(item, (list, tuple)) else [item])]
    used = list(dict.fromkeys([c for c in [roles.outcome, *flat] if c] + list(roles.controls)))
    missing = [c for c in used if c not in data.columns]
    if missing:
        raise EstimationError(f"columns {missing} are not in the data")
    frame = data[used]
    if roles.treatment_arm is not None and roles.treatment in used:
        frame = frame.copy()
        frame[roles.treatment] = arm_indicator(frame[roles.treatment], roles.treatment_arm, roles.treatment)
    return frame.dropna()


def _matrix(frame, columns: list[str]) -> np.ndarray:
    return frame[columns].to_numpy(dtype=float) if columns else np.zeros((len(frame), 0))


def _ols(y: np.ndarray, x: np.ndarray, cov: str = "HC1", groups: np.ndarray | None = None, weights=None):
    import statsmodels.api as sm

    design = np.column_stack([np.ones(len(y)), x])
    model = sm.WLS(y, design, weights=weights) if weights is not None else sm.OLS(y, design)
    if groups is not None:
        return model.fit(cov_type="cluster", cov_kwds={"groups": groups})
    return model.fit(cov_type=cov)


def _binary(values: np.ndarray, name: str) -> np.ndarray:
    if not np.isin(values, (0, 1)).all():
        raise EstimationError(f"the treatment {name!r} must be 0/1 for this method")
    return values.astype(float)


def _propensity(t: np.ndarray, x: np.ndarray) -> np.ndarray:
    import statsmodels.api as sm

    if x.shape[1] == 0:
        return np.full(len(t), t.mean())
    design = np.column_stack([np.ones(len(t)), (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0)])
    try:
        fit = sm.Logit(t, design).fit(disp=0, maxiter=200)
    except Exception as err:  # perfect separation, singular design
        raise EstimationError(f"propensity model failed: {err}") from None
    return np.asarray(fit.predict(design))


def _interacted(frame, roles: Roles) -> np.ndarray:
    """Columns [treatment, (interaction), (treatment x interaction), controls]: the interaction's main effect is
    added unless it is a control already, and the product comes right after it."""
    t = _matrix(frame, [roles.treatment])
    controls = _matrix(frame, roles.controls)
    if not roles.interaction:
        return np.column_stack([t, controls])
    z = frame[roles.interaction].to_numpy(float)[:, None]
    main = [] if roles.interaction in roles.controls else [z]
    return np.column_stack([t, *main, t * z, controls])


def ols(data, roles: Roles) -> Estimate:
    frame = _frame(data, roles, [roles.treatment, roles.interaction])
    fit = _ols(frame[roles.outcome].to_numpy(float), _interacted(frame, roles))
    product = None
    if roles.interaction:
        product = float(fit.params[2 if roles.interaction in roles.controls else 3])
    return Estimate(float(fit.params[1]), float(fit.bse[1]), len(frame), interaction_effect=product)


def regression_adjustment(data, roles: Roles) -> Estimate:
    if roles.interaction and roles.interaction not in roles.controls:
        roles = Roles(**{**roles.__dict__, "controls": [*roles.controls, roles.interaction]})
    frame = _frame(data, roles, [roles.treatment])
    t = _binary(frame[roles.treatment].to_numpy(float), roles.treatment)
    x = _matrix(frame, roles.controls)
    x = x - x.mean(0)
    fit = _ols(frame[roles.outcome].to_numpy(float), np.column_stack([t, x, t[:, None] * x]))
    return Estimate(float(fit.params[1]), float(fit.bse[1]), len(frame))


def matching(data, roles: Roles) -> Estimate:
    frame = _frame(data, roles, [roles.treatment])
    t = _binary(frame[roles.treatment].to_numpy(float), roles.treatment)
    y = frame[roles.outcome].to_numpy(float)
    if t.sum() == 0 or t.sum() == len(t):
        raise EstimationError("matching needs treated and untreated rows")
    score = _propensity(t, _matrix(frame, roles.controls))
    differences = np.empty(len(t))
    for side in (0.0, 1.0):
        pool = np.flatnonzero(t != side)
        order = pool[np.argsort(score[pool], kind="stable")]
        sorted_scores = score[order]
        rows = np.flatnonzero(t == side)
        position = np.clip(np.searchsorted(sorted_scores, score[rows]), 1, len(order) - 1) if len(order) > 1 \
            else np.zeros(len(rows), dtype=int)
        left, right = order[np.maximum(position - 1, 0)], order[position]
        nearest = np.where(np.abs(score[left] - score[rows]) <= np.abs(score[right] - score[rows]), left, right)
        sign = 1.0 if side == 1.0 else -1.0
        differences[rows] = sign * (y[rows] - y[nearest])
    return Estimate(float(differences.mean()), float(differences.std(ddof=1) / math.sqrt(len(t))), len(frame))


def ipw(data, roles: Roles) -> Estimate:
    frame = _frame(data, roles, [roles.treatment])
    t = _binary(frame[roles.treatment].to_numpy(float), roles.treatment)
    y = frame[roles.outcome].to_numpy(float)
    score = np.clip(_propensity(t, _matrix(frame, roles.controls)), 0.01, 0.99)
    w1, w0 = t / score, (1 - t) / (1 - score)
    mu1, mu0 = (w1 * y).sum() / w1.sum(), (w0 * y).sum() / w0.sum()
    influence = w1 * (y - mu1) / w1.mean() - w0 * (y - mu0) / w0.mean()
    return Estimate(float(mu1 - mu0), float(influence.std(ddof=1) / math.sqrt(len(t))), len(frame))


def _dummies(values, drop_first: bool = True) -> np.ndarray:
    levels, codes = np.unique(np.asarray(values), return_inverse=True)
    out = np.eye(len(levels))[codes]
    return out[:, 1:] if drop_first else out


def did(data, roles: Roles) -> Estimate:
    frame = _frame(data, roles, [roles.treatment, roles.group, roles.time, roles.interaction])
    treated = _matrix(frame, [roles.treatment])
    mains = []
    if roles.interaction:  # the treated indicator is treatment x interaction, both main effects in the model
        z = _matrix(frame, [roles.interaction])
        treated, mains = treated * z, [treated, z]
    x = np.column_stack([treated, _dummies(frame[roles.group]), _dummies(frame[roles.time]), *mains,
                         _matrix(frame, roles.controls)])
    groups = np.unique(frame[roles.group].to_numpy(), return_inverse=True)[1]
    cluster = groups if len(np.unique(groups)) > 2 else None  # two clusters give no usable variance
    fit = _ols(frame[roles.outcome].to_numpy(float), x, groups=cluster)
    return Estimate(float(fit.params[1]), float(fit.bse[1]), len(frame))


def iv(data, roles: Roles) -> Estimate:
    from linearmodels.iv import IV2SLS

    frame = _frame(data, roles, [roles.treatment, roles.instruments()])
    exog = np.column_stack([np.ones(len(frame)), _matrix(frame, roles.controls)])
    try:
        fit = IV2SLS(frame[roles.outcome].to_numpy(float), exog, frame[[roles.treatment]].to_numpy(float),
                     frame[roles.instruments()].to_numpy(float)).fit(cov_type="robust")
    except Exception as err:
        raise EstimationError(f"2SLS failed: {err}") from None
    return Estimate(float(np.asarray(fit.params)[-1]), float(np.asarray(fit.std_errors)[-1]), len(frame))


def _powers(centred: np.ndarray, order: int) -> np.ndarray:
    return np.column_stack([centred ** k for k in range(1, order + 1)])


def rdd(data, roles: Roles, bandwidth: float | None = None, kernel: str = "triangular", polynomial: int = 1,
        regressor: str = "cutoff") -> Estimate:
    """The RDD estimate (see the module docstring): ``kernel`` triangular keeps ``|x| < bandwidth`` with weights
    ``1 - |x| / bandwidth``, uniform keeps ``|x| <= bandwidth`` (the window ``[c - h, c + h]``) with equal weights;
    ``regressor`` is ``cutoff`` (the side indicator, sharp or fuzzy) or ``treatment`` (the treatment column)."""
    frame = _frame(data, roles, [roles.running, roles.treatment])
    centred = frame[roles.running].to_numpy(float) - float(roles.cutoff)
    weights = None
    if bandwidth is not None:
        keep = np.abs(centred) <= bandwidth if kernel == "uniform" else np.abs(centred) < bandwidth
        frame, centred = frame[keep], centred[keep]
        weights = 1.0 - np.abs(centred) / bandwidth if kernel == "triangular" else None
    side = (centred >= 0).astype(float)
    if regressor == "treatment":
        jump = frame[roles.treatment].to_numpy(float)
        if not np.isin(jump, (0.0, 1.0)).all():
            raise EstimationError(f"regressor=treatment needs a 0/1 treatment; {roles.treatment!r} is not")
    else:
        jump = side
    if jump.sum() < 3 or (1 - jump).sum() < 3:
        raise EstimationError("RDD needs at least 3 rows on each side of the cutoff within the bandwidth")
    powers = _powers(centred, polynomial)
    x = np.column_stack([jump, powers, jump[:, None] * powers, _matrix(frame, roles.controls)])
    outcome = _ols(frame[roles.outcome].to_numpy(float), x, weights=weights)
    if roles.treatment is None or regressor == "treatment":
        return Estimate(float(outcome.params[1]), float(outcome.bse[1]), len(frame))
    treated = frame[roles.treatment].to_numpy(float)
    if np.array_equal(treated, side) or np.array_equal(treated, 1 - side):  # sharp (either side treated)
        sign = 1.0 if np.array_equal(treated, side) else -1.0
        return Estimate(float(sign * outcome.params[1]), float(outcome.bse[1]), len(frame))
    first = _ols(treated, x, weights=weights)  # fuzzy: Wald ratio of the two jumps
    if abs(first.params[1]) < 1e-8:
        raise EstimationError("fuzzy RDD: the treatment does not jump at the cutoff")
    effect = outcome.params[1] / first.params[1]
    return Estimate(float(effect), float(abs(outcome.bse[1] / first.params[1])), len(frame))


def frontdoor(data, roles: Roles) -> Estimate:
    frame = _frame(data, roles, [roles.treatment, roles.mediator])
    controls = _matrix(frame, roles.controls)
    to_mediator = _ols(frame[roles.mediator].to_numpy(float), np.column_stack([frame[roles.treatment], controls]))
    to_outcome = _ols(frame[roles.outcome].to_numpy(float),
                      np.column_stack([frame[roles.mediator], frame[roles.treatment], controls]))
    a, b = to_mediator.params[1], to_outcome.params[1]
    se = math.sqrt((a * to_outcome.bse[1]) ** 2 + (b * to_mediator.bse[1]) ** 2)
    return Estimate(float(a * b), float(se), len(frame))


def glm(data, roles: Roles) -> Estimate:
    import statsmodels.api as sm

    frame = _frame(data, roles, [roles.treatment, roles.interaction])
    y = frame[roles.outcome].to_numpy(float)
    family = sm.families.Binomial() if np.isin(y, (0, 1)).all() else sm.families.Gaussian()

    def design(t: np.ndarray) -> np.ndarray:
        with_t = frame.assign(**{roles.treatment: t})
        return np.column_stack([np.ones(len(y)), _interacted(with_t, roles)])

    observed = frame[roles.treatment].to_numpy(float)
    try:
        fit = sm.GLM(y, design(observed), family=family).fit()
    except Exception as err:
        raise EstimationError(f"GLM failed: {err}") from None
    treated, control = design(np.ones(len(y))), design(np.zeros(len(y)))
    return Estimate(float(np.mean(fit.predict(treated) - fit.predict(control))), float("nan"), len(frame))


ESTIMATORS = {"ols": ols, "regression_adjustment": regression_adjustment, "matching": matching, "ipw": ipw,
              "did": did, "iv": iv, "rdd": rdd, "frontdoor": frontdoor, "glm": glm}


def estimate(method: str, data, roles: Roles, rdd_bandwidth: float | None = None,
             spec: dict | None = None) -> Estimate:
    """Run `method` (a closed label) with `roles` on `data`; `EstimationError` when a needed role is missing or the
    fit fails (an agent's answer then counts as a failure).

    ``spec`` fixes how the method is run (`SPEC_KEYS`, e.g. ``{"bandwidth": 0.05, "kernel": "uniform",
    "polynomial": 2}`` for an RDD); ``rdd_bandwidth``, when given, overrides its bandwidth with a triangular
    kernel."""
    if method not in ESTIMATORS:
        raise UserInputError(f"unknown method {method!r}; use one of {list(METHODS)}.")
    options = check_spec(method, spec)
    missing = [role for role in NEEDS[method] if getattr(roles, role) in (None, "")]
    if roles.outcome is None:
        missing.insert(0, "outcome")
    if method == "rdd" and options.get("regressor") == "treatment" and not roles.treatment:
        missing.append("treatment")
    if missing:
        raise EstimationError(f"{method} needs the roles {missing}, which the query does not name")
    if roles.interaction and method not in USES_INTERACTION:
        raise EstimationError(f"{method} cannot use the interaction variable {roles.interaction!r} "
                              f"(interaction_var) yet; methods that do: {list(USES_INTERACTION)}")
    if method == "rdd" and rdd_bandwidth is not None:
        options.update(bandwidth=rdd_bandwidth, kernel="triangular")
    if method == "rdd":
        result = rdd(data, roles, **options)
    else:
        try:
            result = ESTIMATORS[method](data, roles, **options)
        except (ValueError, np.linalg.LinAlgError) as err:
            raise EstimationError(f"{method} failed: {err}") from None
    if not math.isfinite(result.effect):
        raise EstimationError(f"{method} gave a non-finite estimate")
    return result
