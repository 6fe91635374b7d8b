"""``shoal tpch``: it says what it does while it prepares (generating or reusing the data,
starting the runner) and Ray's token-authentication notice does not land in the middle
of its table."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.cli import main


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_tpch_says_what_it_does_before_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["tpch", "--scale", "0.01", "--queries", "6", "--runner", "local"]
    assert main([*argv, "--data-dir", str(tmp_path)]) == 0
    lines = _lines(capsys.readouterr().out)
    target = tmp_path / "sf0.01"
    assert lines[0].startswith(
        f"generating TPC-H scale 0.01 data (4 Parquet files per large table) into {target} with "
    )
    assert "tpchgen-cli" in lines[0]
    assert lines[1].startswith("generated in ") and lines[1].endswith(" s")
    assert lines[2] == f"data:   {target}"
    assert lines[3] == "starting the local runner ..."
    assert lines[4].startswith("runner: local (started in ")
    assert lines[5].startswith("query") and lines[6].startswith("Q6") and lines[6].endswith("yes")
    # Again: the cached data is reused, and said so.
    assert main([*argv, "--data-dir", str(tmp_path)]) == 0
    lines = _lines(capsys.readouterr().out)
    assert lines[0] == f"using the TPC-H scale 0.01 data cached in {target}"
    assert lines[1] == f"data:   {target}"


def test_rays_token_notice_goes_to_shoals_logger(caplog: pytest.LogCaptureFixture) -> None:
    """While shoal starts a local Ray instance, Ray's "token authentication is enabled"
    warning (Ray's own function makes it here) reaches no Ray handler and is logged by
    ``shoal`` at INFO; Ray's warning that authentication is *disabled* still shows."""
    from ray._private.authentication import authentication_token_setup as auth

    from shoal.runners.ray_runner import RAY_AUTH_LOGGER, _TokenAuthNotice

    ray_log = logging.getLogger(RAY_AUTH_LOGGER)
    assert ray_log is logging.getLogger(auth.__name__)
    seen: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    catch, notice = Catch(), _TokenAuthNotice()
    ray_log.addHandler(catch)
    ray_log.addFilter(notice)
    try:
        with caplog.at_level(logging.INFO, logger="shoal"):
            auth._warn_token_auth_enabled()
            assert not seen
            assert any(
                r.name == "shoal" and "token authentication" in r.getMessage()
                for r in caplog.records
            )
            auth._warn_token_auth_disabled()
            assert [r.levelno for r in seen] == [logging.WARNING]
    finally:
        ray_log.removeFilter(notice)
        ray_log.removeHandler(catch)


@pytest.mark.slow  # starts Ray in a child process: 10-30 s
def test_tpch_on_ray_prints_no_ray_warning_among_its_lines(tmp_path: Path) -> None:
    code = "import sys; from shoal.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["tpch", "--scale", "0.01", "--queries", "1,6", "--runner", "ray"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env["SHOAL_RAY_TEMP_DIR"] = f"/tmp/shoal-ray-cli-{os.getpid()}"
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv, "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # as a terminal shows both
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout
    assert "Token authentication" not in proc.stdout
    lines = _lines(proc.stdout)
    start = lines.index("starting the ray runner ...")
    assert lines[start + 1].startswith("runner: ray (started in ")
    assert [ln.split()[0] for ln in lines[start + 3 :]] == ["Q1", "Q6"], proc.stdout
