"""Scans of object storage (``s3://``) against a real S3 server on loopback (moto's
threaded server): Polars queries through shoal equal native Polars reading the same
bucket, on the local runner and on Ray; row groups pruned by footer statistics; errors
before any task; credentials never shown."""

from __future__ import annotations

import io
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal import storage
from shoal.ir import serde
from shoal.ir.nodes import ParquetSource, Scan, StorageOptions

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "shoal-test"
KEY_ID = "AKIDSHOALTEST"
SECRET = "shoal-secret-7Qx9vZ2pL0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    """A moto S3 server on 127.0.0.1 with bucket ``shoal-test`` filled with test data;
    yields the Polars ``storage_options`` and a boto3 client."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port())
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    _fill(client)
    options = {
        "aws_endpoint_url": endpoint,
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET,
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }
    yield {"options": options, "client": client, "endpoint": endpoint}
    server.stop()


def _put(client: Any, key: str, df: pl.DataFrame, **kw: Any) -> None:
    buf = io.BytesIO()
    if key.endswith(".csv"):
        df.write_csv(buf)
    else:
        df.write_parquet(buf, **kw)
    client.put_object(Bucket=BUCKET, Key=key, Body=buf.getvalue())


def _fill(client: Any) -> None:
    # Flat Parquet files: sorted by `a` so that row groups have disjoint ranges; nulls, NaN,
    # -0.0 and duplicates; one empty file.
    for i in range(3):
        n = 40
        df = pl.DataFrame(
            {
                "a": [i * 100 + j for j in range(n)],
                "x": [None if j % 7 == 0 else float("nan") if j % 11 == 0 else -0.0 if j == 5
                      else j / 4 for j in range(n)],
                "s": [None if j % 5 == 0 else f"s{j % 3}" for j in range(n)],
            },
            schema={"a": pl.Int64, "x": pl.Float64, "s": pl.String},
        )  # fmt: skip
        _put(client, f"flat/part-{i}.parquet", df, row_group_size=10)
    _put(
        client,
        "flat/part-3.parquet",
        pl.DataFrame(schema={"a": pl.Int64, "x": pl.Float64, "s": pl.String}),
    )
    # Hive partitions.
    for k in (1, 2, 3):
        for f in range(2):
            df = pl.DataFrame({"v": [k * 10 + f, None, k], "w": ["p", "q", None]})
            _put(client, f"hive/k={k}/f{f}.parquet", df)
    # CSV files.
    for i in range(3):
        df = pl.DataFrame({"a": [i, i + 1, None], "t": ["u", None, f"z{i}"]})
        _put(client, f"csv/c{i}.csv", df)


def _engine(runner: str) -> shoal.DistEngine:
    cfg = shoal.Config(runner=runner, default_partitions=3, shuffle_partitions=3)  # type: ignore[arg-type]
    return shoal.DistEngine(runner=runner, raise_on_fail=True, config=cfg)  # type: ignore[arg-type]


@pytest.fixture(params=["local", "ray"])
def runner(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_runner")
    return str(request.param)


def _queries(so: dict[str, str]) -> dict[str, pl.LazyFrame]:
    flat = pl.scan_parquet(f"s3://{BUCKET}/flat/*.parquet", storage_options=so)
    hive = pl.scan_parquet(
        f"s3://{BUCKET}/hive/**/*.parquet", storage_options=so, hive_partitioning=True
    )
    csv = pl.scan_csv(f"s3://{BUCKET}/csv/*.csv", storage_options=so)
    return {
        "flat": flat,
        "flat_filter": flat.filter((pl.col("a") >= 110) & (pl.col("a") < 215)),
        "flat_agg": flat.group_by("s").agg(pl.col("x").sum(), pl.len()).sort("s"),
        "hive": hive,
        "hive_filter": hive.filter(pl.col("k") >= 2).select("v", "k"),
        "csv": csv,
        "csv_agg": csv.select(pl.col("a").sum(), pl.col("t").count()),
    }


@pytest.mark.parametrize(
    "name", ["flat", "flat_filter", "flat_agg", "hive", "hive_filter", "csv", "csv_agg"]
)
def test_queries_equal_native_polars(s3: dict[str, Any], runner: str, name: str) -> None:
    lf = _queries(s3["options"])[name]
    expected = lf.collect(engine="in-memory")
    got = lf.collect(engine=_engine(runner))
    assert_frame_equal(got, expected)


def test_predicate_prunes_row_groups(s3: dict[str, Any]) -> None:
    lf = _queries(s3["options"])["flat_filter"]
    text = shoal.explain(lf, runner="local", config=shoal.Config(runner="local"))
    # 3 files x 4 row groups of 10 rows; a in [110, 215): rows 110..139 (3 groups of file
    # 1) and 200..214 (2 groups of file 2): 5 of 12 read.
    assert "Parquet row groups: 5 of 12 read, 7 pruned by statistics" in text
    assert_frame_equal(lf.collect(engine=_engine("local")), lf.collect(engine="in-memory"))


def test_float_greater_than_keeps_nan_row_groups(s3: dict[str, Any]) -> None:
    # Parquet statistics leave NaN out, and Polars orders NaN above every number: a
    # ``x > 100`` must keep row groups with NaN though their max is below 100.
    lf = _queries(s3["options"])["flat"].filter(pl.col("x") > 100.0)
    expected = lf.collect(engine="in-memory")
    assert expected.height > 0  # the NaN rows
    assert_frame_equal(lf.collect(engine=_engine("local")), expected)
    lt = _queries(s3["options"])["flat"].filter(pl.col("x") < -1.0)
    assert_frame_equal(lt.collect(engine=_engine("local")), lt.collect(engine="in-memory"))


def test_footers_read_once_and_cached(s3: dict[str, Any]) -> None:
    so = StorageOptions(s3["options"])
    paths = [f"s3://{BUCKET}/flat/part-{i}.parquet" for i in range(4)]
    first = storage.read_footers(paths, so)
    assert [m.num_rows for m in first] == [40, 40, 40, 0]
    again = storage.read_footers(paths, so)
    assert all(a is b for a, b in zip(first, again, strict=True))  # from the cache


def _grep_secret(*texts: str) -> None:
    for t in texts:
        assert SECRET not in t


def test_credentials_never_shown(s3: dict[str, Any], tmp_path: Path) -> None:
    lf = _queries(s3["options"])["flat_filter"]
    text = shoal.explain(lf, runner="local", config=shoal.Config(runner="local"))
    trace_file = tmp_path / "q.json"
    with shoal.trace(trace_file):
        lf.collect(engine=_engine("local"))
    from shoal_polars.engine import to_ir

    plan = to_ir(lf)
    scans = [n for n in plan.walk() if isinstance(n, Scan)]
    assert scans and isinstance(scans[0].source, ParquetSource)
    so = scans[0].source.storage_options
    assert so is not None and so.to_dict()["aws_secret_access_key"] == SECRET
    doc = serde.to_json(plan)
    assert json.loads(doc)  # valid JSON, secret written as ***
    assert '"aws_secret_access_key": "***"' in doc or '"aws_secret_access_key":"***"' in doc
    _grep_secret(text, trace_file.read_text(), doc, repr(plan), str(plan), repr(so))
    from shoal.ir.explain import explain as explain_ir

    _grep_secret(explain_ir(plan, schema=True))


def test_errors_before_any_task_name_the_url(s3: dict[str, Any]) -> None:
    so = StorageOptions(s3["options"])
    missing_key = f"s3://{BUCKET}/flat/nope.parquet"
    missing_bucket = "s3://no-such-bucket/x.parquet"
    for url in (missing_key, missing_bucket):
        with pytest.raises(FileNotFoundError, match=url.replace(".", r"\.")) as info:
            shoal.execute(
                Scan(ParquetSource((url,), so), shoal.ir.Schema.from_polars({"a": pl.Int64})),
                runner="local",
            )
        _grep_secret(str(info.value))
        assert ("bucket 'no-such-bucket' does not exist" in str(info.value)) == (
            url == missing_bucket
        )
    # Through Polars: Polars itself resolves the files before shoal sees the plan.
    lf = pl.scan_parquet(missing_key, storage_options=s3["options"])
    with pytest.raises(FileNotFoundError) as info2:
        lf.collect(engine=_engine("local"))
    assert "nope.parquet" in str(info2.value)
    _grep_secret(str(info2.value))


def test_bad_credentials_raise_permission_error_naming_the_url(s3: dict[str, Any]) -> None:
    import moto.settings

    url = f"s3://{BUCKET}/flat/part-0.parquet"
    bad = StorageOptions({**s3["options"], "aws_secret_access_key": SECRET + "-wrong"})
    plan = Scan(ParquetSource((url,), bad), shoal.ir.Schema.from_polars({"a": pl.Int64}))
    before = moto.settings.INITIAL_NO_AUTH_ACTION_COUNT
    moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # the server now checks every signature
    try:
        with pytest.raises(PermissionError, match=url.replace(".", r"\.")) as info:
            shoal.execute(plan, runner="local")
    finally:
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = before
    _grep_secret(str(info.value))


def test_refused_credentials_message_is_scrubbed() -> None:
    err = storage.error(
        "s3://b/k", OSError(f"AWS Error ACCESS_DENIED during HeadObject: key {SECRET}"),
        StorageOptions({"aws_secret_access_key": SECRET}),
    )  # fmt: skip
    assert isinstance(err, PermissionError)
    assert "s3://b/k" in str(err)
    _grep_secret(str(err))


def test_unknown_storage_option_falls_back_with_reason(s3: dict[str, Any]) -> None:
    so = {**s3["options"], "aws_imdsv1_fallback": "true"}
    lf = pl.scan_parquet(f"s3://{BUCKET}/flat/part-0.parquet", storage_options=so)
    with pytest.raises(Exception, match="imds_v1_fallback"):
        lf.collect(engine=_engine("local"))


def test_storage_options_serde_roundtrip_is_redacted() -> None:
    so = StorageOptions({"aws_region": "eu-west-1", "aws_secret_access_key": SECRET})
    plan = Scan(
        ParquetSource(("s3://b/k.parquet",), so), shoal.ir.Schema.from_polars({"a": pl.Int64})
    )
    back = serde.from_json(serde.to_json(plan), validate=False)
    assert isinstance(back, Scan) and isinstance(back.source, ParquetSource)
    assert back.source.storage_options == StorageOptions(
        {"aws_region": "eu-west-1", "aws_secret_access_key": "***"}
    )
    assert StorageOptions({"b": "1", "a": "2"}) == StorageOptions({"a": "2", "b": "1"})


def _listing(client: Any, prefix: str) -> list[str]:
    got = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix) :] for o in got)


@pytest.mark.parametrize("layout", ["file", "split", "hive"])
def test_sink_parquet_to_the_bucket_writes_what_polars_writes(
    s3: dict[str, Any], runner: str, layout: str
) -> None:
    so = s3["options"]
    lf = _queries(so)["flat"].filter(pl.col("a") % 3 != 0).with_columns(k=pl.col("a") % 2)
    client = s3["client"]
    base = f"sink-{runner}-{layout}"

    def target(who: str) -> Any:
        url = f"s3://{BUCKET}/{base}/{who}"
        if layout == "file":
            return url + "/out.parquet"
        if layout == "split":
            return pl.PartitionBy(url, max_rows_per_file=25)
        return pl.PartitionBy(url, key="k")

    lf.sink_parquet(target("polars"), storage_options=so)
    lf.sink_parquet(target("shoal"), storage_options=so, engine=_engine(runner))
    names = _listing(client, f"{base}/polars/")
    assert names and _listing(client, f"{base}/shoal/") == names
    assert not [k for k in _listing(client, f"{base}/") if "staging" in k]  # cleaned up
    for name in names:
        theirs = pl.read_parquet(f"s3://{BUCKET}/{base}/polars/{name}", storage_options=so)
        ours = pl.read_parquet(f"s3://{BUCKET}/{base}/shoal/{name}", storage_options=so)
        assert_frame_equal(ours, theirs)


def test_sink_to_a_missing_bucket_fails_before_any_task(s3: dict[str, Any]) -> None:
    lf = _queries(s3["options"])["flat"]
    url = "s3://no-such-bucket/out.parquet"
    with pytest.raises(FileNotFoundError, match="no-such-bucket") as info:
        lf.sink_parquet(url, storage_options=s3["options"], engine=_engine("local"))
    _grep_secret(str(info.value))


def test_duckdb_read_parquet_from_the_bucket(
    s3: dict[str, Any], runner: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB's httpfs is not installed here, so DuckDB's own ``SET s3_...`` and secrets
    cannot be stated; credentials come from the environment. The answer is native DuckDB
    reading the same files locally."""
    import duckdb

    so = s3["options"]
    for var, key in (
        ("AWS_ENDPOINT_URL", "aws_endpoint_url"),
        ("AWS_ACCESS_KEY_ID", "aws_access_key_id"),
        ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
        ("AWS_REGION", "aws_region"),
        ("AWS_ALLOW_HTTP", "aws_allow_http"),
    ):
        monkeypatch.setenv(var, so[key])
    storage._FILESYSTEMS.clear()  # an earlier S3FileSystem() read another environment
    local = tmp_path / "flat"
    local.mkdir()
    for i in range(4):
        s3["client"].download_file(
            BUCKET, f"flat/part-{i}.parquet", str(local / f"part-{i}.parquet")
        )
    query = (
        "SELECT s, count(*) AS n, sum(a) AS sa, sum(x) AS sx FROM read_parquet('{}') "
        "WHERE a > 105 GROUP BY s ORDER BY s NULLS FIRST"
    )
    con = duckdb.connect()
    expected = con.sql(query.format(f"{local}/*.parquet")).pl()
    cfg = shoal.Config(runner=runner, default_partitions=3, shuffle_partitions=3)  # type: ignore[arg-type]
    got = shoal.duckdb.sql(
        con, query.format(f"s3://{BUCKET}/flat/*.parquet"), config=cfg, raise_on_fail=True
    )
    assert_frame_equal(got.pl(), expected)
    _grep_secret(shoal.duckdb.explain(con, query.format(f"s3://{BUCKET}/flat/*.parquet")))


def test_own_credential_provider_falls_back_with_reason(s3: dict[str, Any]) -> None:
    so = s3["options"]

    def provider() -> tuple[dict[str, str], None]:
        return {"aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET}, None

    lf = pl.scan_parquet(
        f"s3://{BUCKET}/flat/part-0.parquet",
        storage_options={k: v for k, v in so.items() if "secret" not in k and "key" not in k},
        credential_provider=provider,
    )
    with pytest.raises(shoal.UnsupportedError, match="credential_provider") as info:
        lf.collect(engine=_engine("local"))
    _grep_secret(str(info.value))


def test_hive_scan_prunes_row_groups_with_file_columns(s3: dict[str, Any]) -> None:
    client = s3["client"]
    for k in (1, 2):
        df = pl.DataFrame({"v": list(range(k * 100, k * 100 + 30)), "w": ["a"] * 30})
        _put(client, f"hive2/k={k}/f.parquet", df, row_group_size=10)
    lf = pl.scan_parquet(
        f"s3://{BUCKET}/hive2/**/*.parquet", storage_options=s3["options"], hive_partitioning=True
    ).filter((pl.col("v") >= 215) & (pl.col("k") >= 1) & (pl.col("w") == "a"))
    text = shoal.explain(lf, runner="local", config=shoal.Config(runner="local"))
    assert "Parquet row groups: 2 of 6 read, 4 pruned by statistics" in text
    assert_frame_equal(lf.collect(engine=_engine("local")), lf.collect(engine="in-memory"))


@pytest.mark.parametrize(
    "pred",
    [
        pl.col("i") > 25,
        pl.col("i") >= 40,
        pl.col("i") < 25,
        pl.col("i") == 17,
        pl.col("f") > 2.0,
        pl.col("f") >= 100.0,
        pl.col("f") < 0.0,
        pl.col("f") <= -0.0,
        pl.col("f") == 0.0,
        pl.col("s") == "b",
        pl.col("s") > "c",
        pl.col("d") >= pl.date(2026, 1, 25),
        pl.col("n") > 0,
        (pl.col("i") > 5) & (pl.col("s") < "b"),
        (pl.col("i") > 35) | (pl.col("i") < 3),
    ],
    ids=str,
)
def test_pruning_rules_keep_polars_answers_on_local_files(tmp_path: Path, pred: pl.Expr) -> None:
    """Pruning applies to every Parquet scan: on local files with nulls, NaN, -0.0, a
    row group of nulls only, strings and dates, shoal's answer is native Polars'."""
    import datetime

    n = 40
    df = pl.DataFrame(
        {
            "i": list(range(n)),
            "f": [float("nan") if j in (3, 33) else -0.0 if j == 12 else 0.0 if j == 25
                  else None if j % 9 == 0 else j / 10 for j in range(n)],
            "s": [["a", "b", "c", "d"][j // 10] if j % 7 else None for j in range(n)],
            "d": [datetime.date(2026, 1, 1) + datetime.timedelta(days=j) for j in range(n)],
            "n": [None if j < 10 else j for j in range(n)],
        },
        schema={"i": pl.Int64, "f": pl.Float64, "s": pl.String, "d": pl.Date, "n": pl.Int32},
    )  # fmt: skip
    path = tmp_path / "t.parquet"
    df.write_parquet(path, row_group_size=10)
    lf = pl.scan_parquet(path).filter(pred)
    expected = lf.collect(engine="in-memory")
    assert_frame_equal(lf.collect(engine=_engine("local")), expected)
