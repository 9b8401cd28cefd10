//! Links kept by the server (issue 51) over HTTP, against the real binary: a share of three
//! files with a message and a one-time limit serves once (the grant covers the other files and
//! a Range resume) and then says it is used; a passphrase refuses a wrong one, slows repeated
//! tries (429 + Retry-After) and opens with the right one; a request for several files takes
//! each through TUS on `/l/{id}/files`, sha256-exact, owned by the link's principal, its
//! events naming the link, and refuses a file past its count; revoking stops a download and an
//! upload in progress at once. The pages themselves are driven in Chromium by web_links.rs.

mod common;
use common::*;

/// `POST /api/v1/links` with `body`, expecting 201.
async fn make(api: &Api, body: serde_json::Value) -> serde_json::Value {
    let r = api.post("/api/v1/links", &body.to_string()).await;
    assert_eq!(r.status(), 201, "create link {body}");
    json(r).await
}

/// A client that keeps the cookies it is given, as a browser does (for the links' grants).
#[derive(Default)]
struct Browser {
    cookies: std::sync::Mutex<Vec<String>>,
}

impl Browser {
    async fn send(&self, method: &str, url: String, headers: &[(&str, &str)], body: Option<String>) -> reqwest::Response {
        let mut r = client().request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url);
        let jar = self.cookies.lock().unwrap().join("; ");
        if !jar.is_empty() {
            r = r.header("cookie", jar);
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        if let Some(b) = body {
            r = r.header("content-type", "application/json").body(b);
        }
        let res = r.send().await.unwrap();
        for c in res.headers().get_all("set-cookie") {
            let pair = c.to_str().unwrap().split(';').next().unwrap().to_string();
            let name = pair.split('=').next().unwrap().to_string();
            let mut jar = self.cookies.lock().unwrap();
            jar.retain(|p| !p.starts_with(&format!("{name}=")));
            jar.push(pair);
        }
        res
    }

    async fn get(&self, url: String) -> reqwest::Response {
        self.send("GET", url, &[], None).await
    }

    async fn info(&self, s: &Server, id: &str) -> serde_json::Value {
        json(self.get(s.url(&format!("/l/{id}/info"))).await).await
    }

    async fn unlock(&self, s: &Server, id: &str, passphrase: &str) -> reqwest::Response {
        self.send("POST", s.url(&format!("/l/{id}/unlock")), &[], Some(serde_json::json!({ "passphrase": passphrase }).to_string())).await
    }
}

#[tokio::test]
async fn a_one_time_share_of_three_files_serves_once_then_says_it_is_used() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let data: Vec<Vec<u8>> = (0..3).map(|i| pseudo_random(100_000 + i * 7, i as u64)).collect();
    let mut ids = Vec::new();
    for (i, d) in data.iter().enumerate() {
        ids.push(api.upload(d, &format!("part-{i}.bin")).await);
    }
    let link = make(&api, serde_json::json!({ "kind": "share", "files": ids, "message": "The exports you asked for.", "max_downloads": 1 })).await;
    let id = link["id"].as_str().unwrap();
    assert_eq!(link["url"], s.url(&format!("/l/{id}")));
    assert_eq!(link["state"], "open");
    assert_eq!(link["passphrase"], false);
    assert_eq!(link["files"], serde_json::json!(ids));

    let alice = Browser::default();
    let info = alice.info(&s, id).await;
    assert_eq!(info["message"], "The exports you asked for.");
    assert_eq!(info["max_downloads"], 1);
    let names: Vec<&str> = info["files"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["part-0.bin", "part-1.bin", "part-2.bin"]);
    assert_eq!(info["files"][1]["sha256"], sha256_hex(&data[1]).as_str());

    // The first GET counts and hands out the grant; with it, the other files and a resume.
    let r = alice.get(s.url(&format!("/l/{id}/files/{}?download=1", ids[0]))).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-disposition").unwrap().starts_with("attachment"));
    assert_eq!(r.bytes().await.unwrap().as_ref(), data[0].as_slice());
    for (i, fid) in ids.iter().enumerate().skip(1) {
        let r = alice.get(s.url(&format!("/l/{id}/files/{fid}"))).await;
        assert_eq!(r.status(), 200, "file {i} within the grant");
        assert_eq!(r.bytes().await.unwrap().as_ref(), data[i].as_slice());
    }
    let r = alice.send("GET", s.url(&format!("/l/{id}/files/{}", ids[2])), &[("range", "bytes=50000-")], None).await;
    assert_eq!(r.status(), 206);
    assert_eq!(r.bytes().await.unwrap().as_ref(), &data[2][50_000..]);
    assert_eq!(json(api.get(&format!("/api/v1/links/{id}")).await).await["downloads"], 1);

    // Anyone else: used, in plain words, on the file, the info and the page.
    let bob = Browser::default();
    let r = bob.get(s.url(&format!("/l/{id}/files/{}", ids[0]))).await;
    let p = problem(r, 410, "unauthorized").await;
    assert!(p["detail"].as_str().unwrap().contains("allowed 1 download"), "{p}");
    let info = bob.info(&s, id).await;
    assert_eq!(info["state"], "used_up");
    assert!(info.get("files").is_none(), "a used link lists no files: {info}");
    assert_eq!(bob.get(s.url(&format!("/l/{id}"))).await.status(), 410);
    // A file that is not the link's is not served through it.
    let other = api.upload(b"not shared", "other.txt").await;
    let r = alice.get(s.url(&format!("/l/{id}/files/{other}"))).await;
    problem(r, 404, "not_found").await;
    // All three as one zip, within alice's grant: no second download counted.
    let r = alice.get(s.url(&format!("/l/{id}/zip"))).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-disposition").unwrap().contains(".zip"));
    let zipped = r.bytes().await.unwrap();
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(zipped.to_vec())).unwrap();
    assert_eq!(z.len(), 3);
    for (i, d) in data.iter().enumerate() {
        let mut member = z.by_name(&format!("part-{i}.bin")).unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut member, &mut got).unwrap();
        assert_eq!(sha256_hex(&got), sha256_hex(d), "member {i}");
    }
    assert_eq!(json(api.get(&format!("/api/v1/links/{id}")).await).await["downloads"], 1);
    // Bob's zip is refused as his file was: the one download is taken.
    problem(bob.get(s.url(&format!("/l/{id}/zip"))).await, 410, "unauthorized").await;
}

#[tokio::test]
async fn a_passphrase_refuses_a_wrong_one_slows_repeated_tries_and_opens_with_the_right_one() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let data = pseudo_random(4096, 3);
    let fid = api.upload(&data, "secret.bin").await;
    let link =
        make(&api, serde_json::json!({ "kind": "share", "files": [fid], "message": "hidden until unlocked", "passphrase": "correct horse" })).await;
    let id = link["id"].as_str().unwrap().to_string();
    assert_eq!(link["passphrase"], true);
    let listed = json(api.get("/api/v1/links").await).await.to_string();
    assert!(!listed.contains("correct horse") && !listed.contains("argon2"), "never returned: {listed}");

    let c = Browser::default();
    let info = c.info(&s, &id).await;
    assert_eq!(info["locked"], true);
    assert!(info.get("message").is_none() && info.get("files").is_none(), "{info}");
    problem(c.get(s.url(&format!("/l/{id}/files/{fid}"))).await, 401, "unauthorized").await;
    for _ in 0..2 {
        problem(c.unlock(&s, &id, "wrong").await, 403, "unauthorized").await;
    }
    let r = c.unlock(&s, &id, "correct horse").await;
    assert_eq!(r.status(), 204);
    let cookie = header(&r, "set-cookie").unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains(&format!("Path=/l/{id}")), "{cookie}");
    let info = c.info(&s, &id).await;
    assert_eq!(info["locked"], false);
    assert_eq!(info["message"], "hidden until unlocked");
    let r = c.get(s.url(&format!("/l/{id}/files/{fid}"))).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().as_ref(), data.as_slice());
    // A grant for one link opens no other.
    let other = make(&api, serde_json::json!({ "kind": "share", "files": [fid], "passphrase": "another" })).await;
    let oid = other["id"].as_str().unwrap().to_string();
    problem(c.get(s.url(&format!("/l/{oid}/files/{fid}"))).await, 401, "unauthorized").await;

    // A third wrong try from this address: the next one waits, told by Retry-After.
    problem(c.unlock(&s, &oid, "guess").await, 403, "unauthorized").await;
    let r = c.unlock(&s, &oid, "another").await;
    let wait: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1..=300).contains(&wait), "{wait}");
    problem(r, 429, "unauthorized").await;
    tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
    assert_eq!(c.unlock(&s, &oid, "another").await.status(), 204, "after the wait, the right passphrase opens it");
}

/// TUS creation through a request link, then one PATCH; returns the file's `/l/…` URL.
async fn send_through(s: &Server, link: &str, data: &[u8], name: &str) -> reqwest::Response {
    use base64::Engine as _;
    let md = format!("filename {}", base64::engine::general_purpose::STANDARD.encode(name));
    client()
        .post(s.url(&format!("/l/{link}/files")))
        .header("tus-resumable", "1.0.0")
        .header("upload-length", data.len().to_string())
        .header("upload-metadata", md)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_request_for_several_files_takes_each_through_tus_and_no_more() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let link = make(&api, serde_json::json!({ "kind": "request", "message": "Send me the scans, please.", "max_files": 2 })).await;
    let id = link["id"].as_str().unwrap().to_string();
    let info = Browser::default().info(&s, &id).await;
    assert_eq!((info["kind"].as_str(), info["files_left"].as_u64()), (Some("request"), Some(2)));
    assert_eq!(info["message"], "Send me the scans, please.");

    // The requester follows the events from before the first file.
    let mut events = api.get("/api/v1/events").await;
    assert_eq!(events.status(), 200);
    let files: Vec<Vec<u8>> = (0..2).map(|i| pseudo_random(300_000 + i, 40 + i as u64)).collect();
    let mut created = Vec::new();
    for (i, d) in files.iter().enumerate() {
        let r = send_through(&s, &id, d, &format!("scan-{i}.pdf")).await;
        assert_eq!(r.status(), 201);
        let loc = header(&r, "location").unwrap().to_string();
        assert!(loc.starts_with(&format!("/l/{id}/files/")), "{loc}");
        let r = client()
            .patch(s.url(&loc))
            .header("tus-resumable", "1.0.0")
            .header("upload-offset", "0")
            .header("content-type", "application/offset+octet-stream")
            .body(d.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "PATCH through the link");
        created.push(loc.rsplit('/').next().unwrap().to_string());
    }
    // A third file: the request took what it asked for.
    problem(send_through(&s, &id, b"one more", "extra").await, 410, "unauthorized").await;

    let link = json(api.get(&format!("/api/v1/links/{id}")).await).await;
    assert_eq!(link["files"], serde_json::json!(created));
    assert_eq!(link["state"], "full");
    for (fid, d) in created.iter().zip(&files) {
        let f = api.file(fid).await;
        assert_eq!(f["sha256"], sha256_hex(d).as_str(), "owned by the link's principal and exact");
    }
    // The requester sees each arrive: upload.created names the link in its metadata.
    let mut seen = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while seen.matches("upload.finished").count() < 2 {
        assert!(std::time::Instant::now() < deadline, "events so far: {seen}");
        if let Ok(Ok(Some(chunk))) = tokio::time::timeout(std::time::Duration::from_secs(1), events.chunk()).await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
    let tag = format!(r#""ferry-link":"{id}""#);
    assert_eq!(seen.matches(&tag).count(), 2, "each upload.created names the link: {seen}");
    let r = client().head(s.url(&format!("/l/{id}/files/{}", created[0]))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "repr-digest").is_some(), "the page compares fingerprints from HEAD");
}

#[tokio::test]
async fn revoking_stops_downloads_and_uploads_at_once() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let fid = api.upload(&pseudo_random(1000, 1), "a.bin").await;
    let share = make(&api, serde_json::json!({ "kind": "share", "files": [fid] })).await;
    let sid = share["id"].as_str().unwrap().to_string();
    assert_eq!(client().get(s.url(&format!("/l/{sid}/files/{fid}"))).send().await.unwrap().status(), 200);

    let request = make(&api, serde_json::json!({ "kind": "request" })).await;
    let rid = request["id"].as_str().unwrap().to_string();
    let data = pseudo_random(20_000, 2);
    let r = send_through(&s, &rid, &data, "half.bin").await;
    let loc = header(&r, "location").unwrap().to_string();
    let patch = |off: usize, body: Vec<u8>| {
        client()
            .patch(s.url(&loc))
            .header("tus-resumable", "1.0.0")
            .header("upload-offset", off.to_string())
            .header("content-type", "application/offset+octet-stream")
            .body(body)
            .send()
    };
    assert_eq!(patch(0, data[..10_000].to_vec()).await.unwrap().status(), 204);

    // A revoked link is kept (its page says so), so revoking is a POST: there is no DELETE.
    assert!(!api.send("DELETE", &format!("/api/v1/links/{sid}"), &[], None).await.status().is_success());
    assert_eq!(json(api.get(&format!("/api/v1/links/{sid}")).await).await["state"], "open");
    for id in [&sid, &rid] {
        let r = api.post(&format!("/api/v1/links/{id}/revoke"), "").await;
        assert_eq!(r.status(), 200);
        assert_eq!(json(r).await["state"], "revoked");
    }
    problem(client().get(s.url(&format!("/l/{sid}/files/{fid}"))).send().await.unwrap(), 410, "unauthorized").await;
    problem(patch(10_000, data[10_000..].to_vec()).await.unwrap(), 410, "unauthorized").await;
    problem(send_through(&s, &rid, b"x", "x").await, 410, "unauthorized").await;
    assert_eq!(client().get(s.url(&format!("/l/{sid}"))).send().await.unwrap().status(), 410);
    let info = Browser::default().info(&s, &rid).await;
    assert_eq!(info["state"], "revoked");
    assert!(info["why"].as_str().unwrap().contains("revoked"), "{info}");
    // Another principal's link is not there for this one (a server without tokens: `local`
    // owns all; the API answers 404 for an unknown id).
    problem(api.post("/api/v1/links/aaaaaaaaaaaaaaaaaaaaaaaaaa/revoke", "").await, 404, "not_found").await;
}

#[tokio::test]
async fn bad_links_are_refused_by_name() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let fid = api.upload(b"x", "x").await;
    for (body, status, words) in [
        (serde_json::json!({ "kind": "share", "files": [] }), 422, "1 to 200 files"),
        (serde_json::json!({ "kind": "share", "files": [fid, fid] }), 422, "listed twice"),
        (serde_json::json!({ "kind": "request", "files": [fid] }), 422, "starts with no files"),
        (serde_json::json!({ "kind": "request", "max_downloads": 1 }), 422, "max_downloads is for a share"),
        (serde_json::json!({ "kind": "share", "files": [fid], "message": "a\u{7}b" }), 422, "control character"),
        (serde_json::json!({ "kind": "share", "files": [fid], "message": "x".repeat(1001) }), 400, "message"),
        (serde_json::json!({ "kind": "share", "files": [fid], "passphrase": "" }), 400, "passphrase"),
        (serde_json::json!({ "kind": "share", "files": [fid], "colour": "red" }), 400, "colour"),
        (serde_json::json!({ "kind": "upload" }), 400, "kind"),
    ] {
        let r = api.post("/api/v1/links", &body.to_string()).await;
        let p = problem(r, status, "invalid_argument").await;
        assert!(p["detail"].as_str().unwrap().contains(words), "{body}: {p}");
    }
    let r = api.post("/api/v1/links", &serde_json::json!({ "kind": "share", "files": ["aaaaaaaaaaaaaaaaaaaaaaaaaa"] }).to_string()).await;
    problem(r, 404, "not_found").await;
}

/// `ferry share ID… --message --passphrase-file --max-downloads`, `ferry request --files`, and
/// `ferry share --revoke`: the passphrase never on the command line.
#[tokio::test]
async fn the_cli_makes_and_revokes_links() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let a = api.upload(b"first", "a.txt").await;
    let b = api.upload(b"second", "b.txt").await;
    let dir = tempfile::tempdir().unwrap();
    let pass = write_file(dir.path(), "pass", "tea for two\n");
    let ferry = |args: &[&str]| {
        let o = std::process::Command::new(ferry_bin()).args(args).arg("--server").arg(s.url("")).output().unwrap();
        assert!(o.status.success(), "ferry {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        (String::from_utf8(o.stdout).unwrap().trim().to_string(), String::from_utf8(o.stderr).unwrap())
    };
    let (url, said) = ferry(&["share", &a, &b, "--message", "both files", "--passphrase-file", pass.to_str().unwrap(), "--max-downloads", "1"]);
    assert!(url.starts_with(&s.url("/l/")), "{url}");
    assert!(said.contains("one-time link to 2 files") && said.contains("passphrase"), "{said}");
    let id = url.rsplit('/').next().unwrap().to_string();
    let link = json(api.get(&format!("/api/v1/links/{id}")).await).await;
    assert_eq!(
        (link["files"].clone(), link["message"].clone(), link["passphrase"].clone()),
        (serde_json::json!([a, b]), "both files".into(), true.into())
    );
    let c = Browser::default();
    assert_eq!(c.unlock(&s, &id, "tea for two").await.status(), 204, "the file's first line is the passphrase");

    let (rq, _) = ferry(&["request", "--files", "5", "--message", "your photos"]);
    let rid = rq.rsplit('/').next().unwrap().to_string();
    let link = json(api.get(&format!("/api/v1/links/{rid}")).await).await;
    assert_eq!((link["kind"].as_str(), link["max_files"].as_u64()), (Some("request"), Some(5)));

    let (_, said) = ferry(&["share", "--revoke", &url, &rid]);
    assert_eq!(said.matches("is revoked").count(), 2, "{said}");
    assert_eq!(json(api.get(&format!("/api/v1/links/{id}")).await).await["state"], "revoked");
    // One file and no link option: the signed URL of before.
    let (signed, _) = ferry(&["share", &a]);
    assert!(signed.contains(&format!("/files/{a}?scope=download")), "{signed}");
}
