//! Signed URLs (DESIGN §6) over plain HTTP: `POST /api/v1/files/{id}/share`, then the URL works
//! without a token for exactly its scope, file and lifetime; anything else is 403 `unauthorized`.

mod common;

use common::{client, json, problem, sha256_hex, write_file, Api, Server};

async fn share(api: &Api, id: &str, body: &str) -> String {
    let r = api.post(&format!("/api/v1/files/{id}/share"), body).await;
    assert_eq!(r.status(), 200);
    let v = json(r).await;
    assert!(v["expires_at"].as_str().unwrap().ends_with('Z'));
    v["url"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn signed_urls_open_one_file_for_one_scope_until_they_expire() {
    let tmp = tempfile::tempdir().unwrap();
    let token = "fy_owner_token";
    let cfg = write_file(tmp.path(), "ferry.toml", &format!("[[tokens]]\nprincipal = \"owner\"\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes())));
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let api = Api::with_token(&server, token);
    let data = common::pseudo_random(200_000, 3);
    let a = api.upload(&data, "a.bin").await;
    let b = api.upload(b"other", "b.bin").await;
    let http = client();

    // Download scope: GET (with Range) and HEAD without a token.
    let url = share(&api, &a, "{}").await;
    assert!(url.starts_with("http://") && url.contains(&format!("/files/{a}?scope=download&expires=")), "{url}");
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(sha256_hex(&r.bytes().await.unwrap()), sha256_hex(&data));
    let r = http.get(&url).header("range", "bytes=10-19").send().await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(&r.bytes().await.unwrap()[..], &data[10..20]);
    assert_eq!(http.head(&url).send().await.unwrap().status(), 200);
    // HEAD answers what GET does (RFC 9110 §9.3.2), preconditions and ranges included.
    for (name, value, status) in
        [("if-none-match", "*", 304), ("if-match", "\"x\"", 412), ("range", "bytes=00-01", 206), ("range", "bytes=18446744073709551616-", 416)]
    {
        let get = http.get(&url).header(name, value).send().await.unwrap();
        let head = http.head(&url).header(name, value).send().await.unwrap();
        assert_eq!((get.status().as_u16(), head.status().as_u16()), (status, status), "{name}: {value}");
        assert_eq!(common::header(&head, "content-range"), common::header(&get, "content-range"));
    }

    // Wrong method for the scope, another file, a tampered signature or expiry.
    let patch = http
        .patch(&url)
        .header("tus-resumable", "1.0.0")
        .header("upload-offset", "0")
        .header("content-type", "application/offset+octet-stream")
        .body("x")
        .send()
        .await
        .unwrap();
    problem(patch, 403, "unauthorized").await;
    problem(http.get(url.replace(&a, &b)).send().await.unwrap(), 403, "unauthorized").await;
    let tampered = format!("{}{}", &url[..url.len() - 1], if url.ends_with('A') { 'B' } else { 'A' });
    problem(http.get(&tampered).send().await.unwrap(), 403, "unauthorized").await;
    let expires: i64 = url.split("expires=").nth(1).unwrap().split('&').next().unwrap().parse().unwrap();
    problem(http.get(url.replace(&format!("expires={expires}"), &format!("expires={}", expires + 3600))).send().await.unwrap(), 403, "unauthorized")
        .await;
    // A signature never opens other routes, even with a valid token alongside.
    let q = url.split_once('?').unwrap().1;
    let other = http.get(server.url(&format!("/api/v1/files/{a}?{q}"))).bearer_auth(token).send().await.unwrap();
    problem(other, 403, "unauthorized").await;
    // Without a token and without a signature: 401.
    problem(http.get(server.url(&format!("/files/{a}"))).send().await.unwrap(), 401, "unauthorized").await;

    // Expiry: a 1 ms URL is refused once its (whole-second) expiry passed.
    let short = share(&api, &a, r#"{"ttl_ms": 1}"#).await;
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let body = problem(http.get(&short).send().await.unwrap(), 403, "unauthorized").await;
    assert!(body["detail"].as_str().unwrap().contains("expired"), "{body}");

    // Bad requests.
    problem(api.post(&format!("/api/v1/files/{a}/share"), r#"{"ttl_ms": 0}"#).await, 400, "invalid_argument").await;
    problem(api.post(&format!("/api/v1/files/{a}/share"), r#"{"scope": "admin"}"#).await, 400, "invalid_argument").await;
    problem(api.post("/api/v1/files/aaaaaaaaaaaaaaaaaaaaaaaaaa/share", "{}").await, 404, "not_found").await;

    // Upload scope: HEAD and PATCH finish an upload without a token; GET is refused.
    let r = api.send("POST", "/files/", &[("tus-resumable", "1.0.0"), ("upload-length", "10")], None).await;
    let id = common::header(&r, "location").unwrap().rsplit('/').next().unwrap().to_string();
    let up = share(&api, &id, r#"{"scope": "upload"}"#).await;
    let head = http.head(&up).header("tus-resumable", "1.0.0").send().await.unwrap();
    assert_eq!(common::header_u64(&head, "upload-offset"), Some(0));
    let r = http
        .patch(&up)
        .header("tus-resumable", "1.0.0")
        .header("upload-offset", "0")
        .header("content-type", "application/offset+octet-stream")
        .body("0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    problem(http.get(&up).send().await.unwrap(), 403, "unauthorized").await;
    problem(http.delete(&up).header("tus-resumable", "1.0.0").send().await.unwrap(), 403, "unauthorized").await;
    assert_eq!(api.file(&id).await["sha256"], sha256_hex(b"0123456789"));

    // A deleted file's URL is 404, and the secret survives a restart (URLs stay valid).
    let url_b = share(&api, &b, "{}").await;
    let mut server = server;
    server.restart();
    let api = Api::with_token(&server, token);
    assert_eq!(http.get(server.url(&format!("/files/{a}?{q}"))).send().await.unwrap().status(), 200);
    let r = api.send("DELETE", &format!("/files/{b}"), &[("tus-resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 204);
    let gone = url_b.replace(&url_b[..url_b.find("/files/").unwrap()], &server.url(""));
    problem(http.get(gone).send().await.unwrap(), 404, "not_found").await;
}

#[tokio::test]
async fn public_url_makes_locations_and_signed_urls_absolute() {
    let server = Server::start(&["--public-url", "https://files.example.com/"]);
    let api = Api::new(&server);
    let r = api.send("POST", "/files/", &[("tus-resumable", "1.0.0"), ("upload-length", "3")], None).await;
    assert_eq!(r.status(), 201);
    let loc = common::header(&r, "location").unwrap().to_string();
    assert!(loc.starts_with("https://files.example.com/files/"), "{loc}");
    let id = loc.rsplit('/').next().unwrap();
    let url = share(&api, id, r#"{"scope":"upload"}"#).await;
    assert!(url.starts_with(&format!("https://files.example.com/files/{id}?scope=upload")), "{url}");
    // A malformed public URL is a configuration error (exit code 2), not a silent default.
    let out = std::process::Command::new(common::ferry_bin())
        .args(["serve", "--public-url", "files.example.com", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("public_url"));
}
