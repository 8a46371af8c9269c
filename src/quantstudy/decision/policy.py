"""The decision policy: when does FP8 ship? A preset or a YAML file, evaluated into gates.

`load_policy(name_or_path)` reads a built-in preset (`PRESETS`; None: `default`) or a policy
file; `decide(record, policy, label)` evaluates every gate (`gates.py`; a `--heldout auto`
study's interval gates from its last look, `sequential_gates.py`) and returns a typed
`Decision` whose outcome is ship (every gate passes), not ship (a gate fails) or inconclusive
(no gate fails, some cannot yet pass). `EXIT_CODES` maps outcomes to the CLI's exit status.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from quantstudy.decision.gates import quality_gates, speed_gates
from quantstudy.decision.schema import Policy
from quantstudy.decision.sequential_gates import decision_gates
from quantstudy.record import Decision, Gate, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.readers import not_a_file, parse_yaml, read_text
from quantstudy.record.vocab import GateKind, GateStatus, Outcome

__all__ = [
    "DEFAULT_POLICY_LABEL",
    "EXIT_CODES",
    "PRESETS",
    "decide",
    "load_policy",
    "parse_policy",
]

# Built-in presets: name -> when to use it (each file's first comment says the same).
PRESETS: dict[str, str] = {
    "default": "can FP8 replace the fp16 engine shipped today (95% intervals, 0.5-point margin)",
    "strict": "a wrong ship is expensive (99% intervals, 0.25-point margin, labels required)",
    "latency-first": "latency is the requirement and a point of top-1 is an acceptable price",
}
DEFAULT_POLICY_LABEL = "builtin:default"

# Exit status of `quantstudy run|demo|decide` per outcome. 1 is a user error (`UserError`), 2
# an argparse usage error and 130 Ctrl-C, so the outcomes take 0, 3 and 4.
EXIT_CODES: dict[Outcome, int] = {Outcome.SHIP: 0, Outcome.NOT_SHIP: 3, Outcome.INCONCLUSIVE: 4}


# --- loading ------------------------------------------------------------------------------


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _validation_message(source: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        key = _key_path(e["loc"])
        if e["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key (check its spelling against the default preset)")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            parts.append(f"{key}: {msg} (got {e.get('input')!r})")
    return f"invalid policy {source}: " + "; ".join(parts)


def parse_policy(text: str, source: str) -> Policy:
    """Parse and validate policy YAML; `source` names it in error messages."""
    _, data = parse_yaml(text, f"policy {source}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(
            f"policy {source} must be a mapping of keys (version, engine, confidence, speed, "
            f"quality), not a {type(data).__name__}"
        )
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        raise UserError(_validation_message(source, e)) from None


def preset_text(name: str) -> str:
    return resources.files("quantstudy.decision").joinpath(f"{name}.yaml").read_text()


def load_policy(name_or_path: str | Path | None) -> tuple[Policy, str]:
    """A built-in preset by name (None: `default`) or a policy file; return it and its label
    (`builtin:NAME`, or the file's absolute path)."""
    name = "default" if name_or_path is None else str(name_or_path)
    if name in PRESETS:
        label = f"builtin:{name}"
        return parse_policy(preset_text(name), label), label
    path = Path(name)
    if not_a_file(path) == "missing":  # a pipe or a folder: refused by `read_text`, unopened
        raise UserError(
            f"policy not found: {name} is neither a file nor a preset "
            f"({', '.join(PRESETS)}); omit --policy for the default"
        )
    # the label a record keeps is absolute: read again later (`import-trt`, the report's
    # self-check) from another folder, a relative path would name another file or none
    label = str(path.absolute())
    return parse_policy(read_text(path, "config", "policy"), str(path)), label


# --- the decision -------------------------------------------------------------------------


def outcome_of(gates: list[Gate]) -> Outcome:
    """Not ship if any gate fails; ship if all pass and one of them is a speed gate."""
    if any(g.status == GateStatus.FAIL for g in gates):
        return Outcome.NOT_SHIP
    speed_passed = any(g.kind == GateKind.SPEED and g.passed for g in gates)
    if all(g.passed for g in gates) and speed_passed:
        return Outcome.SHIP
    return Outcome.INCONCLUSIVE


def _quality_gates(record: StudyRecord, policy: Policy) -> list[Gate]:
    """The quality gates; a sequential study's interval gates come from its last look
    (`sequential_gates.py`), since fixed-N intervals do not hold at a size the data chose."""
    gates = quality_gates(record, policy)
    q = record.quality
    if record.model.random_weights or (q is not None and not q.meaningful):
        return gates  # no quality evidence, however many images were looked at
    looked = decision_gates(record.sequential, policy)
    return [looked.get(g.name, g) for g in gates]


def decide(record: StudyRecord, policy: Policy, policy_label: str) -> Decision:
    """Evaluate every gate of `policy` on `record`."""
    gates = [*speed_gates(record, policy), *_quality_gates(record, policy)]
    open_gates = [g for g in gates if g.status == GateStatus.INCONCLUSIVE]
    needed = [g.images_needed for g in open_gates if g.images_needed is not None]
    return Decision(
        outcome=outcome_of(gates),
        policy=policy_label,
        confidence=policy.confidence,
        gates=gates,
        failed=[g.name for g in gates if g.status == GateStatus.FAIL],
        inconclusive=[g.name for g in open_gates],
        images_needed=max(needed) if needed else None,
    )
