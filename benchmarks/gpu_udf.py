"""Device check: a torch matrix product UDF on real GPUs, on both runners.

A stateful UDF (one actor per GPU) multiplies each batch of ``--cols`` float columns by a
``cols x cols`` matrix on ``cuda`` and returns, per row, the row sum of the product, the
device it ran on and the actor's ``CUDA_VISIBLE_DEVICES``. The script asserts that every
row ran on a cuda device, that each actor saw exactly one device of its own, and that the
values equal the same product computed with NumPy on the CPU; it prints the time per
runner::

    python benchmarks/gpu_udf.py --rows 2000000 --cols 64 --runner both

Exits 0 with a line starting ``SKIP`` where there is no GPU (no torch, no CUDA, or NVML
finds no device), so it is safe to run anywhere. ``--json PATH`` writes the results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np
import polars as pl


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    from shoal.resources import discover_gpus

    if not discover_gpus():
        return "NVML finds no NVIDIA GPU"
    return None


def _weights(cols: int) -> np.ndarray:
    return np.random.default_rng(7).standard_normal((cols, cols))


class MatmulOnGpu:
    """``__init__`` puts the weights on this actor's GPU; ``__call__`` multiplies a batch."""

    def __init__(self, cols: int) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                f"no CUDA device visible (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
            )
        self.torch = torch
        self.device = torch.device("cuda")
        self.w = torch.as_tensor(_weights(cols), device=self.device)
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.seen = torch.cuda.device_count()

    def __call__(self, *columns: pl.Series) -> pl.Series:
        x = np.stack([c.to_numpy() for c in columns], axis=1)
        y = (self.torch.as_tensor(x, device=self.device) @ self.w).sum(dim=1)
        n = len(x)
        return pl.DataFrame(
            {
                "value": y.cpu().numpy(),
                "device": [str(y.device)] * n,
                "visible": [self.visible] * n,
                "devices_seen": [self.seen] * n,
            }
        ).to_struct("out")


def run(runner: str, rows: int, cols: int, gpus: int) -> dict[str, Any]:
    import shoal
    from shoal.config import Config

    dtype = pl.Struct(
        {"value": pl.Float64, "device": pl.String, "visible": pl.String, "devices_seen": pl.Int64}
    )
    udf = shoal.udf(
        return_dtype=dtype, num_gpus=1, concurrency=gpus, batch_size=65536, name="matmul"
    )(MatmulOnGpu).with_init(cols)
    rng = np.random.default_rng(1)
    data = rng.standard_normal((rows, cols))
    df = pl.DataFrame({f"c{i}": data[:, i] for i in range(cols)})
    names = df.columns
    lf = df.lazy().shoal.with_udf(udf, inputs=names, output="out").select("out")
    shoal.shutdown()
    engine = shoal.DistEngine(
        runner=runner, raise_on_fail=True, config=Config(runner=runner, default_partitions=4 * gpus)
    )
    start = time.perf_counter()
    out = lf.collect(engine=engine).unnest("out")
    elapsed = time.perf_counter() - start
    shoal.shutdown()
    expected = (data @ _weights(cols)).sum(axis=1)
    devices = sorted(set(out["device"]))
    visible = sorted(set(out["visible"]))
    assert out.height == rows, (out.height, rows)
    assert all(d.startswith("cuda") for d in devices), devices
    assert set(out["devices_seen"]) == {1}, "an actor saw more than its own GPU"
    assert len(visible) == gpus and all("," not in v and v for v in visible), visible
    assert np.allclose(out["value"].to_numpy(), expected, rtol=1e-9, atol=1e-6)
    return {
        "runner": runner,
        "rows": rows,
        "cols": cols,
        "gpus": gpus,
        "seconds": round(elapsed, 3),
        "rows_per_s": round(rows / elapsed),
        "devices": devices,
        "cuda_visible_devices": visible,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cols", type=int, default=64)
    p.add_argument("--runner", choices=["local", "ray", "both"], default="both")
    p.add_argument("--json", help="write the results to this file")
    args = p.parse_args()
    reason = _skip_reason()
    if reason:
        print(f"SKIP gpu_udf: {reason}")
        return
    from shoal.resources import discover_gpus, gpu_info

    gpus = len(discover_gpus())
    print(f"GPUs: {gpu_info()}")
    results = []
    for runner in ("local", "ray") if args.runner == "both" else (args.runner,):
        res = run(runner, args.rows, args.cols, gpus)
        print(json.dumps(res))
        results.append(res)
    print("OK gpu_udf: every batch ran on cuda, one device per actor, values match NumPy")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
