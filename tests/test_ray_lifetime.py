"""The local Ray instance shoal starts: private to the process, and alive as long as it.

Each test runs a fresh Python process (a "first query" must really be the first), so these
do not share the module's Ray instance.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

TIMEOUT_S = 240


def _run(script: str, tmp: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SHOAL_RAY_TEMP_DIR": tmp} if tmp else dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.pop("SHOAL_RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )


def test_ray_survives_the_thread_that_started_it() -> None:
    """Ray's daemons die with the thread that ran ray.init (PR_SET_PDEATHSIG): a first query
    from a pool thread that then exits used to kill the process at the next query."""
    tmp = f"/tmp/shoal-rl-{os.getpid()}a"
    out = _run(
        """
        import threading, time
        from concurrent.futures import ThreadPoolExecutor
        import polars as pl
        import shoal
        shoal.set_config(num_cpus=2)
        lf = pl.LazyFrame({"a": [1, 2, 3, None]}).select(pl.col("a").sum())
        with ThreadPoolExecutor(1) as ex:
            first = ex.submit(lambda: lf.collect(engine="dist")).result().item()
        time.sleep(2)  # the pool thread has exited; its children got their death signal
        answers = [first, lf.collect(engine="dist").item()]
        results = {}
        def work(i):
            results[i] = [lf.collect(engine="dist").item() for _ in range(10)]
        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        answers += results[0] + results[1]
        print("ANSWERS", answers)
        shoal.shutdown()
        """,
        tmp,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ANSWERS " + str([6] * 22) in out.stdout


def test_concurrent_first_queries_start_ray_once() -> None:
    tmp = f"/tmp/shoal-rl-{os.getpid()}b"
    out = _run(
        """
        import threading
        import polars as pl
        import ray
        import shoal
        from shoal.runners import session
        shoal.set_config(num_cpus=2)
        lf = pl.LazyFrame({"a": [1.5, -0.0, float("nan")]}).select(pl.col("a").max())
        barrier = threading.Barrier(2)
        got = []
        def work():
            barrier.wait()
            got.append(lf.collect(engine="dist").item())
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("GOT", len(got), len(ray.nodes()), len(session._backends))
        shoal.shutdown()
        """,
        tmp,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "GOT 2 1 1" in out.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # heavy (a Ray instance of its own or many processes): -m slow
def test_query_does_not_attach_to_a_foreign_local_instance() -> None:
    """Another program's Ray instance on this machine: with no address given, Ray's own
    ray.init() attaches to it (it reads /tmp/ray/ray_current_cluster, which an instance
    started with Ray's default temp dir writes); shoal must start its own."""
    ray_cli = Path(sys.executable).with_name("ray")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    foreign = subprocess.Popen(
        [
            str(ray_cli),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            "--node-ip-address=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the foreign Ray instance did not start")
        time.sleep(3)
        out = _run(
            """
            import polars as pl
            import ray
            import shoal
            print("SUM", pl.LazyFrame({"a": [1, 2]}).select(pl.col("a").sum())
                  .collect(engine="dist").item())
            print("GCS", ray.get_runtime_context().gcs_address)
            shoal.shutdown()
            """,
            None,  # Ray's default temp dir, where it looks for a running instance
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert "SUM 3" in out.stdout
        gcs = out.stdout.split("GCS ", 1)[1].strip()
        assert not gcs.endswith(f":{port}"), f"shoal attached to the foreign instance {gcs}"
    finally:
        # The foreign instance is only a bystander: stop its whole process group at once
        # (`ray start --block` takes tens of seconds to shut down on SIGTERM).
        os.killpg(foreign.pid, signal.SIGKILL)
        foreign.wait(timeout=60)


@pytest.mark.slow  # heavy (a Ray instance of its own or many processes): -m slow
def test_local_instance_files_are_private_to_the_user() -> None:
    """Issue 19: Ray makes its session, socket, log and spill directories 0777 (and makes
    them so again while it runs); with no ray_temp_dir shoal keeps them under
    <tmp>/shoal-<uid>, a directory of mode 0700 no other user can enter."""
    out = _run(
        """
        import polars as pl
        import ray
        import shoal
        print("SUM", pl.LazyFrame({"a": [1, 2]}).select(pl.col("a").sum())
              .collect(engine="dist").item())
        print("SESSION", ray._private.worker._global_node.get_session_dir_path())
        shoal.shutdown()
        """,
        None,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SUM 3" in out.stdout
    session = Path(out.stdout.split("SESSION ", 1)[1].split()[0])
    base = Path(tempfile.gettempdir()) / f"shoal-{os.getuid()}"
    assert base in session.parents, session
    assert base.stat().st_uid == os.getuid()
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
