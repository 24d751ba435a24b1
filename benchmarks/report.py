"""Writers for a benchmark run: JSON, markdown, PNG plots, console tables and the progress bar.

A run is a plain dict (see __main__.py): {"meta", "ceilings", "suites": [suite result, ...]}, each
suite result as harness.run_suite returns it. Everything here reads that dict only.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

STATUS_CELL = {"FAILED": "FAILED", "unsupported": "unsup.", "error": "error",
               "unavailable": "n/a", "skipped": "skip"}


# ----------------------------------------------------------------------------------------------
# Tables (shared by markdown and the console)
# ----------------------------------------------------------------------------------------------
def _ordered(values):
    seen = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)


def _fmt_value(rec, column: str = "") -> str:
    v, pct = rec.get(column + "value"), rec.get(column + "pct_ceiling")
    if v is None:
        return ""
    num = f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.3g}"
    return num if pct is None else f"{num} ({pct:.0f}%)"


def _columns(suite) -> list[str]:
    """Providers with at least one row that is not `unavailable` (those are listed in a note)."""
    recs = suite["records"]
    return [p for p in _ordered(r["provider"] for r in recs)
            if any(r["provider"] == p and r["status"] != "unavailable" for r in recs)]


def perf_table(suite, column: str = "") -> tuple[list[str], list[list[str]]]:
    """Rows = cases, columns = providers, cells = metric (% of ceiling) or the status; column
    "graph_": the CUDA-graph column instead of the eager headline."""
    cols = _columns(suite)
    cells = {(r["label"], r["provider"]): r for r in suite["records"]}
    header = ["case"] + cols
    rows = []
    for label in _ordered(r["label"] for r in suite["records"]):
        row = [label]
        for p in cols:
            r = cells.get((label, p))
            row.append("" if r is None else _fmt_value(r, column) if r["status"] == "ok"
                       else STATUS_CELL.get(r["status"], r["status"]))
        rows.append(row)
    return header, rows


def ratio_table(suite, baseline: str, column: str = "") -> tuple[list[str], list[list[str]]] | None:
    """Rows = cases, columns = our providers, cells = baseline time / our time (> 1: faster)."""
    ours = [p for p in _columns(suite)
            if any(r["provider"] == p and r["role"] == "ours" and r["status"] == "ok"
                   for r in suite["records"])]
    if not ours or not any(r["provider"] == baseline and r["status"] == "ok"
                           for r in suite["records"]):
        return None
    cells = {(r["label"], r["provider"]): r for r in suite["records"]}
    rows = []
    for label in _ordered(r["label"] for r in suite["records"]):
        row = [label]
        for p in ours:
            ratio = (cells.get((label, p)) or {}).get(column + "ratios", {}).get(baseline)
            row.append("" if ratio is None else f"{ratio:.2f}×")
        rows.append(row)
    return ["case"] + ours, rows


def problems(suite) -> list[str]:
    """One line per (provider, status, message), with the cases it covers."""
    groups: dict = {}
    for r in suite["records"]:
        if r["status"] in ("ok",):
            continue
        key = (r["provider"], r["status"], r["error"])
        groups.setdefault(key, []).append(r)
    lines = []
    for (prov, status, err), recs in groups.items():
        where = (recs[0]["label"] if len(recs) == 1 else f"{len(recs)} cases")
        seed = f" seed={recs[0]['seed']}" if recs[0].get("seed") is not None else ""
        lines.append(f"{prov}: {status} on {where}{seed}: {err}")
    return lines


def summary(suite) -> str:
    counts: dict = {}
    for r in suite["records"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    cap = " (time cap reached)" if suite.get("capped") else ""
    lost = f" DEVICE LOST: {suite['device_lost']}" if suite.get("device_lost") else ""
    return f"{suite['name']}: {suite['elapsed_s']:.1f} s, {len(suite['records'])} points: {parts}{cap}{lost}"


# ----------------------------------------------------------------------------------------------
# JSON and markdown
# ----------------------------------------------------------------------------------------------
def _jsonable(obj):
    """Strict JSON: non-finite floats become strings ("inf", "nan")."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def write_json(run: dict, path: Path) -> Path:
    path.write_text(json.dumps(_jsonable(run), indent=1, allow_nan=False) + "\n")
    return path


def _md_table(header, rows) -> list[str]:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    out = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(map(esc, row)) + " |" for row in rows]
    return out


def markdown(run: dict, plots: dict[str, str] | None = None) -> str:
    meta = run["meta"]
    lines = [f"# tiled_attn benchmarks: {meta['device_name']}, {meta['date']}", "",
             f"Command: `{meta['command']}`", "",
             f"torch {meta['torch']}, triton {meta['triton']}, CUDA {meta['cuda']}, "
             f"Python {meta['python']}; device: {meta['device_name']} ({meta['capability']}); "
             f"seed {meta['seed']}{'; --quick' if meta['quick'] else ''}.", "",
             f"Timing: {meta['timing']}", "", "## Ceilings (measured in this run)", ""]
    rows = []
    for dev, c in run["ceilings"].items():
        rows += [[f"copy bandwidth ({dev})", f"{c['copy_gbps']:.0f} GB/s", c["copy_note"]],
                 [f"dense matmul ({dev})", f"{c['matmul_tflops']:.1f} TFLOP/s", c["matmul_note"]]]
        if c.get("l2_bytes"):
            rows.append([f"L2 ({dev})", f"{c['l2_bytes'] / 2 ** 20:.0f} MiB",
                         "input sets rotate through >= 2x this"])
    lines += _md_table(["ceiling", "value", "how"], rows)
    for s in run["suites"]:
        lines += ["", f"## {s['title']} (`{s['name']}`)", "",
                  f"{s['unit']}: {s['convention']}. Cells: {s['unit']} (% of ceiling); "
                  "FAILED = wrong result (not timed), unsup. = raised/declined, n/a = unavailable, "
                  "skip = time cap.", "", f"{summary(s)}", ""]
        if s.get("notes"):
            lines += [s["notes"], ""]
        if s.get("markdown"):  # a suite with its own tables (overhead, e2e)
            lines += s["markdown"]
        else:
            lines += _md_table(*perf_table(s))
            for b in s["baselines"]:
                t = ratio_table(s, b)
                if t:
                    lines += ["", f"Speed-up over `{b}` (its time / ours):", ""] + _md_table(*t)
        if any(r.get("graph_value") for r in s["records"]):
            lines += ["", "CUDA-graph replay of the same calls (kernel time, no host cost), "
                      f"{s['unit']} (% of ceiling):", ""] + _md_table(*perf_table(s, "graph_"))
            for b in s["baselines"][:2]:
                t = ratio_table(s, b, "graph_")
                if t:
                    lines += ["", f"CUDA-graph speed-up over `{b}`:", ""] + _md_table(*t)
        probs = problems(s)
        if probs:
            lines += ["", "Not measured:", ""] + [f"- {p}" for p in probs]
        if plots and s["name"] in plots:
            lines += ["", f"![{s['name']}]({plots[s['name']]})"]
    return "\n".join(lines) + "\n"


def write_markdown(run: dict, path: Path, plots: dict[str, str] | None = None) -> Path:
    path.write_text(markdown(run, plots))
    return path


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------
def plot_suite(suite: dict, ceilings: dict, path: Path) -> Path | None:
    """Lines (metric vs x on a log2 axis, a subplot per rows × cols value) or grouped bars; the
    suite's ceiling as a horizontal line. Returns None when nothing was measured."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in suite["records"] if r["status"] == "ok"]
    spec = suite["plot"]
    if not ok or not spec:  # nothing measured, or a suite with its own tables (overhead, e2e)
        return None
    ceiling = ceilings.get(suite["ceiling"])
    cname = "copy bandwidth (read+write)" if suite["ceiling"] == "copy_gbps" else "dense matmul"
    providers = _ordered(r["provider"] for r in ok)
    cmap = plt.get_cmap("tab20")
    color = {p: cmap(i % 20) for i, p in enumerate(providers)}
    role = {r["provider"]: r["role"] for r in ok}

    if spec["kind"] == "bars":
        labels = _ordered(r["label"] for r in suite["records"])
        cases = {r["label"]: r["case"] for r in suite["records"]}
        varying = [k for k in cases[labels[0]]
                   if len({str(c.get(k)) for c in cases.values()}) > 1] or ["dtype"]
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels)), 4.5))
        width = 0.8 / max(1, len(providers))
        for i, p in enumerate(providers):
            vals = {r["label"]: r["value"] for r in ok if r["provider"] == p}
            xs = [j + i * width for j, lab in enumerate(labels) if lab in vals]
            ax.bar(xs, [vals[lab] for lab in labels if lab in vals], width, label=p,
                   color=color[p], hatch="" if role[p] == "ours" else "//")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))])
        ax.set_xticklabels(["\n".join(f"{k}={cases[lab].get(k)}" for k in varying)
                            for lab in labels], fontsize=8)
        fixed = {k: v for k, v in cases[labels[0]].items() if k not in varying}
        ax.set_xlabel(", ".join(f"{k}={v}" for k, v in fixed.items()), fontsize=8)
        axes = [ax]
    else:
        rows = _ordered(r["case"].get(spec["rows"]) for r in ok) if spec["rows"] else [None]
        cols = _ordered(r["case"].get(spec["cols"]) for r in ok) if spec["cols"] else [None]
        fig, grid = plt.subplots(len(rows), len(cols), figsize=(5 * len(cols), 3.8 * len(rows)),
                                 squeeze=False)
        axes = []
        for i, rv in enumerate(rows):
            for j, cv in enumerate(cols):
                ax = grid[i][j]
                axes.append(ax)
                sel = [r for r in ok if (spec["rows"] is None or r["case"].get(spec["rows"]) == rv)
                       and (spec["cols"] is None or r["case"].get(spec["cols"]) == cv)]
                for p in providers:
                    pts = sorted((r["case"][spec["x"]], r["value"]) for r in sel if r["provider"] == p)
                    if pts:
                        ax.plot(*zip(*pts), marker="o", ms=3, label=p, color=color[p],
                                ls="-" if role[p] == "ours" else "--")
                ax.set_xscale("log", base=2)
                ax.set_xlabel(spec["x"])
                title = ", ".join(f"{k}={v}" for k, v in ((spec["rows"], rv), (spec["cols"], cv)) if k)
                ax.set_title(title, fontsize=9)
    top = max(r["value"] for r in ok)
    for ax in axes:
        # The ceiling is drawn where it fits the data's scale (always on the GPU suites); on the
        # CPU suite it would flatten every line to zero, so it is named in the title instead.
        if ceiling and ceiling <= 20 * top:
            ax.axhline(ceiling, color="k", lw=1, ls=":", label=f"{cname}: {ceiling:.0f}")
            ax.set_ylim(bottom=0)
        elif ceiling:
            ax.set_title(f"{ax.get_title()} ({cname} {ceiling:.3g}: off scale)".strip(), fontsize=9)
        ax.set_ylabel(suite["unit"])
        ax.grid(alpha=0.3)
    if len(providers) > 6 or len(axes) > 1:  # many lines: one legend beside the figure
        handles, names = axes[0].get_legend_handles_labels()
        fig.legend(handles, names, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    else:
        axes[0].legend(fontsize=7)
    fig.suptitle(suite["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------
# Console and progress
# ----------------------------------------------------------------------------------------------
def make_console():
    """A rich Console (wide when not a terminal, so a captured log keeps whole rows), or None."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console() if sys.stdout.isatty() else Console(width=220, soft_wrap=False)


def say(console, text: str) -> None:
    if console is not None:
        console.print(text, highlight=False, markup=False)
    else:
        print(text, flush=True)


def print_suite(console, suite: dict) -> None:
    """The performance table and the first baseline's ratio table (all ratios are in the .md)."""
    tables = [(f"{suite['title']} [{suite['unit']}, % of ceiling]", perf_table(suite))]
    if suite["baselines"]:
        t = ratio_table(suite, suite["baselines"][0])
        if t:
            tables.append((f"speed-up over {suite['baselines'][0]}", t))
    for title, (header, rows) in tables:
        if console is None:
            print(title)
            print("\n".join(_md_table(header, rows)), flush=True)
            continue
        from rich.table import Table
        table = Table(title=title, title_justify="left")
        for h in header:
            table.add_column(h, justify="left" if h == "case" else "right", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for line in problems(suite):
        say(console, "  " + line)
    say(console, summary(suite))


class _PlainProgress:
    """One line per case: readable in a captured log (the GPU run's output tail)."""

    def __init__(self, total: int, title: str):
        self.total, self.title, self.done, self.last, self.t0 = total, title, 0, None, time.perf_counter()
        self.trace = os.environ.get("TILED_ATTN_BENCH_TRACE", "0") not in ("", "0")

    def advance(self, n: int, case: str, provider: str) -> None:
        if case != self.last:
            self.last = case
            print(f"  [{self.title} {self.done}/{self.total} {time.perf_counter() - self.t0:6.1f}s] "
                  f"{case}", flush=True)
        if self.trace:  # the provider about to run: a crash (segfault) of the process names it
            print(f"      {provider}", flush=True)
        self.done += n

    def close(self) -> None:
        pass


class _RichProgress:
    def __init__(self, total: int, title: str, console):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)
        self.p = Progress(TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), TextColumn("{task.description}"), console=console,
                          transient=True)
        self.p.start()
        self.task = self.p.add_task("", total=total)

    def advance(self, n: int, case: str, provider: str) -> None:
        self.p.update(self.task, advance=n, description=f"{case}  {provider}")

    def close(self) -> None:
        self.p.stop()


class _TqdmProgress:
    def __init__(self, total: int, title: str):
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=title, leave=False)

    def advance(self, n: int, case: str, provider: str) -> None:
        self.bar.set_postfix_str(f"{case} {provider}", refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


def progress_factory(console):
    """rich when on a terminal, else tqdm on a terminal, else one plain line per case."""
    def make(total: int, title: str):
        if sys.stdout.isatty():
            if console is not None:
                return _RichProgress(total, title, console)
            try:
                return _TqdmProgress(total, title)
            except ImportError:
                pass
        return _PlainProgress(total, title)
    return make
