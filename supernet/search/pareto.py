"""The Pareto front of evaluated sub-networks (metric against cost), as a table and as a PNG plot."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from supernet.search.evolution import Candidate

__all__ = ["format_front", "pareto_front", "plot_front"]


def pareto_front(candidates: Sequence[Candidate], higher_is_better: bool = True) -> list[Candidate]:
    """The candidates no other candidate beats on both cost and metric, cheapest first.

    Duplicated configs count once; among equal (cost, metric) points the lowest hash is kept.
    """
    unique = {c.hash: c for c in candidates}.values()

    def goodness(c: Candidate) -> float:
        return c.metric if higher_is_better else -c.metric

    front: list[Candidate] = []
    for c in sorted(unique, key=lambda c: (c.cost, -goodness(c), c.hash)):
        if not front or goodness(c) > goodness(front[-1]):
            front.append(c)
    return front


def format_front(
    front: Sequence[Candidate],
    metric_name: str,
    columns: Sequence[tuple[str, Callable[[Candidate], str]]] = (),
    *,
    percent: bool = True,
) -> str:
    """A fixed-width text table: extra ``columns`` (header, formatter), the metric, method, config."""
    metric_header = f"{metric_name} (%)" if percent else metric_name
    headers = [h for h, _ in columns] + [metric_header, "found by", "config"]
    rows = []
    for c in front:
        value = f"{100 * c.metric:.2f}" if percent else f"{c.metric:.4f}"
        rows.append([fmt(c) for _, fmt in columns] + [value, f"{c.method} g{c.generation}", str(c.config)])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) if i < len(headers) - 2 else h.ljust(w)
                       for i, (h, w) in enumerate(zip(headers, widths, strict=True))).rstrip()]  # fmt: skip
    for r in rows:
        lines.append(
            "  ".join(
                v.rjust(w) if i < len(headers) - 2 else v.ljust(w)
                for i, (v, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()  # fmt: skip
        )
    return "\n".join(lines)


def plot_front(
    path: str | Path,
    searches: Sequence[tuple[str, Sequence[Candidate]]],
    *,
    higher_is_better: bool,
    metric_label: str,
    cost_label: str,
    limit: float | None = None,
    chosen: Candidate | None = None,
    percent: bool = True,
    title: str = "",
) -> Path:
    """Scatter every evaluated candidate (one colour per search), draw the front of all of them, the
    budget and the chosen sub-network; save as PNG (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = 100.0 if percent else 1.0
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    everything: list[Candidate] = []
    for (name, candidates), colour in zip(searches, ("tab:blue", "tab:gray", "tab:green", "tab:purple")):
        ax.scatter([c.cost for c in candidates], [scale * c.metric for c in candidates], s=14, alpha=0.55,
                   color=colour, label=f"{name} ({len(candidates)} evaluated)")  # fmt: skip
        everything += candidates
    front = pareto_front(everything, higher_is_better)
    if front:
        ax.step([c.cost for c in front], [scale * c.metric for c in front], where="post", color="tab:red",
                linewidth=1.5, label="Pareto front")  # fmt: skip
    if limit is not None:
        ax.axvline(limit, color="black", linestyle="--", linewidth=1, label=f"budget {limit:g} {cost_label}")
    if chosen is not None:
        ax.scatter([chosen.cost], [scale * chosen.metric], marker="*", s=180, color="gold", edgecolor="black",
                   zorder=5, label="chosen")  # fmt: skip
    ax.set_xlabel(cost_label)
    ax.set_ylabel(f"{metric_label} (%)" if percent else metric_label)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right" if higher_is_better else "upper right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
