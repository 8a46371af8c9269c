"""The sensitivity plot: KL mean per layer with only that layer quantized, in rank order.

Drawn like the study's plots (`report/plots.py`): a matplotlib `Figure` on an Agg canvas, no
pyplot, no global state, written atomically, no date in the PNG metadata.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

from quantstudy.record import SensitivitySection
from quantstudy.record.io import write_bytes_atomic

if TYPE_CHECKING:  # matplotlib is imported where a plot is drawn
    from matplotlib.figure import Figure

SENSITIVITY_PNG = "sensitivity.png"
MAX_BARS = 40
_DPI = 100
_FLOOR = 1e-9  # KL 0 (an exact layer) drawn at this floor on the log axis


def png(fig: Figure) -> bytes:
    """`fig` as PNG bytes, without a date in the metadata (the same bytes for the same record)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def sensitivity_figure(section: SensitivitySection) -> Figure:
    """Horizontal bars of KL mean per layer (log scale), most sensitive on top, with agreement."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = section.layers[:MAX_BARS]
    fig = Figure(figsize=(9.0, 1.0 + 0.25 * max(len(rows), 4)), dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ys = list(range(len(rows)))[::-1]
    kls = [r.kl_mean if math.isfinite(r.kl_mean) else math.nan for r in rows]
    ax.barh(ys, [max(k, _FLOOR) if not math.isnan(k) else 0 for k in kls], color="#d62728")
    ax.set_xscale("log")
    labels = [f"{r.layer} ({r.kind}), agreement {100 * r.agreement:.1f}%" for r in rows]
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel(f"mean KL(fp32 || only this layer quantized), nats, {section.n_images} images")
    more = len(section.layers) - len(rows)
    title = "per-layer sensitivity" + (
        f" (top {len(rows)}; {more} more in the table)" if more else ""
    )
    ax.set_title(title)
    fig.tight_layout()
    return fig


def write_sensitivity_plot(section: SensitivitySection, folder: Path) -> Path:
    path = Path(folder) / SENSITIVITY_PNG
    write_bytes_atomic(path, png(sensitivity_figure(section)))
    return path
