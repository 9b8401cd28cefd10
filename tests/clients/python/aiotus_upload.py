#!/usr/bin/env python3
"""Upload a file to ferry with the real aiotus client (asyncio; run by tests/interop_python.rs).

    python aiotus_upload.py SERVER_BASE FILE [--chunk-size N]

Prints {"url": ...} as JSON on success and exits non-zero on any error.
"""
import argparse
import asyncio
import json
import os
import sys

import aiotus


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("server")
    ap.add_argument("file")
    ap.add_argument("--chunk-size", type=int, default=4 * 1024 * 1024)
    a = ap.parse_args()
    endpoint = a.server.rstrip("/") + "/files/"
    # No silent retries: any server error fails the test.
    config = aiotus.RetryConfiguration(retry_attempts=1, max_retry_period_seconds=1.0)
    with open(a.file, "rb") as f:
        url = await aiotus.upload(
            endpoint,
            f,
            {"filename": os.path.basename(a.file).encode()},
            config=config,
            chunksize=a.chunk_size,
        )
    if url is None:
        raise SystemExit("aiotus.upload returned None (the upload failed)")
    print(json.dumps({"url": str(url)}), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except Exception as e:  # noqa: BLE001 - report everything, exit non-zero
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
