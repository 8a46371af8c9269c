"""The committed independent Lite0 reference (tests/data/reference/lite0_fp32.json) agrees
with itself: its summary numbers are those of its per-image predictions, unedited."""

import hashlib
import json
from pathlib import Path

RECORD = Path(__file__).resolve().parents[1] / "data" / "reference" / "lite0_fp32.json"


def test_summary_is_computed_from_the_predictions():
    record = json.loads(RECORD.read_text())
    predictions = record["predictions"]
    assert len(predictions) == record["images"] == 1300
    correct = sum(label == predicted for label, predicted in predictions.values())
    assert correct == record["correct"] and record["top1"] == correct / 1300
    digest = hashlib.sha256(json.dumps(predictions, sort_keys=True).encode()).hexdigest()
    assert digest == record["predictions_sha256"]
    assert all(0 <= v < 1000 for pair in predictions.values() for v in pair)
