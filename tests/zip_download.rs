//! `GET /api/v1/zip`: several finished files as one zip, as curl and Python's `zipfile` see it —
//! every member sha256-exact, a resumed (ranged) download equal to the whole byte for byte, the
//! same bytes on every request, `If-Range` with a stale ETag answered with the whole zip, and
//! clear problems for ids that are unknown, someone else's, unfinished, repeated or too many.
//! Runs on S3 blobs too (`FERRY_TEST_BLOBS=s3`).

mod common;
use common::*;

use std::collections::BTreeMap;
use std::process::Command;

const ALICE: &str = "fy_alice_zip_token";
const BOB: &str = "fy_bob_zip_token";

fn two_principals(dir: &std::path::Path) -> Server {
    let cfg = write_file(
        dir,
        "ferry.toml",
        &format!(
            "[[tokens]]\nprincipal = \"alice\"\nsha256 = \"{}\"\n\n[[tokens]]\nprincipal = \"bob\"\nsha256 = \"{}\"\n",
            sha256_hex(ALICE.as_bytes()),
            sha256_hex(BOB.as_bytes())
        ),
    );
    Server::start(&["--config", cfg.to_str().unwrap()])
}

/// `curl ARGS… URL` with alice's token; its status must be 0.
fn curl(url: &str, args: &[&str]) {
    let out = loopback_command("curl")
        .args(["-sS", "--fail", "-H", &format!("Authorization: Bearer {ALICE}")])
        .args(args)
        .arg(url)
        .output()
        .expect("curl runs");
    assert!(out.status.success(), "curl {args:?} {url}: {}", String::from_utf8_lossy(&out.stderr));
}

/// What Python's `zipfile` reads from the zip at `path`: `testzip()` (the first member whose
/// CRC-32 does not match, or None), each member's name → sha256, and each member's flag bits.
fn python_reads(path: &std::path::Path) -> serde_json::Value {
    let script = "import hashlib, json, sys, zipfile\n\
        z = zipfile.ZipFile(sys.argv[1])\n\
        print(json.dumps({'bad': z.testzip(), \
        'members': {i.filename: hashlib.sha256(z.read(i)).hexdigest() for i in z.infolist()}, \
        'order': [i.filename for i in z.infolist()], 'flags': [i.flag_bits for i in z.infolist()], \
        'stored': all(i.compress_type == 0 for i in z.infolist())}))\n";
    let out = Command::new(python_bin()).arg("-c").arg(script).arg(path).output().expect("python runs");
    assert!(out.status.success(), "python zipfile: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

#[tokio::test]
async fn three_files_download_as_one_resumable_zip() {
    let tmp = tempfile::tempdir().unwrap();
    let server = two_principals(tmp.path());
    let alice = Api::with_token(&server, ALICE);
    let bob = Api::with_token(&server, BOB);
    let big = pseudo_random(3 << 20, 51);
    let small = b"hello from a small file\n".to_vec();
    let other = pseudo_random(200_001, 52);
    let a = alice.upload(&big, "photos/holiday.jpg").await;
    let b = alice.upload(&small, "notes.txt").await;
    let c = alice.upload(&other, "holiday.jpg").await;
    let url = server.url(&format!("/api/v1/zip?files={a},{b},{c}&name=trip"));

    // First a ranged request from the middle of the first member, before any whole download:
    // its descriptor and the central directory need CRC-32s nobody has computed yet.
    let from = 1_000_000u64;
    let r = alice.send("GET", &url, &[("range", &format!("bytes={from}-"))], None).await;
    assert_eq!(r.status(), 206);
    let total: u64 = header(&r, "content-range").unwrap().rsplit('/').next().unwrap().parse().unwrap();
    let etag = header(&r, "etag").unwrap().to_string();
    let tail_first = r.bytes().await.unwrap();

    // The whole zip with curl.
    let zip_path = tmp.path().join("trip.zip");
    curl(&url, &["-o", zip_path.to_str().unwrap(), "-D", tmp.path().join("h").to_str().unwrap()]);
    let whole = std::fs::read(&zip_path).unwrap();
    assert_eq!(whole.len() as u64, total, "Content-Range's length is the zip's");
    assert_eq!(&whole[from as usize..], &tail_first[..], "a range served before any CRC-32 was kept is the same bytes");
    let head = std::fs::read_to_string(tmp.path().join("h")).unwrap().to_ascii_lowercase();
    for line in [
        "content-type: application/zip",
        "accept-ranges: bytes",
        "content-disposition: attachment; filename=\"trip.zip\"",
        &format!("content-length: {total}"),
    ] {
        assert!(head.contains(line), "{line} in {head}");
    }

    let read = python_reads(&zip_path);
    assert_eq!(read["bad"], serde_json::Value::Null, "every CRC-32 matches");
    assert_eq!(read["stored"], true);
    assert_eq!(read["order"], serde_json::json!(["holiday.jpg", "notes.txt", "holiday (2).jpg"]), "names: last segment, unique");
    let members: BTreeMap<String, String> = serde_json::from_value(read["members"].clone()).unwrap();
    let want: BTreeMap<String, String> = [("holiday.jpg", &big), ("notes.txt", &small), ("holiday (2).jpg", &other)]
        .into_iter()
        .map(|(n, d)| (n.to_string(), sha256_hex(d)))
        .collect();
    assert_eq!(members, want, "every member is sha256-exact");
    for flags in read["flags"].as_array().unwrap() {
        assert_eq!(flags.as_u64().unwrap() & 0x0808, 0x0808, "data descriptor and UTF-8 name flags");
    }

    // A download cut off half-way and resumed by curl (`-C -`: Range from what it has).
    let part = tmp.path().join("part.zip");
    std::fs::write(&part, &whole[..whole.len() / 2]).unwrap();
    curl(&url, &["-C", "-", "-o", part.to_str().unwrap()]);
    assert_eq!(std::fs::read(&part).unwrap(), whole, "the resumed download equals the whole, byte for byte");

    // The same bytes and the same ETag on every request.
    let r = alice.send("GET", &url, &[], None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "etag"), Some(etag.as_str()));
    assert_eq!(&r.bytes().await.unwrap()[..], &whole[..], "the same bytes every time");

    // Ranges anywhere: in a header, across member boundaries, inside the central directory.
    for (s, e) in [(0, 10), (29, 3_300_000), (total - 30, total - 1), (3_145_700, 3_146_000)] {
        let r = alice.send("GET", &url, &[("range", &format!("bytes={s}-{e}"))], None).await;
        assert_eq!(r.status(), 206, "{s}-{e}");
        assert_eq!(header(&r, "content-range"), Some(format!("bytes {s}-{e}/{total}").as_str()));
        assert_eq!(&r.bytes().await.unwrap()[..], &whole[s as usize..=e as usize], "{s}-{e}");
    }

    // If-Range: the current ETag gets the range, a stale one the whole zip.
    let r = alice.send("GET", &url, &[("range", "bytes=100-"), ("if-range", &etag)], None).await;
    assert_eq!(r.status(), 206);
    assert_eq!(&r.bytes().await.unwrap()[..], &whole[100..]);
    let r = alice.send("GET", &url, &[("range", "bytes=100-"), ("if-range", "\"zip-stale\"")], None).await;
    assert_eq!(r.status(), 200, "a stale If-Range gets the whole zip");
    assert_eq!(&r.bytes().await.unwrap()[..], &whole[..]);
    let r = alice.send("GET", &url, &[("if-none-match", &etag)], None).await;
    assert_eq!(r.status(), 304);
    let r = alice.send("GET", &url, &[("range", &format!("bytes={total}-"))], None).await;
    assert_eq!(header(&r, "content-range"), Some(format!("bytes */{total}").as_str()));
    problem(r, 416, "invalid_argument").await;

    // Another order is another zip: other bytes, another ETag.
    let r = alice.get(&format!("/api/v1/zip?files={c},{b},{a}")).await;
    assert_eq!(r.status(), 200);
    assert_ne!(header(&r, "etag"), Some(etag.as_str()));
    assert_eq!(header(&r, "content-disposition"), Some("attachment; filename=\"files.zip\""));

    // Refusals, each clear before a byte is sent.
    let unfinished = alice.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "10")], None).await;
    let unfinished = header(&unfinished, "location").unwrap().rsplit('/').next().unwrap().to_string();
    let p = problem(alice.get(&format!("/api/v1/zip?files={a},{unfinished}")).await, 409, "upload_incomplete").await;
    assert!(p["detail"].as_str().unwrap().contains(&unfinished), "{p}");
    let p = problem(alice.get(&format!("/api/v1/zip?files={a},nosuchfile,{b}")).await, 404, "not_found").await;
    assert!(p["detail"].as_str().unwrap().contains("nosuchfile"), "{p}");
    problem(bob.get(&format!("/api/v1/zip?files={a}")).await, 404, "not_found").await;
    problem(alice.get(&format!("/api/v1/zip?files={a},{a}")).await, 422, "invalid_argument").await;
    problem(alice.get("/api/v1/zip?files=").await, 400, "invalid_argument").await;
    problem(alice.get(&format!("/api/v1/zip?files={a},,{b}")).await, 400, "invalid_argument").await;
    problem(alice.get("/api/v1/zip").await, 400, "invalid_argument").await;
    problem(alice.get(&format!("/api/v1/zip?files={a}&level=9")).await, 400, "invalid_argument").await;
    let many: Vec<String> = (0..1001).map(|i| format!("id{i}")).collect();
    let p = problem(alice.get(&format!("/api/v1/zip?files={}", many.join(","))).await, 400, "invalid_argument").await;
    assert!(p["detail"].as_str().unwrap().contains("1000"), "{p}");
    let r = Api::new(&server).get(&format!("/api/v1/zip?files={a}")).await;
    assert_eq!(r.status(), 401, "a token is needed");
}

/// A zip of one empty file and one of a few bytes: the smallest members still read back.
#[tokio::test]
async fn empty_members_and_names_without_extension() {
    let server = Server::start(&[]);
    let api = Api::new(&server);
    let e = api.upload(b"", "empty").await;
    let f = api.upload(b"x", "").await;
    let r = api.get(&format!("/api/v1/zip?files={e},{f}&name=two.ZIP")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-disposition"), Some("attachment; filename=\"two.ZIP\""));
    let bytes = r.bytes().await.unwrap().to_vec();
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let names: Vec<String> = (0..z.len()).map(|i| z.by_index(i).unwrap().name().unwrap().to_string()).collect();
    assert_eq!(names, ["empty", f.as_str()], "a file without a name is named by its id");
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut z.by_index(1).unwrap(), &mut got).unwrap();
    assert_eq!(got, b"x");
}
