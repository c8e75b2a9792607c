"""Building blocks of posstats' self-contained HTML pages (the run report, the diff report):
one stylesheet, escaping, number formatting, tables, and figures embedded as ``data:`` URIs."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posstats.reports.plots import png_bytes
from posstats.storage.publish import atomic_path

__all__ = ["CSS", "esc", "figure_html", "html_table", "num", "write_figures"]

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;margin:0 auto;padding:1.5rem;color:#1d1d1f;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.meta{color:#555;font-size:.9rem} nav a{margin-right:.8rem;font-size:.9rem}
table{border-collapse:collapse;font-size:.85rem;margin:.6rem 0} th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
th:first-child,td:first-child{text-align:left} th{background:#f5f5f7}
figure{margin:1.2rem 0;padding:.6rem;border:1px solid #e5e5e5;border-radius:6px;background:#fff}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{font-size:.9rem;color:#333;margin-top:.4rem} figcaption b{color:#000}
.kv td:first-child{font-weight:600}
.verdict td,.verdict th{text-align:left} .verdict{font-size:.95rem}
.answer{font-size:1.08rem;line-height:1.5;max-width:60rem;border-left:4px solid #3b6ea5;padding:.4rem .8rem;background:#f4f7fb}
"""


def esc(x: Any) -> str:
    """HTML-escaped text of ``x``."""
    return html.escape(str(x))


def num(x: Any, spec: str = ".4g") -> str:
    """A number for a table: floats by ``spec``, ints with thousands separators, None as '-'."""
    if x is None:
        return "-"
    if isinstance(x, (float, np.floating)):
        return format(float(x), spec)
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    return str(x)


def html_table(header: Sequence[str], rows: Sequence[Sequence[Any]], *, cls: str = "") -> str:
    """An HTML table (every cell escaped)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in rows)
    c = f' class="{cls}"' if cls else ""
    return f"<table{c}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure_html(plot: Any, png: bytes) -> str:
    """A ``<figure>`` holding ``png`` as a data URI, with the plot's title and caption."""
    b64 = base64.b64encode(png).decode("ascii")
    return (f'<figure id="{plot.name}"><img src="data:image/png;base64,{b64}" alt="{esc(plot.title)}">'
            f"<figcaption><b>{esc(plot.title)}.</b> {esc(plot.caption)}</figcaption></figure>")


def write_figures(plots: Sequence[Any], folder: Path) -> dict[str, bytes]:
    """Write every figure as ``folder/<name>.png`` (atomically); return the PNG bytes by name."""
    images: dict[str, bytes] = {}
    for p in plots:
        data = png_bytes(p)
        images[p.name] = data
        with atomic_path(folder / f"{p.name}.png") as tmp:
            tmp.write_bytes(data)
        p.figure.clear()
    return images
