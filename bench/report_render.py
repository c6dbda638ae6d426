"""``python -m bench.report_render [--nodes 16,256,1024] [--runs 3]``: what rendering a check's
report costs at a few hundred nodes (#42): the folded text table, the finding lines, the HTML
page and the Prometheus textfile, each timed (CPU seconds, the median of ``--runs``) over a
report of N copies of this project's real H100 capture's observed properties with two nodes'
VBIOS changed (one value each), as drift and diagnose would hold it. Prints a markdown table.
Measures; asserts nothing."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import generate_latest

from trainfleet.capabilities import RULES
from trainfleet.compare import Report, compare
from trainfleet.diagnose import judge
from trainfleet.html_report import page
from trainfleet.hw.sources import STATUS_FILE
from trainfleet.metrics import report_registry

H100 = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hardware" / "h100_device"
SOURCES = {  # what the H100's capture holds (tests/fixtures/hardware/h100_device)
    "nvidia-smi-q.xml": "ok",
    "nvidia-smi-nvlink-s.txt": "ok",
    "nvidia-smi-topo-m.txt": "ok",
    "lspci-vvv.txt": "ok",
    "dmesg.txt": "ok",
    "cmdline": "ok",
    "cpuinfo": "absent",  # not captured on that machine (its capture script predates it)
    "sys-class-infiniband": "absent",
}


def h100_node(folder: Path) -> None:
    """The one real H100 node's capture laid out in ``folder`` (made), as a capture saves it:
    each source it holds and the status of each (the tests copy it too)."""
    folder.mkdir(parents=True)
    for name, status in SOURCES.items():
        if status == "ok":
            (folder / name).write_bytes((H100 / name).read_bytes())
    (folder / STATUS_FILE).write_text("".join(f"{n} {s}\n" for n, s in SOURCES.items()))


def h100_properties() -> dict[str, str]:
    """The one real H100 node's observed properties, as the offline judge reads them."""
    with tempfile.TemporaryDirectory() as tmp:
        h100_node(Path(tmp) / "capture" / "gpu001")
        return dict(judge(Path(tmp) / "capture").observed["gpu001"])


def fleet(nodes: int, one: dict[str, str]) -> Report:
    names = [f"gpu{i:04d}" for i in range(1, nodes + 1)]
    observed = {name: dict(one) for name in names}
    for odd in (names[len(names) // 3], names[-1]):
        observed[odd]["GPU VBIOS"] = "96.00.99.00.01"
    return compare("bench", names, observed, {}, rules=RULES)


def cpu(task: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.process_time()
        task()
        samples.append(time.process_time() - started)
    return statistics.median(samples)


def measure(nodes: list[int], runs: int) -> list[dict[str, float]]:
    one = h100_properties()
    rows = []
    for n in nodes:
        report = fleet(n, one)
        rows.append(
            {
                "nodes": n,
                "table": cpu(report.table, runs),
                "finding lines": cpu(report.finding_lines, runs),
                "HTML page": cpu(lambda r=report: page(r, "bench"), runs),
                "metrics": cpu(
                    lambda r=report: generate_latest(report_registry(r, "drift", 0)), runs
                ),
                "table lines": len(report.table().splitlines()),
                "page KB": len(page(report, "bench")) / 1024,
            }
        )
    return rows


def markdown(rows: list[dict[str, float]]) -> str:
    head = "| nodes | table s | finding lines s | HTML page s | metrics s | table lines | page KB |"
    out = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['nodes']:.0f} | {r['table']:.3f} | {r['finding lines']:.3f} | "
            f"{r['HTML page']:.3f} | {r['metrics']:.3f} | {r['table lines']:.0f} | "
            f"{r['page KB']:.0f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report_render")
    parser.add_argument("--nodes", default="16,256,1024", help="report sizes (default 16,256,1024)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each (default 3)")
    args = parser.parse_args(argv)
    print(markdown(measure([int(n) for n in args.nodes.split(",")], args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
