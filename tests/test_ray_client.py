"""The ``ray://`` (Ray Client) form of the cluster address (issue 16): a driver outside
the cluster runs queries through Ray's client server. A real ``ray start --head`` with a
client server on loopback; the driver is a fresh Python process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a `ray start` head and a client driver: about 90 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_queries_run_through_a_ray_client_address(tmp_path: Path) -> None:
    ray_cli = Path(sys.executable).with_name("ray")
    port, client_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SHOAL_RAY_ADDRESS")}
    temp = f"/tmp/shoal-rc-{os.getpid()}"
    head = subprocess.Popen(
        [
            str(ray_cli), "start", "--head", "--block", f"--port={port}",
            f"--ray-client-server-port={client_port}", "--num-cpus=2",
            "--include-dashboard=false", f"--temp-dir={temp}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", client_port)) == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the Ray head with a client server did not start")
        data = tmp_path / "t.parquet"
        script = f"""
            import polars as pl
            import shoal
            df = pl.DataFrame({{"k": [1, 2, 2, None, 3] * 200, "v": [1.5, None, -0.0, 2.0, float("nan")] * 200}})
            df.write_parquet({str(data)!r}, row_group_size=100)
            eng = shoal.DistEngine(runner="ray", raise_on_fail=True,
                                   config=shoal.Config(default_partitions=4))
            for lf in (df.lazy(), pl.scan_parquet({str(data)!r})):
                q = lf.group_by("k").agg(pl.col("v").sum(), pl.len()).sort("k")
                got, want = q.collect(engine=eng), q.collect()
                assert got.equals(want), (got, want)
            import ray
            print("CLIENT", ray.util.client.ray.is_connected())
            shoal.shutdown()
            print("OK")
        """
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            capture_output=True,
            text=True,
            timeout=300,
            # Ray 2.60 starts clusters with token authentication; a Ray Client driver sends
            # the token (~/.ray/auth_token, which `ray start` wrote) only in token mode.
            env={
                **env,
                "SHOAL_RAY_ADDRESS": f"ray://127.0.0.1:{client_port}",
                "RAY_AUTH_MODE": "token",
            },
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert "CLIENT True" in out.stdout and "OK" in out.stdout
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
