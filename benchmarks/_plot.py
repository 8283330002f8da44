"""PNG of TFLOP/s vs sequence length from the harness's result rows (matplotlib, Agg)."""

from __future__ import annotations

from collections import defaultdict

__all__ = ["plot_results"]

_PASSES = ("fwd", "bwd", "fwdbwd")
_STYLE = {"kernel": "-", "reference": ":", "cudnn_dense": "--", "xla_dense": "--"}
_MARK = {"kernel": "o", "reference": "x", "cudnn_dense": "s", "xla_dense": "s"}


def plot_results(rows: list[dict], path: str, *, title: str) -> str | None:
    """Write one subplot per pass: TFLOP/s (effective) vs sequence length, one line per
    (implementation, series). Returns the path, or ``None`` when no row has a time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    ok = [r for r in rows if r.get("status") == "ok" and r.get("tflops") is not None]
    if not ok:
        return None
    passes = [p for p in _PASSES if any(r["pass"] == p for r in ok)]
    fig, axes = plt.subplots(1, len(passes), figsize=(5.2 * len(passes), 4.2), squeeze=False)
    for ax, p in zip(axes[0], passes):
        lines: dict[tuple, list] = defaultdict(list)
        colors = {s: f"C{i % 10}" for i, s in enumerate(sorted({r["series"] for r in ok}))}
        for r in ok:
            if r["pass"] == p:
                lines[(r["impl"], r["series"])].append((r["seqlen"], r["tflops"]))
        for (impl, series), pts in sorted(lines.items()):
            pts.sort()
            xs, ys = zip(*pts)
            ax.plot(
                xs, ys, linestyle=_STYLE.get(impl, "-"), marker=_MARK.get(impl, "."), color=colors[series],
                markersize=4, linewidth=1.2, label=f"{impl}: {series}",
            )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_xlabel("sequence length (max)")
        ax.set_ylabel("effective TFLOP/s")
        ax.set_title(p)
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        h, lab = ax.get_legend_handles_labels()
        for hh, ll in zip(h, lab):
            if ll not in labels:
                handles.append(hh)
                labels.append(ll)
    fig.legend(handles, labels, loc="lower center", ncol=min(3, max(1, len(labels))), fontsize=7,
               frameon=False)
    fig.suptitle(title, fontsize=10)
    nrows_leg = -(-len(labels) // 3)
    fig.tight_layout(rect=(0, min(0.5, 0.045 * nrows_leg + 0.02), 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
