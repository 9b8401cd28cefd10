//! Criterion benches of ferry's hot paths (issue 6, item 2):
//!
//! - `headers/*`: ferry-tus header parsing and the PATCH decision, per request;
//! - `pipeline/*`: the upload hash + write pipeline — 64 MiB in 256 KiB `Bytes` (hyper's frame
//!   size order) through `RunningSha256` and an `FsBlobStore` writer, as `Appender::write`
//!   does, with a final sync; against the sha256 alone (the CPU floor) and the writer alone.
//!   `relaxed` skips fsync (CPU work and page-cache copies only); `durable` fsyncs at the end;
//! - `read/*`: `FsBlobStore::read` of a whole 64 MiB blob and of 1 MiB ranges at
//!   pseudo-random offsets (the download path without HTTP).
//!
//! Run:
//!
//!     cargo bench --bench hot_paths                 # all
//!     cargo bench --bench hot_paths -- pipeline     # a group
//!
//! Files live in a temp dir under `target/` (same filesystem as the checkout). Throughput is
//! reported in bytes, so criterion prints MiB/s (GiB/s).

#[path = "support/mod.rs"]
mod support;
use std::hint::black_box;
use std::time::Duration;
use support::pseudo_random;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ferry::blob::{BlobState, BlobStore, FsBlobStore};
use ferry::upload::hash::RunningSha256;
use futures::TryStreamExt;

const MIB: usize = 1 << 20;
const FRAME: usize = 256 << 10;
const PIPE: usize = 64 * MIB;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn tmpdir() -> tempfile::TempDir {
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&base).expect("target dir");
    tempfile::Builder::new().prefix("hot-paths").tempdir_in(base).expect("temp dir")
}

fn headers(c: &mut Criterion) {
    use ferry_tus::{PatchHeaders, UploadChecksum, UploadMetadata, UploadOffset, UploadState};
    let mut g = c.benchmark_group("headers");
    let md = "filename d29ybGRfZG9taW5hdGlvbl9wbGFuLnBkZg==,filetype YXBwbGljYXRpb24vcGRm,relativePath bnVsbA==,empty";
    g.bench_function("upload_metadata_parse", |b| b.iter(|| black_box(md).parse::<UploadMetadata>().expect("metadata")));
    let parsed: UploadMetadata = md.parse().expect("metadata");
    g.bench_function("upload_metadata_render", |b| b.iter(|| black_box(&parsed).to_string()));
    g.bench_function("upload_offset_parse", |b| b.iter(|| black_box("1073741824").parse::<UploadOffset>().expect("offset")));
    let ck = "sha256 n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=";
    g.bench_function("upload_checksum_parse", |b| b.iter(|| black_box(ck).parse::<UploadChecksum>().expect("checksum")));
    let state = UploadState { offset: 8 << 20, length: Some(1 << 30), is_final: false };
    let h = PatchHeaders {
        content_type: Some("application/offset+octet-stream"),
        upload_offset: Some("8388608"),
        upload_checksum: Some(ck),
        content_length: Some("8388608"),
        ..Default::default()
    };
    g.bench_function("plan_patch", |b| b.iter(|| ferry_tus::plan_patch(black_box(&state), black_box(&h), 1 << 40).expect("plan")));
    g.finish();
}

fn pipeline(c: &mut Criterion) {
    let rt = rt();
    let dir = tmpdir();
    let data = Bytes::from(pseudo_random(PIPE, 7));
    let frames: Vec<Bytes> = (0..PIPE / FRAME).map(|i| data.slice(i * FRAME..(i + 1) * FRAME)).collect();
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Bytes(PIPE as u64)).sample_size(10).measurement_time(Duration::from_secs(8));
    g.bench_function("sha256_only", |b| {
        b.iter(|| {
            let mut h = RunningSha256::new();
            for f in &frames {
                h.update(f);
            }
            h.digest()
        })
    });
    for (name, durable, hash) in [("write_relaxed", false, false), ("hash_write_relaxed", false, true), ("hash_write_durable", true, true)] {
        let store = FsBlobStore::open(&dir.path().join(name), durable).expect("store");
        let mut n = 0u64;
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    let id = format!("bench{name}{n}").replace('_', "");
                    rt.block_on(store.create(&id)).expect("create");
                    id
                },
                |id| {
                    rt.block_on(async {
                        let mut h = RunningSha256::new();
                        let mut w = store.open_writer(&id, 0, &BlobState::default()).await.expect("writer");
                        for f in &frames {
                            if hash {
                                h.update(f);
                            }
                            w.write(f.clone()).await.expect("write");
                        }
                        w.sync().await.expect("sync");
                        drop(w);
                        store.delete(&ferry::blob::Unreferenced::vouched(id.as_str())).await.expect("delete");
                        h.digest()
                    })
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn reads(c: &mut Criterion) {
    let rt = rt();
    let dir = tmpdir();
    let store = FsBlobStore::open(dir.path(), false).expect("store");
    let data = Bytes::from(pseudo_random(PIPE, 11));
    rt.block_on(async {
        store.create("benchread").await.expect("create");
        let mut w = store.open_writer("benchread", 0, &BlobState::default()).await.expect("writer");
        w.write(data.clone()).await.expect("write");
        w.sync().await.expect("sync");
    });
    let read_all = |range: std::ops::Range<u64>| {
        rt.block_on(async {
            let mut s = store.read("benchread", range).await.expect("read");
            let mut n = 0usize;
            while let Some(chunk) = s.try_next().await.expect("chunk") {
                n += black_box(chunk).len();
            }
            n
        })
    };
    let mut g = c.benchmark_group("read");
    g.throughput(Throughput::Bytes(PIPE as u64)).sample_size(20);
    g.bench_function("whole_64MiB", |b| b.iter(|| assert_eq!(read_all(0..PIPE as u64), PIPE)));
    g.throughput(Throughput::Bytes(MIB as u64)).sample_size(50);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    g.bench_function("range_1MiB_random", |b| {
        b.iter(|| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let start = x % (PIPE - MIB) as u64;
            assert_eq!(read_all(start..start + MIB as u64), MIB)
        })
    });
    g.finish();
}

criterion_group!(benches, headers, pipeline, reads);
criterion_main!(benches);
