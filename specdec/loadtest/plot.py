"""Pictures and a table of a load curve (`specdec load-test --curve`): throughput, time to first
token and latency against the number of concurrent clients, one line per speculation setting; the
points of a second curve (another server, e.g. one at a time: `--max-batch 1`) dashed beside them."""

from __future__ import annotations

from pathlib import Path

PANELS = (("tokens_per_second", "aggregate tokens / s"), ("ttft_p50", "time to first token p50 (s)"),
          ("latency_p50", "request latency p50 (s)"), ("latency_p99", "request latency p99 (s)"))


def figures(point: dict) -> dict:
    """The plotted numbers of one point of a curve."""
    return {"tokens_per_second": point["tokens_per_second"], "ttft_p50": point["time_to_first_token_seconds"]["p50"],
            "latency_p50": point["latency_seconds"]["p50"], "latency_p99": point["latency_seconds"]["p99"]}


def plot_load_curve(curves: dict[str, list[dict]], out: Path) -> None:
    """curves: label → the points of `run_load_curve`; one PNG with four panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for (label, points), style in zip(curves.items(), ("-o", "--s", ":^")):
        for setting in dict.fromkeys(p["speculation"] for p in points):
            series = [p for p in points if p["speculation"] == setting]
            clients = [p["clients"] for p in series]
            for ax, (key, title) in zip(axes.flat, PANELS):
                ax.plot(clients, [figures(p)[key] for p in series], style, label=f"{label}: {setting}")
    for ax, (_, title) in zip(axes.flat, PANELS):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def curve_table(curves: dict[str, list[dict]]) -> str:
    """A Markdown table of every point."""
    lines = ["| server | speculation | clients | requests | tokens/s | TTFT p50 (s) | latency p50 (s) | latency p99 (s) | errors | mismatches |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, points in curves.items():
        for p in points:
            f = figures(p)
            lines.append(f"| {label} | {p['speculation']} | {p['clients']} | {p['completed']} | {f['tokens_per_second']} | "
                         f"{f['ttft_p50']} | {f['latency_p50']} | {f['latency_p99']} | {p['errors']} | {p['mismatches']} |")
    return "\n".join(lines)
