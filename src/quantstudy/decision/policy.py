"""The decision policy: when does FP8 ship? A YAML file, validated, evaluated into gates.

`load_policy(path)` reads a policy file (None: the documented default, `default_policy.yaml`);
`decide(record, policy, label)` evaluates every gate on a `StudyRecord` and returns a `Decision`
that is truthy when FP8 ships.

Gates, each with its threshold, the measured value formatted from the record, and pass/fail:

- speed, per target batch, at the record's compile mode (x = fp16 ms / FP8 ms per round):
  "speed margin at batch B": median x >= `speed.min_speedup`;
  "speed spread at batch B": q1 (first quartile over rounds) of x > `speed.q1_speedup_above`.
- quality, FP8 engine against the fp32 reference on the held-out set:
  "top-1 change CI": bootstrap CI low of the top-1 change > `quality.top1_change_ci_low_above`
  (labelled data only; skipped and stated when unlabelled unless `require_labels`);
  "top-1 agreement": agreement >= `quality.min_agreement`;
  "KL mean": mean KL(fp32 || FP8) <= `quality.max_kl_mean`;
  "no NaN/Inf": no non-finite logit on any held-out or stress input of any scanned engine.

Missing evidence fails, it never passes:
- speed section absent, or timings not meaningful (CPU): every speed gate fails, measured
  "not measured on GPU"; the study cannot say ship without GPU timings.
- random weights (or a quality section marked not meaningful): the top-1, agreement and KL
  gates fail, measured "not meaningful (random weights)". Agreement and KL of an untrained
  network say nothing about the quality of a deployable model, so a random-weight study never
  ships. The NaN/Inf gate is still evaluated: a non-finite logit is a defect with any weights.
- quality section or FP8 engine quality absent: the quality gates fail, "not measured".

Size is never a gate. Weight bytes are reported by the study, but a smaller artifact alone
never ships; no field of the policy can make size pass a study.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from quantstudy.record import (
    BatchSpeed,
    Decision,
    EngineQuality,
    Gate,
    NonFiniteScan,
    StudyRecord,
)
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import CompileMode
from quantstudy.report.format import fmt_ms, fmt_pct, fmt_points, fmt_ratio, fmt_sig

DEFAULT_POLICY_LABEL = "builtin:default"
DEFAULT_POLICY_FILE = "default_policy.yaml"

# Gate names (speed gates get " at batch B"); the report matches failed gates on these.
SPEED_MARGIN = "speed margin"
SPEED_SPREAD = "speed spread"
TOP1_CI = "top-1 change CI"
AGREEMENT = "top-1 agreement"
KL_MEAN = "KL mean"
FINITE = "no NaN/Inf"

NOT_ON_GPU = "not measured on GPU"
FINITE_THRESHOLD = "no NaN/Inf logit on any held-out or stress input of any engine"
RANDOM_WEIGHTS = "not meaningful (random weights)"


class _PolicyPart(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SpeedPolicy(_PolicyPart):
    min_speedup: float = Field(1.05, ge=1.0, le=100.0)
    q1_speedup_above: float = Field(1.0, ge=1.0, le=100.0)
    batches: list[int] | None = None
    compile_mode: CompileMode | None = None

    @field_validator("batches")
    @classmethod
    def _batches(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("an empty list; use null for every batch in the study")
        if any(b < 1 for b in v):
            raise ValueError("batches must be positive integers")
        if len(set(v)) != len(v):
            raise ValueError("batches must not repeat")
        return v


class QualityPolicy(_PolicyPart):
    top1_change_ci_low_above: float = Field(-0.005, ge=-1.0, le=1.0)
    require_labels: bool = False
    min_agreement: float = Field(0.97, gt=0.0, le=1.0)
    max_kl_mean: float = Field(0.02, ge=0.0)


class Policy(_PolicyPart):
    """A decision policy; the defaults are the ones documented in `default_policy.yaml`."""

    version: Literal[1] = 1
    engine: Literal["fp8"] = "fp8"  # the engine the speed gates time; quality must be its own
    speed: SpeedPolicy = SpeedPolicy()
    quality: QualityPolicy = QualityPolicy()


# --- loading ------------------------------------------------------------------------------


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _validation_message(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = _key_path(e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key (check its spelling against default_policy.yaml)")
        else:
            lines.append(f"{key}: {e['msg']} (got {e.get('input')!r})")
    return f"invalid policy {source}:\n  " + "\n  ".join(lines)


def parse_policy(text: str, source: str) -> Policy:
    """Parse and validate policy YAML; `source` names it in error messages."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"policy {source} is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(
            f"policy {source} must be a mapping of keys (version, engine, speed, quality), "
            f"not a {type(data).__name__}"
        )
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        raise UserError(_validation_message(source, e)) from None


def load_policy(path: Path | None) -> tuple[Policy, str]:
    """Load a policy file, or the built-in default when `path` is None; return it and its label."""
    if path is None:
        text = resources.files("quantstudy.decision").joinpath(DEFAULT_POLICY_FILE).read_text()
        return parse_policy(text, DEFAULT_POLICY_LABEL), DEFAULT_POLICY_LABEL
    path = Path(path)
    if not path.is_file():
        raise UserError(f"policy file not found: {path} (omit --policy for the built-in default)")
    return parse_policy(path.read_text(encoding="utf-8"), str(path)), str(path)


# --- formatting of measured values: the report's own formatters, so the two read alike ------


def _vs(v: float, threshold: float, scale: float = 1.0, suffix: str = "") -> str:
    """`v` with 2 decimals, or up to 5 where 2 would print it equal to a threshold it is not."""
    for d in range(2, 6):
        a, b = f"{scale * v:.{d}f}", f"{scale * threshold:.{d}f}"
        if a != b or v == threshold:
            break
    return a + suffix


def _vs_points(v: float, threshold: float) -> str:
    """`_vs` in signed percentage points."""
    s = _vs(v, threshold, 100.0)
    return s if s.startswith("-") else "+" + s


# --- gates --------------------------------------------------------------------------------


def _gate(name: str, kind: str, threshold: str, measured: str, passed: bool, **kw) -> Gate:
    return Gate(name=name, kind=kind, threshold=threshold, measured=measured, passed=passed, **kw)


def _speed_gates(record: StudyRecord, policy: Policy) -> list[Gate]:
    sp = policy.speed
    speed = record.speed
    mode = sp.compile_mode or (speed.compile_mode if speed else record.config.compile_mode)
    margin_thr = f"median x >= {fmt_ratio(sp.min_speedup)} (compile mode {mode})"
    spread_thr = f"q1 of per-round x > {fmt_ratio(sp.q1_speedup_above)} (compile mode {mode})"
    if sp.batches is not None:
        targets = list(sp.batches)
    elif speed is not None and speed.batches:
        targets = [b.batch for b in speed.batches]
    else:
        targets = list(record.config.batches)

    if speed is None:
        why = f"{NOT_ON_GPU}: no speed section in the study"
    elif not speed.meaningful:
        reason = speed.meaningless_reason or "timings marked not meaningful"
        why = f"{NOT_ON_GPU}: timed on {speed.device} ({reason})"
    elif sp.compile_mode is not None and speed.compile_mode != sp.compile_mode:
        why = f"timed at compile mode {speed.compile_mode}, not {sp.compile_mode}"
    else:
        why = None

    if not targets:
        return [_gate(SPEED_MARGIN, "speed", margin_thr, why or "no batch was timed", False)]

    by_batch: dict[int, BatchSpeed] = {b.batch: b for b in speed.batches} if speed else {}
    gates = []
    for batch in targets:
        margin, spread = f"{SPEED_MARGIN} at batch {batch}", f"{SPEED_SPREAD} at batch {batch}"
        bs = by_batch.get(batch)
        if why is not None or bs is None:
            measured = why or f"not measured: batch {batch} was not timed"
            gates.append(_gate(margin, "speed", margin_thr, measured, False))
            gates.append(_gate(spread, "speed", spread_thr, measured, False))
            continue
        r = bs.ratio
        gates.append(
            _gate(
                margin,
                "speed",
                margin_thr,
                f"median x {_vs(r.median, sp.min_speedup)} (fp16 {fmt_ms(bs.fp16_ms.median)} ms, "
                f"FP8 {fmt_ms(bs.fp8_ms.median)} ms)",
                r.median >= sp.min_speedup,
            )
        )
        gates.append(
            _gate(
                spread,
                "speed",
                spread_thr,
                f"q1 x {_vs(r.q1, sp.q1_speedup_above)} (q3 {fmt_ratio(r.q3)}, {r.n} rounds)",
                r.q1 > sp.q1_speedup_above,
            )
        )
    return gates


def _first(names: list[str], shown: int = 5) -> str:
    """The first few names, and how many more: a gate's text must stay readable."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f", and {more} more" if more > 0 else "")


def _finite_gate(scans: list[NonFiniteScan], engine: str) -> Gate:
    threshold = FINITE_THRESHOLD
    if not scans:
        return _gate(FINITE, "quality", threshold, "not measured: no NaN/Inf scan", False)
    if engine not in {s.engine for s in scans}:
        return _gate(FINITE, "quality", threshold, f"not measured: {engine} was not scanned", False)
    bad = [s for s in scans if s.nonfinite_heldout or s.nonfinite_stress]
    if bad:
        parts = []
        for s in bad:
            names = [*s.nonfinite_heldout, *s.nonfinite_stress]
            parts.append(
                f"{s.engine}: {len(s.nonfinite_heldout)} held-out, "
                f"{len(s.nonfinite_stress)} stress ({_first(names)})"
            )
        return _gate(FINITE, "quality", threshold, "non-finite in " + "; ".join(parts), False)
    counts = {(s.heldout_checked, s.stress_checked) for s in scans}
    if len(counts) == 1:
        (h, st) = counts.pop()
        detail = f"{h} held-out and {st} stress inputs each"
    else:
        detail = ", ".join(f"{s.engine} {s.heldout_checked}+{s.stress_checked}" for s in scans)
    return _gate(FINITE, "quality", threshold, f"none in {len(scans)} engines ({detail})", True)


def _quality_gates(record: StudyRecord, policy: Policy) -> list[Gate]:
    qp = policy.quality
    engine = policy.engine
    ci_thr_v = qp.top1_change_ci_low_above
    ci_thr = f"CI low of top-1 change > {fmt_points(qp.top1_change_ci_low_above)} points"
    agree_thr = f">= {fmt_pct(qp.min_agreement)} of held-out images"
    kl_thr = f"mean KL(fp32 || {engine}) <= {fmt_sig(qp.max_kl_mean)}"
    quality = record.quality

    if quality is None:
        missing = "not measured: no quality section in the study"
        return [
            _gate(TOP1_CI, "quality", ci_thr, missing, False),
            _gate(AGREEMENT, "quality", agree_thr, missing, False),
            _gate(KL_MEAN, "quality", kl_thr, missing, False),
            _gate(FINITE, "quality", FINITE_THRESHOLD, missing, False),
        ]

    finite = _finite_gate(quality.nonfinite, engine)
    eq: EngineQuality | None = next((e for e in quality.engines if e.engine == engine), None)
    if eq is None:
        missing = f"not measured: no quality of the {engine} engine"
        return [
            _gate(TOP1_CI, "quality", ci_thr, missing, False),
            _gate(AGREEMENT, "quality", agree_thr, missing, False),
            _gate(KL_MEAN, "quality", kl_thr, missing, False),
            finite,
        ]

    if record.model.random_weights or not quality.meaningful:
        if record.model.random_weights:
            label = RANDOM_WEIGHTS
        else:
            label = f"not meaningful ({quality.meaningless_reason or 'marked so by the study'})"
        return [
            _gate(TOP1_CI, "quality", ci_thr, label, False),
            _gate(AGREEMENT, "quality", agree_thr, f"{label}; {fmt_pct(eq.agreement)} seen", False),
            _gate(KL_MEAN, "quality", kl_thr, f"{label}; {fmt_sig(eq.kl_mean)} seen", False),
            finite,
        ]

    if not eq.labelled:
        if qp.require_labels:
            ci = _gate(
                TOP1_CI, "quality", ci_thr, "not measured: held-out set is unlabelled", False
            )
        else:
            ci = _gate(
                TOP1_CI,
                "quality",
                ci_thr,
                "not measured: held-out set is unlabelled",
                True,
                skipped_reason="held-out set is unlabelled; the policy does not require labels",
            )
    elif eq.ci_low is None or eq.ci_high is None or eq.top1_change is None:
        ci = _gate(TOP1_CI, "quality", ci_thr, "not measured: no bootstrap CI in the study", False)
    else:
        ci = _gate(
            TOP1_CI,
            "quality",
            ci_thr,
            f"{fmt_points(eq.top1_change)} points, CI [{_vs_points(eq.ci_low, ci_thr_v)}, "
            f"{fmt_points(eq.ci_high)}]",
            eq.ci_low > qp.top1_change_ci_low_above,
        )
    agree = _gate(
        AGREEMENT,
        "quality",
        agree_thr,
        f"{_vs(eq.agreement, qp.min_agreement, 100.0, '%')} "
        f"({eq.differ_count} of {eq.n_images} differ)",
        eq.agreement >= qp.min_agreement,
    )
    kl_measured = fmt_sig(eq.kl_mean)
    if kl_measured == fmt_sig(qp.max_kl_mean) and eq.kl_mean != qp.max_kl_mean:
        kl_measured = repr(eq.kl_mean)
    kl = _gate(KL_MEAN, "quality", kl_thr, kl_measured, eq.kl_mean <= qp.max_kl_mean)
    return [ci, agree, kl, finite]


def _summary(ship: bool, gates: list[Gate], label: str) -> str:
    if ship:
        skipped = [g.name for g in gates if g.skipped_reason]
        note = f" ({len(skipped)} skipped: {', '.join(skipped)})" if skipped else ""
        return f"Shipped under {label}: all {len(gates)} gates passed{note}."
    failed = [g.name for g in gates if not g.passed]
    return (
        f"Not shipped under {label}: {len(failed)} of {len(gates)} gates failed "
        f"({', '.join(failed)})."
    )


def decide(record: StudyRecord, policy: Policy, policy_label: str) -> Decision:
    """Evaluate every gate of `policy` on `record`; FP8 ships only if all of them pass."""
    gates = [*_speed_gates(record, policy), *_quality_gates(record, policy)]
    failed = [g.name for g in gates if not g.passed]
    has_speed_pass = any(g.kind == "speed" and g.passed for g in gates)
    ship = not failed and has_speed_pass
    return Decision(
        ship=ship,
        policy=policy_label,
        gates=gates,
        failed=failed,
        summary=_summary(ship, gates, policy_label),
    )
