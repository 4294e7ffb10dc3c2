"""``rollout export``: the stored token trajectories a key owns, out to JSONL or Parquet, for
trainers (EXPORT-5). A client of ``GET /v1/responses/tokens/export`` (EXPORT-1): pages are
fetched one at a time and written as they come, so memory holds one page, never the export."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import IO, Any, Protocol

import aiohttp
import msgspec

from clients.exceptions import ApiError
from clients.wire import http_url

PAGE = 100  # the server's largest page (EXPORT-1)
FORMATS = ("jsonl", "parquet")


class RowWriter(Protocol):
    def write(self, rows: list[dict[str, Any]]) -> None: ...
    def close(self) -> None: ...


class JsonlWriter:
    """One ``response.tokens`` object per line, exactly as the server sent it."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._encoder = msgspec.json.Encoder()

    def write(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._out.write(self._encoder.encode(row) + b"\n")

    def close(self) -> None:
        self._out.flush()
        if self._out is not sys.stdout.buffer:
            self._out.close()


class ParquetWriter:
    """One Parquet row group per page, columns named as the JSONL fields (EXPORT-5)."""

    def __init__(self, path: Path) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            needs = "rollout export --format parquet needs pyarrow: pip install '.[export]'"
            raise SystemExit(needs) from None
        self._pa = pa
        sample = pa.struct(
            [("start", pa.int64()), ("end", pa.int64()), ("finish_reason", pa.string())]
        )
        self._schema = pa.schema(
            [
                ("id", pa.string()),
                ("previous_response_id", pa.string()),
                ("model", pa.string()),
                ("weights", pa.string()),
                ("prompt_tokens", pa.int64()),
                ("token_ids", pa.list_(pa.int64())),
                ("sampled", pa.list_(pa.bool_())),
                ("logprobs", pa.list_(pa.float64())),
                ("samples", pa.list_(sample)),
            ]
        )
        self._writer = pq.ParquetWriter(str(path), self._schema)

    def write(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            columns = {name: [row.get(name) for row in rows] for name in self._schema.names}
            self._writer.write_table(self._pa.table(columns, schema=self._schema))

    def close(self) -> None:
        self._writer.close()  # an export of nothing is still a readable file with the schema


def export_url(base_url: str) -> str:
    return http_url(base_url) + "/tokens/export"


async def export(url: str, key: str | None, writer: RowWriter) -> int:
    """Every page, in order; a row already written (Redis' ``SCAN`` may list a key twice,
    EXPORT-2) is not written again. The number of rows written."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    seen: set[str] = set()
    after: str | None = ""
    try:
        async with aiohttp.ClientSession(headers=headers) as session:
            while after is not None:
                params = {"limit": str(PAGE), **({"after": after} if after else {})}
                async with session.get(export_url(url), params=params) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise _api_error(resp.status, body)
                page = msgspec.json.decode(body)
                rows = [row for row in page["data"] if row["id"] not in seen]
                seen.update(row["id"] for row in rows)
                writer.write(rows)
                after = page["next"]
    finally:
        writer.close()  # what was written so far stays readable
    return len(seen)


def _api_error(status: int, body: bytes) -> ApiError:
    try:
        error = msgspec.json.decode(body)["error"]
    except (msgspec.DecodeError, KeyError, TypeError):
        return ApiError(status, None, body[:200].decode(errors="replace"), None, "server_error")
    return ApiError(status, error.get("code"), error["message"], error.get("param"), error["type"])


def add_export_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write stored token trajectories (JSONL or Parquet)")
    p.add_argument("--url", default="http://127.0.0.1:8000/v1")
    p.add_argument(
        "--key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="API key (default $OPENAI_API_KEY); an operator key exports every key's",
    )
    p.add_argument("--format", choices=FORMATS, default="jsonl")
    p.add_argument("--out", default="-", help="file to write; '-' = stdout (jsonl only)")


def run_export(args: argparse.Namespace) -> int:
    if args.format == "parquet" and args.out == "-":
        raise SystemExit("rollout export --format parquet needs --out FILE")
    writer: RowWriter
    if args.format == "parquet":
        writer = ParquetWriter(Path(args.out))
    elif args.out == "-":
        writer = JsonlWriter(sys.stdout.buffer)
    else:
        writer = JsonlWriter(open(args.out, "wb"))  # noqa: SIM115 - closed by the writer
    try:
        count = asyncio.run(export(args.url, args.key, writer))
    except ApiError as exc:
        print(f"rollout export: {exc}", file=sys.stderr)
        return 1
    print(f"rollout export: {count} trajectories", file=sys.stderr)
    return 0
