//! Bearer tokens as an operator drives them: `ferry token create | list | revoke` on a
//! ferry.toml, a running server that picks the change up on SIGHUP (revoked → 401, the others
//! still work; a broken file keeps the old tokens and says why), the start-up line counting
//! principals, `token create` refusing a file it cannot parse (exit ≠ 0, file unchanged), and
//! the upload-scoped, expiring token a web page may hold: it creates uploads (each answered
//! with a signed upload URL) and is refused for listing, reading, deleting, the API and MCP,
//! and after it expires.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::logged::LoggedServer;
use common::*;

fn ferry(args: &[&str]) -> Output {
    Command::new(ferry_bin()).args(args).env_remove("FERRY_CONFIG").output().expect("run ferry")
}

/// `ferry token create NAME --config CFG EXTRA…` → the token printed on stdout.
fn create(cfg: &Path, name: &str, extra: &[&str]) -> String {
    let mut args = vec!["token", "create", name, "--config", cfg.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = ferry(&args);
    assert!(out.status.success(), "token create: {}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(token.starts_with("fy_"), "{token}");
    token
}

fn list(cfg: &Path) -> Vec<serde_json::Value> {
    let out = ferry(&["token", "list", "--json", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "token list: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

fn api(base: &str, token: Option<&str>) -> Api {
    Api { c: client(), base: base.to_string(), token: token.map(str::to_owned) }
}

async fn status(a: &Api, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    a.send(method, path, headers, None).await.status().as_u16()
}

#[test]
fn token_commands_refuse_a_config_they_cannot_parse_and_leave_it_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, broken) in [
        "listen = \n",                                                              // not TOML
        "lisen = \"127.0.0.1:8080\"\n",                                             // an unknown key
        "[[tokens]]\nprincipal = \"a\"\nsha256 = \"short\"\n",                      // a bad token entry
        "[[tokens]]\nprincipal = \"a\"\nsha256 = \"%s\"\nexpires = \"tomorrow\"\n", // a bad expiry
    ]
    .iter()
    .enumerate()
    {
        let text = broken.replace("%s", &"0".repeat(64));
        let cfg = write_file(tmp.path(), &format!("broken{i}.toml"), &text);
        for args in [
            vec!["token", "create", "alice", "--config", cfg.to_str().unwrap()],
            vec!["token", "list", "--config", cfg.to_str().unwrap()],
            vec!["token", "revoke", "--principal", "a", "--config", cfg.to_str().unwrap()],
        ] {
            let out = ferry(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?} on {text:?}: {err}");
            assert!(err.contains(&format!("broken{i}.toml")), "the error names the file: {err}");
            assert!(out.stdout.is_empty(), "no token printed: {}", String::from_utf8_lossy(&out.stdout));
            assert_eq!(std::fs::read_to_string(&cfg).unwrap(), text, "{args:?} changed the file");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_revoke_and_reload_on_sighup() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_file(tmp.path(), "ferry.toml", "# operator's notes stay\nmax_size = \"1GiB\"\n");
    let alice = create(&cfg, "alice", &[]);
    let bob = create(&cfg, "bob", &[]);
    let bob2 = create(&cfg, "bob", &[]);
    let tokens = list(&cfg);
    assert_eq!(tokens.iter().map(|t| t["principal"].as_str().unwrap()).collect::<Vec<_>>(), ["alice", "bob", "bob"]);
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(!text.contains(&alice) && !text.contains(&bob), "only hashes are stored");
    let human = ferry(&["token", "list", "--config", cfg.to_str().unwrap()]);
    let human = String::from_utf8(human.stdout).unwrap();
    assert!(human.contains("alice") && human.contains(tokens[0]["id"].as_str().unwrap()) && !human.contains(&alice), "{human}");

    let mut s = LoggedServer::start(&tmp.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    s.wait_log(&["2 principal(s) configured with 3 bearer token(s)"], 30);
    let (a, b, b2) = (api(&s.base, Some(&alice)), api(&s.base, Some(&bob)), api(&s.base, Some(&bob2)));
    for who in [&a, &b, &b2] {
        assert_eq!(status(who, "GET", "/api/v1/files", &[]).await, 200);
    }

    // Revoke alice's token by the id `list` shows; the file keeps its comment and other keys.
    let out = ferry(&["token", "revoke", tokens[0]["id"].as_str().unwrap(), "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("# operator's notes stay") && text.contains("max_size = \"1GiB\""), "{text}");
    assert_eq!(list(&cfg).len(), 2);
    let again = ferry(&["token", "revoke", tokens[0]["id"].as_str().unwrap(), "--config", cfg.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(3), "nothing left to revoke: {}", String::from_utf8_lossy(&again.stderr));
    let short = ferry(&["token", "revoke", "abc", "--config", cfg.to_str().unwrap()]);
    assert_eq!(short.status.code(), Some(2));

    // Until the server is told, alice still works; after SIGHUP she gets 401, bob does not.
    assert_eq!(status(&a, "GET", "/api/v1/files", &[]).await, 200);
    s.sighup();
    s.wait_log(&["1 principal(s) loaded with 2 bearer token(s)"], 30);
    let r = a.get("/api/v1/files").await;
    problem(r, 401, "unauthorized").await;
    assert_eq!(status(&b, "GET", "/api/v1/files", &[]).await, 200);
    assert_eq!(status(&b2, "GET", "/api/v1/files", &[]).await, 200);

    // Revoke one token by the token itself.
    let out = ferry(&["token", "revoke", &bob2, "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A file broken before the SIGHUP: the reload is refused with the reason, the old tokens stay.
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{good}\nmax_size = \"lots\"\n")).unwrap();
    s.sighup();
    let line = s.wait_log(&["reload refused"], 30);
    assert!(line.contains("ferry.toml"), "the line says which file: {line}");
    assert_eq!(status(&b2, "GET", "/api/v1/files", &[]).await, 200, "the old set stays");
    assert_eq!(status(&a, "GET", "/api/v1/files", &[]).await, 401);
    // Fixed: the next SIGHUP applies it.
    std::fs::write(&cfg, &good).unwrap();
    s.sighup();
    s.wait_log(&["1 principal(s) loaded with 1 bearer token(s)"], 30);
    assert_eq!(status(&b2, "GET", "/api/v1/files", &[]).await, 401);
    assert_eq!(status(&b, "GET", "/api/v1/files", &[]).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tokens_start_up_line_says_local() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = LoggedServer::start(&tmp.path().join("data"), &[]);
    s.wait_log(&["no bearer tokens configured", "local"], 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_scoped_token_creates_uploads_and_nothing_else_until_it_expires() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_file(tmp.path(), "ferry.toml", "");
    let full = create(&cfg, "alice", &[]);
    let page = create(&cfg, "alice", &["--scope", "upload", "--ttl", "1h"]);
    let brief = create(&cfg, "alice", &["--scope", "upload", "--ttl", "1s"]);
    let listed = list(&cfg);
    assert_eq!(listed[1]["scope"], "upload");
    assert!(listed[1]["expires"].as_str().unwrap().ends_with('Z'), "{listed:?}");
    let mut s = LoggedServer::start(&tmp.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    s.wait_log(&["1 principal(s) configured with 3 bearer token(s)"], 30);
    let owner = api(&s.base, Some(&full));
    let secret = pseudo_random(4096, 1);
    let secret_id = owner.upload(&secret, "payroll.csv").await;

    // The page's token creates an upload; Location is a signed upload URL that needs no token.
    let web = api(&s.base, Some(&page));
    let data = pseudo_random(100_000, 2);
    let r = web.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", &data.len().to_string())], None).await;
    assert_eq!(r.status(), 201);
    let loc = header(&r, "location").unwrap().to_string();
    assert!(loc.contains("scope=upload") && loc.contains("sig="), "{loc}");
    let anon = Tus { c: client(), base: s.base.clone() };
    let r = anon.patch(&loc, 0, data[..50_000].to_vec(), &[]).await;
    assert_eq!(r.status(), 204);
    assert_eq!(anon.offset(&loc).await, 50_000, "HEAD with the signed URL");
    let r = anon.patch(&loc, 50_000, data[50_000..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204);
    let id = loc.trim_start_matches("/files/").split('?').next().unwrap().to_string();
    // It belongs to alice: her full token reads it.
    assert_eq!(sha256_hex(&owner.download(&id).await), sha256_hex(&data));
    // The IETF draft's creation answers the same signed Location.
    let r = web.send("POST", "/files/", &[("Upload-Draft-Interop-Version", "8"), ("Upload-Complete", "?0"), ("Upload-Length", "10")], None).await;
    assert_eq!(r.status(), 201);
    assert!(header(&r, "location").unwrap().contains("scope=upload"));

    // Nothing else: list, read, delete, resume with the token alone, the API, MCP.
    let tus = [("Tus-Resumable", "1.0.0")];
    for (method, path, headers) in [
        ("GET", "/api/v1/files".to_string(), &[][..]),
        ("GET", format!("/api/v1/files/{secret_id}"), &[][..]),
        ("GET", format!("/files/{secret_id}"), &[][..]),
        ("GET", format!("/files/{id}"), &[][..]),
        ("HEAD", format!("/files/{secret_id}"), &tus[..]),
        ("DELETE", format!("/files/{secret_id}"), &tus[..]),
        ("DELETE", format!("/files/{id}"), &tus[..]),
        ("POST", format!("/api/v1/files/{secret_id}/share"), &[][..]),
        ("GET", "/api/v1/tasks".to_string(), &[][..]),
        ("GET", "/api/v1/events".to_string(), &[][..]),
        ("POST", "/mcp".to_string(), &[("content-type", "application/json"), ("accept", "application/json, text/event-stream")][..]),
        // A method override cannot turn the creation into a read.
        ("POST", format!("/files/{secret_id}"), &[("X-HTTP-Method-Override", "GET")][..]),
    ] {
        let r = web.send(method, &path, headers, None).await;
        assert_eq!(r.status(), 403, "{method} {path} with an upload-scoped token");
        if method != "HEAD" {
            let p = json(r).await;
            assert_eq!(p["code"], "unauthorized", "{p}");
            assert!(p["detail"].as_str().unwrap().contains("scope upload"), "{p}");
        }
    }
    let r = web
        .send("PATCH", &format!("/files/{id}"), &[("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET), ("Upload-Offset", "0")], Some(vec![1]))
        .await;
    assert_eq!(r.status(), 403);
    // The owner's file is untouched.
    assert_eq!(sha256_hex(&owner.download(&secret_id).await), sha256_hex(&secret));

    // The 1-second token: refused as expired once its time has passed (waited for, not slept).
    let short = api(&s.base, Some(&brief));
    let deadline = Instant::now() + Duration::from_secs(30);
    let p = loop {
        let r = short.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "1")], None).await;
        if r.status() == 401 {
            break json(r).await;
        }
        assert_eq!(r.status(), 201, "before it expires it works like the page token");
        assert!(Instant::now() < deadline, "the 1 s token never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(p["code"], "unauthorized");
    assert!(p["detail"].as_str().unwrap().contains("expired at"), "{p}");
    let listed = list(&cfg);
    assert_eq!(listed[2]["expired"], true, "{listed:?}");
}
