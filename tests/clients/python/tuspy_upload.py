#!/usr/bin/env python3
"""Upload a file to ferry with the real tuspy client (run by tests/real_clients.rs).

    python tuspy_upload.py SERVER_BASE FILE [--chunk-size N] [--no-checksum] [--async]
                                            [--resume-after CHUNKS] [--corrupt-checksum]

Prints {"url": ...} as JSON on success and exits non-zero on any error.

--resume-after K uploads K chunks, drops the uploader, then resumes with a *new* uploader
that finds the URL in a tusclient FileStorage (store_url=True) and asks the server for the
offset (HEAD) before continuing; asserts the resume did not restart from 0.

--corrupt-checksum makes tuspy send a wrong sha1 Upload-Checksum: the server must refuse the
first chunk with 460 and keep the offset at 0 (checked with HEAD); then prints
{"url": ..., "rejected_status": 460, "offset_after": 0}.
"""
import argparse
import asyncio
import hashlib
import json
import os
import sys
import tempfile

import requests
from tusclient import client as tus_client
from tusclient.exceptions import TusUploadFailed
from tusclient.uploader import baseuploader
from tusclient.storage import filestorage


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("server")
    ap.add_argument("file")
    ap.add_argument("--chunk-size", type=int, default=256 * 1024)
    ap.add_argument("--no-checksum", action="store_true")
    ap.add_argument("--async", dest="use_async", action="store_true")
    ap.add_argument("--resume-after", type=int, default=0, metavar="CHUNKS")
    ap.add_argument("--corrupt-checksum", action="store_true")
    a = ap.parse_args()

    endpoint = a.server.rstrip("/") + "/files/"
    tus = tus_client.TusClient(endpoint)
    size = os.path.getsize(a.file)
    common = dict(
        file_path=a.file,
        chunk_size=a.chunk_size,
        upload_checksum=not a.no_checksum,
        metadata={"filename": os.path.basename(a.file)},
        retries=0,  # no silent retries: any server error fails the test
    )
    out = {}

    if a.corrupt_checksum:
        # tuspy hashes with CHECKSUM_ALGORITHM_PAIR[1](chunk): swap in a sha1 of other bytes.
        baseuploader.BaseUploader.CHECKSUM_ALGORITHM_PAIR = (
            "sha1",
            lambda data=b"": hashlib.sha1(bytes(data) + b"corrupt"),
        )
        up = tus.uploader(**{**common, "upload_checksum": True})
        try:
            up.upload()
        except TusUploadFailed as e:
            status = e.status_code
        else:
            raise SystemExit("the server accepted a chunk with a wrong Upload-Checksum")
        head = requests.head(up.url, headers={"Tus-Resumable": "1.0.0"})
        off = int(head.headers.get("Upload-Offset", "-1"))
        print(json.dumps({"url": up.url, "rejected_status": status, "offset_after": off}), flush=True)
        return 0

    if a.use_async:
        up = tus.async_uploader(**common)
        asyncio.run(up.upload())
    elif a.resume_after:
        with tempfile.TemporaryDirectory(prefix="ferry-tuspy-") as tmp:
            storage = filestorage.FileStorage(os.path.join(tmp, "urls.json"))
            first = tus.uploader(store_url=True, url_storage=storage, **common)
            for _ in range(a.resume_after):
                first.upload_chunk()
            kept = first.offset
            if not 0 < kept < size:
                raise SystemExit(f"after {a.resume_after} chunks the offset is {kept} (size {size})")
            # A new uploader for the same file: finds the stored URL, HEADs the offset.
            up = tus.uploader(store_url=True, url_storage=storage, **common)
            if up.url != first.url:
                raise SystemExit(f"resume got URL {up.url}, expected {first.url}")
            if up.offset != kept:
                raise SystemExit(f"resume starts at offset {up.offset}, server had {kept}")
            up.upload()
            storage.close()
            out.update(resumed_from=kept)
    else:
        up = tus.uploader(**common)
        up.upload()

    if up.offset != size:
        raise SystemExit(f"final offset {up.offset} != size {size}")
    out["url"] = up.url
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - report everything, exit non-zero
        body = getattr(e, "response_content", None)
        print(f"FAILED: {type(e).__name__}: {e}" + (f" body={body!r}" if body else ""), file=sys.stderr)
        sys.exit(1)
