"""What the Ray dashboard adds to the start of a local Ray instance (``ray_dashboard``).

Each round starts Ray twice in fresh processes, once without and once with the dashboard
(the order alternates between rounds), as shoal's runner would (``num_cpus``, a short
``_temp_dir``), and measures the seconds ``ray.init`` takes and, with the dashboard, the
seconds until the state API (``ray.util.state.list_tasks``) first answers::

    python benchmarks/ray_start.py --rounds 5

Prints the median and range of each; needs ``ray[default]`` for the dashboard side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

_CHILD = r"""
import json, os, sys, time
import ray
dashboard = sys.argv[1] == "1"
t0 = time.monotonic()
ray.init(num_cpus=2, include_dashboard=dashboard, logging_level="ERROR",
         _temp_dir=f"/tmp/shoal-rs-{os.getpid()}")
t1 = time.monotonic()
state = None
if dashboard:
    from ray.util.state import list_tasks
    address = ray.get_runtime_context().gcs_address
    while state is None and time.monotonic() - t1 < 60:
        try:
            list_tasks(address=address, limit=1, timeout=5)
            state = time.monotonic() - t1
        except Exception:
            time.sleep(0.05)
t2 = time.monotonic()
ray.shutdown()
print(json.dumps({"init_s": t1 - t0, "state_api_s": state, "shutdown_s": time.monotonic() - t2}))
"""


def start_once(dashboard: bool) -> dict[str, float | None]:
    """Start and stop Ray once in a new process; its timings in seconds."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, "1" if dashboard else "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f} to {max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    runs: dict[bool, list[dict[str, float | None]]] = {False: [], True: []}
    for i in range(args.rounds):
        for dashboard in (False, True) if i % 2 == 0 else (True, False):
            runs[dashboard].append(start_once(dashboard))
    plain = [float(r["init_s"] or 0) for r in runs[False]]
    dash = [float(r["init_s"] or 0) for r in runs[True]]
    state = [float(r["state_api_s"]) for r in runs[True] if r["state_api_s"] is not None]
    print(f"rounds: {args.rounds}")
    print(f"ray.init without dashboard: {_summary(plain)}")
    print(f"ray.init with dashboard:    {_summary(dash)}")
    if state:
        print(f"then until the state API answers: {_summary(state)}")
    print(f"median difference: {statistics.median(dash) - statistics.median(plain):+.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
