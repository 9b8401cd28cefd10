//! ferry on S3 (a local moto server), measured in the same run:
//!
//! 1. **One upload through ferry vs the same bytes written directly**: `BENCH_S3_BYTES` (default
//!    1 GiB) as one TUS upload in 8 MiB PATCHes to `ferry serve --blobs s3://…` (SQLite catalog,
//!    fsync on), against the same bytes put with `object_store`'s `MultipartStore` directly in
//!    5 MiB parts (ferry's first part size), one part in flight. Ratio: ferry / direct throughput.
//! 2. **Three replicas vs one**: `BENCH_S3_UPLOADS` (default 64) concurrent uploads of
//!    `BENCH_S3_UPLOAD_BYTES` (default 16 MiB) each, spread round-robin over three `ferry serve`
//!    on one PostgreSQL database and one bucket, against the same uploads to one of them alone.
//!    Aggregate MiB/s. moto is one Python process: on this machine it is likely the ceiling, and
//!    the ratio says so rather than how ferry scales on real S3.
//!
//! Needs `moto_server` in tests/clients/python/.venv and PostgreSQL (`FERRY_TEST_PG`, default the
//! role `.ci/run` creates). Run: `cargo bench --bench s3`. Results go to stdout;
//! benches/RESULTS.md keeps a copy.

#[path = "../tests/common/moto.rs"]
mod moto;
#[path = "support/replicas.rs"]
mod support;

use std::process::Child;
use std::time::Instant;

use object_store::aws::AmazonS3Builder;
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjectPath;
use object_store::PutPayload;
use support::{client, create_db, drop_db, env_u64, start_server, stop};

const MIB: u64 = 1 << 20;

/// One TUS upload of `len` bytes of `fill` in 8 MiB PATCHes; returns its seconds.
async fn tus_upload(c: &reqwest::Client, base: &str, len: u64, fill: u8) -> f64 {
    let r = c.post(format!("{base}/files/")).header("Tus-Resumable", "1.0.0").header("Upload-Length", len.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let url = if loc.starts_with("http") { loc } else { format!("{base}{loc}") };
    let chunk = bytes::Bytes::from(vec![fill; (8 * MIB) as usize]);
    let t0 = Instant::now();
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(chunk.len() as u64) as usize;
        let r = c
            .patch(&url)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", "application/offset+octet-stream")
            .header("Upload-Offset", off.to_string())
            .body(chunk.slice(..n))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{}", r.text().await.unwrap_or_default());
        off += n as u64;
    }
    t0.elapsed().as_secs_f64()
}

/// The same bytes through `MultipartStore` directly, 5 MiB parts, one in flight; seconds.
async fn direct_upload(endpoint: &str, bucket: &str, len: u64) -> f64 {
    let s3 = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .with_region("us-east-1")
        .build()
        .unwrap();
    let path = ObjectPath::from("direct/object");
    let part = bytes::Bytes::from(vec![0x5Au8; (5 * MIB) as usize]);
    let t0 = Instant::now();
    let id = s3.create_multipart(&path).await.unwrap();
    let mut parts = Vec::new();
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(part.len() as u64) as usize;
        parts.push(s3.put_part(&path, &id, parts.len(), PutPayload::from(part.slice(..n))).await.unwrap());
        off += n as u64;
    }
    s3.complete_multipart(&path, &id, parts).await.unwrap();
    t0.elapsed().as_secs_f64()
}

/// `n` concurrent uploads of `each` bytes spread round-robin over `bases`; aggregate MiB/s.
async fn concurrent_uploads(bases: &[String], n: usize, each: u64) -> f64 {
    let c = client();
    let t0 = Instant::now();
    let jobs: Vec<_> = (0..n)
        .map(|i| {
            let (c, base) = (c.clone(), bases[i % bases.len()].clone());
            tokio::spawn(async move { tus_upload(&c, &base, each, i as u8).await })
        })
        .collect();
    for j in jobs {
        j.await.unwrap();
    }
    (n as u64 * each) as f64 / MIB as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let bytes = env_u64("BENCH_S3_BYTES", 1 << 30);
        let uploads = env_u64("BENCH_S3_UPLOADS", 64) as usize;
        let each = env_u64("BENCH_S3_UPLOAD_BYTES", 16 * MIB);
        let tmp = tempfile::tempdir().unwrap();
        let mib = bytes as f64 / MIB as f64;

        // 1. ferry vs object_store directly, one moto each so neither pays for the other's memory.
        let m = moto::Moto::start("direct", 5 * MIB).await;
        let direct = direct_upload(&m.endpoint, "direct", bytes).await;
        drop(m);
        let m = moto::Moto::start("ferry", 5 * MIB).await;
        let (srv, base) = start_server(&tmp.path().join("one"), &["--blobs", "s3://ferry/bench"], &m.env());
        let through = tus_upload(&client(), &base, bytes, 0x5A).await;
        stop(srv);
        drop(m);
        println!("## One upload of {mib:.0} MiB to S3 (moto): through ferry vs object_store directly\n");
        println!("| path | seconds | MiB/s |\n| --- | --- | --- |");
        println!("| object_store MultipartStore, 5 MiB parts | {direct:.2} | {:.0} |", mib / direct);
        println!("| ferry, TUS PATCHes of 8 MiB, SQLite catalog | {through:.2} | {:.0} |", mib / through);
        println!("\nratio throughput ferry / direct: {:.2}\n", direct / through);

        // 2. three replicas vs one, PostgreSQL + one bucket.
        let m = moto::Moto::start("replicas", 5 * MIB).await;
        let (db, url) = create_db().await;
        let args = ["--catalog", url.as_str(), "--blobs", "s3://replicas/bench"];
        let servers: Vec<(Child, String)> = (0..3).map(|i| start_server(&tmp.path().join(format!("r{i}")), &args, &m.env())).collect();
        let bases: Vec<String> = servers.iter().map(|(_, b)| b.clone()).collect();
        let one = concurrent_uploads(&bases[..1], uploads, each).await;
        let three = concurrent_uploads(&bases, uploads, each).await;
        for (c, _) in servers {
            stop(c);
        }
        drop_db(&db).await;
        println!("## {uploads} concurrent uploads of {} MiB, PostgreSQL catalog, one bucket\n", each / MIB);
        println!("| replicas | aggregate MiB/s |\n| --- | --- |");
        println!("| 1 | {one:.0} |\n| 3 (round-robin) | {three:.0} |");
        println!("\nratio three / one: {:.2}", three / one);
    });
}
