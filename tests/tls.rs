//! HTTPS serving (`--tls-cert` / `--tls-key`), as users drive it: a certificate for 127.0.0.1
//! signed by a test CA made with the `openssl` command; curl with `--cacert` and tus-js-client
//! (Node, `NODE_EXTRA_CA_CERTS`) upload over https and the bytes arrive whole; a SIGHUP after the
//! files were replaced serves the new certificate to new connections while a PATCH streaming on
//! an open connection finishes; a SIGHUP with a broken certificate keeps the old one and says
//! why; a missing or mismatched certificate or key stops start-up with one line and exit ≠ 0.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::logged::LoggedServer;
use common::*;

fn openssl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl (apt install openssl)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A test CA (`ca.pem`, `ca.key`) in `dir`.
fn make_ca(dir: &Path) {
    openssl(
        dir,
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ferry test CA"],
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
}

/// A server certificate for 127.0.0.1 signed by the CA: `NAME.pem`, `NAME.key`. Returns its
/// SHA-256 fingerprint as openssl prints it.
fn make_server_cert(dir: &Path, name: &str) -> String {
    let (key, csr, pem) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"));
    openssl(dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", &format!("/CN=127.0.0.1/O={name}")]);
    openssl(
        dir,
        &["x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", &pem, "-days", "2", "-extfile", "san.ext"],
    );
    fingerprint_of_file(dir, &pem)
}

fn fingerprint_of_file(dir: &Path, pem: &str) -> String {
    openssl(dir, &["x509", "-in", pem, "-noout", "-fingerprint", "-sha256"]).trim().to_string()
}

/// The fingerprint of the certificate a new TLS connection to `port` is served.
fn served_fingerprint(dir: &Path, port: u16) -> String {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-servername", "localhost"])
        .stdin(std::process::Stdio::null())
        .current_dir(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find("-----BEGIN CERTIFICATE-----").unwrap_or_else(|| panic!("no certificate from s_client: {text}"));
    let end = text.find("-----END CERTIFICATE-----").unwrap() + "-----END CERTIFICATE-----".len();
    std::fs::write(dir.join("served.pem"), format!("{}\n", &text[start..end])).unwrap();
    fingerprint_of_file(dir, "served.pem")
}

/// A reqwest client that trusts only the test CA.
fn tls_client(dir: &Path) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.join("ca.pem")).unwrap()).unwrap();
    reqwest::Client::builder().no_proxy().tls_certs_only([ca]).build().unwrap()
}

fn curl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("curl").args(["-sS", "--fail-with-body", "--cacert", "ca.pem"]).args(args).current_dir(dir).output().expect("curl");
    assert!(out.status.success(), "curl {args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_curl_and_tus_js_client_and_certificate_reload_on_sighup() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_ca(dir);
    let first = make_server_cert(dir, "first");
    std::fs::copy(dir.join("first.pem"), dir.join("server.pem")).unwrap();
    std::fs::copy(dir.join("first.key"), dir.join("server.key")).unwrap();
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    let mut s = LoggedServer::start(&dir.join("data"), &["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()]);
    assert!(s.base.starts_with("https://127.0.0.1:"), "{}", s.base);
    assert_eq!(served_fingerprint(dir, s.port()), first);

    // curl: create, upload in one PATCH, download, over https verified against the test CA.
    let data = pseudo_random(3 << 20, 7);
    std::fs::write(dir.join("big.bin"), &data).unwrap();
    let headers = curl(
        dir,
        &[
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-X",
            "POST",
            &s.url("/files/"),
            "-H",
            "Tus-Resumable: 1.0.0",
            "-H",
            &format!("Upload-Length: {}", data.len()),
        ],
    );
    let loc = headers.lines().find_map(|l| l.strip_prefix("location: ").or_else(|| l.strip_prefix("Location: "))).unwrap().trim().to_string();
    let url = s.url(&loc);
    curl(
        dir,
        &[
            "-X",
            "PATCH",
            &url,
            "-H",
            "Tus-Resumable: 1.0.0",
            "-H",
            "Content-Type: application/offset+octet-stream",
            "-H",
            "Upload-Offset: 0",
            "-T",
            "big.bin",
        ],
    );
    curl(dir, &["-o", "copy.bin", &url]);
    assert_eq!(sha256_hex(&std::fs::read(dir.join("copy.bin")).unwrap()), sha256_hex(&data));

    // tus-js-client in Node, trusting the CA through NODE_EXTRA_CA_CERTS.
    let file = dir.join("node.bin");
    let node_data = pseudo_random((1 << 20) + 333, 8);
    std::fs::write(&file, &node_data).unwrap();
    let mut cmd = node_script("upload_chunked.js", &[&s.base, file.to_str().unwrap()]);
    cmd.env("NODE_EXTRA_CA_CERTS", dir.join("ca.pem"));
    let out = run_json_client(cmd, 120).await;
    let node_url = out["url"].as_str().unwrap();
    assert!(node_url.starts_with(&s.url("/files/")), "{node_url}");
    let http = tls_client(dir);
    let body = http.get(node_url).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(sha256_hex(&body), sha256_hex(&node_data));

    // A PATCH streaming on an open connection across the reload: it must finish on that
    // connection while new connections get the new certificate.
    let long = Tus { base: s.base.clone(), c: http.clone() };
    let total = 2u64 << 20;
    let r = long.post(&[("Upload-Length", &total.to_string())]).await;
    assert_eq!(r.status(), 201);
    let slow_url = long.abs(header(&r, "location").unwrap());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let body = reqwest::Body::wrap_stream(tokio_stream_from(rx));
    let patch = http
        .patch(&slow_url)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", "application/offset+octet-stream")
        .header("Upload-Offset", "0")
        .header("Content-Length", total.to_string())
        .body(body)
        .send();
    let patch = tokio::spawn(patch);
    let chunk = pseudo_random(1 << 20, 9);
    tx.send(Ok(chunk.clone())).await.unwrap();

    let second = make_server_cert(dir, "second");
    assert_ne!(first, second);
    std::fs::copy(dir.join("second.pem"), &cert).unwrap();
    std::fs::copy(dir.join("second.key"), &key).unwrap();
    s.sighup();
    s.wait_log(&["TLS certificate reloaded"], 30);
    assert_eq!(served_fingerprint(dir, s.port()), second, "a new connection gets the new certificate");
    tx.send(Ok(chunk.clone())).await.unwrap();
    drop(tx);
    let r = patch.await.unwrap().expect("the PATCH on the open connection survived the reload");
    assert_eq!(r.status(), 204);
    assert_eq!(header(&r, "upload-offset"), Some(total.to_string().as_str()));

    // A broken certificate on SIGHUP: logged, and the second one stays.
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n").unwrap();
    s.sighup();
    let line = s.wait_log(&["TLS certificate not reloaded"], 30);
    assert!(line.contains("server.pem"), "the line names the file: {line}");
    assert_eq!(served_fingerprint(dir, s.port()), second);
    // A key that does not belong to the certificate: the same.
    std::fs::copy(dir.join("second.pem"), &cert).unwrap();
    std::fs::copy(dir.join("first.key"), &key).unwrap();
    s.sighup();
    let line = s.wait_log(&["TLS certificate not reloaded"], 30);
    assert!(line.contains("does not belong"), "{line}");
    assert_eq!(served_fingerprint(dir, s.port()), second);
    let r = http.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200, "still serving");
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// `ferry serve ARGS` that must fail at start-up: exit ≠ 0 and the stderr.
fn refused(data: &Path, args: &[&str]) -> String {
    let mut child = Command::new(ferry_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .args(args)
        .env_remove("FERRY_CONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ferry serve {args:?} kept running; it should refuse to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "ferry serve {args:?} exited 0: {err}");
    err
}

#[test]
fn missing_or_mismatched_certificate_stops_start_up_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_ca(dir);
    make_server_cert(dir, "a");
    make_server_cert(dir, "b");
    let data = dir.join("data");
    let p = |n: &str| dir.join(n).to_str().unwrap().to_string();

    let err = refused(&data, &["--tls-cert", &p("nope.pem"), "--tls-key", &p("a.key")]);
    assert!(err.contains("nope.pem") && err.contains("No such file"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    let err = refused(&data, &["--tls-cert", &p("a.pem"), "--tls-key", &p("b.key")]);
    assert!(err.contains("b.key") && err.contains("does not belong") && err.contains("a.pem"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    // A key file given as the certificate, and the reverse.
    let err = refused(&data, &["--tls-cert", &p("a.key"), "--tls-key", &p("a.key")]);
    assert!(err.contains("no PEM certificate"), "{err}");
    let err = refused(&data, &["--tls-cert", &p("a.pem"), "--tls-key", &p("a.pem")]);
    assert!(err.contains("no PEM private key"), "{err}");

    // Half a pair: from a flag (clap) and from ferry.toml.
    let err = refused(&data, &["--tls-cert", &p("a.pem")]);
    assert!(err.contains("--tls-key"), "{err}");
    let cfg = write_file(dir, "half.toml", &format!("tls_cert = {:?}\n", p("a.pem")));
    let err = refused(&data, &["--config", cfg.to_str().unwrap()]);
    assert!(err.contains("tls_key"), "{err}");

    // Both from ferry.toml: serves https.
    let cfg = write_file(dir, "tls.toml", &format!("tls_cert = {:?}\ntls_key = {:?}\n", p("a.pem"), p("a.key")));
    let s = LoggedServer::start(&data, &["--config", cfg.to_str().unwrap()]);
    assert!(s.base.starts_with("https://"), "{}", s.base);
}

/// Issue 23 kind 17: plain `http://` to the TLS port gets a plain `400` saying to use
/// `https://` (curl showed only "Received HTTP/0.9 when not allowed"); https keeps working.
#[test]
fn plain_http_to_the_tls_port_says_use_https() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_ca(dir);
    make_server_cert(dir, "server");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    let s = Server::start(&["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()]);
    let plain = s.base.replacen("https://", "http://", 1);
    let out = Command::new("curl").args(["-sS", "-w", "\n%{http_code}", &format!("{plain}/healthz")]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("use https://") && text.trim_end().ends_with("400"), "{text} {}", String::from_utf8_lossy(&out.stderr));
    let ok = curl(dir, &["-o", "/dev/null", "-w", "%{http_code}", &format!("{}/healthz", s.base)]);
    assert_eq!(ok.trim(), "200");
}

/// A private server with an ordinary self-signed certificate (`openssl req -x509`, what curl
/// takes with `--cacert`): `ferry upload` / `download` / `ls` reach it with `--cacert FILE` or
/// `FERRY_CACERT`, and the bytes arrive whole; without it each command fails at once (exit 5,
/// not retried) naming the TLS cause and `--cacert`, not "Is `ferry serve` running?". A CA
/// file (the usual chain) works the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_trusts_a_self_signed_server_with_cacert() {
    use common::cli::{code, ferry, ok_json, out, stderr};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "self.key",
            "-out",
            "self.pem",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
    );
    let s = LoggedServer::start(
        &dir.join("data"),
        &["--tls-cert", dir.join("self.pem").to_str().unwrap(), "--tls-key", dir.join("self.key").to_str().unwrap()],
    );
    curl(dir, &["--cacert", "self.pem", "-o", "/dev/null", &s.url("/healthz")]); // what curl takes
    let cache = dir.join("cache");
    let data = pseudo_random((1 << 20) + 77, 11);
    std::fs::write(dir.join("up.bin"), &data).unwrap();
    let src = dir.join("up.bin");
    let cacert = dir.join("self.pem");

    let started = Instant::now();
    let o = out(&mut ferry(&s.base, &cache, &["upload", src.to_str().unwrap()]));
    let err = stderr(&o);
    assert_eq!(code(&o), 5, "{err}");
    assert!(err.contains("self-signed") && err.contains("--cacert"), "the TLS cause and the way out: {err}");
    assert!(!err.contains("Is `ferry serve` running"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20), "a certificate error is not retried: {:?}", started.elapsed());

    let up = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "--cacert", cacert.to_str().unwrap(), src.to_str().unwrap()])));
    let url = up["url"].as_str().unwrap().to_string();
    let dl = dir.join("dl");
    std::fs::create_dir(&dl).unwrap();
    let o = out(ferry(&s.base, &cache, &["download", &url, "-o", dl.join("copy.bin").to_str().unwrap()]).env("FERRY_CACERT", &cacert));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(sha256_hex(&std::fs::read(dl.join("copy.bin")).unwrap()), sha256_hex(&data));
    let o = out(&mut ferry(&s.base, &cache, &["download", &url, "-o", dl.join("again.bin").to_str().unwrap()]));
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    assert!(stderr(&o).contains("--cacert"), "{}", stderr(&o));

    // The usual chain: a CA file trusts the certificate it signed.
    make_ca(dir);
    make_server_cert(dir, "signed");
    let s2 = LoggedServer::start(
        &dir.join("data2"),
        &["--tls-cert", dir.join("signed.pem").to_str().unwrap(), "--tls-key", dir.join("signed.key").to_str().unwrap()],
    );
    let o = out(&mut ferry(&s2.base, &cache, &["upload", "--json", "--cacert", dir.join("ca.pem").to_str().unwrap(), src.to_str().unwrap()]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // The self-signed file does not vouch for another server's certificate.
    let o = out(&mut ferry(&s2.base, &cache, &["upload", "--fresh", "--cacert", cacert.to_str().unwrap(), src.to_str().unwrap()]));
    assert_eq!(code(&o), 5, "{}", stderr(&o));
}

/// The hint's command (between backticks after `Use …:`), run as a shell would, with this
/// build's `ferry` first on PATH.
fn run_hinted(err: &str, cache: &Path, cwd: &Path) -> std::process::Output {
    let start = err.find("port: `").unwrap_or_else(|| panic!("no command in the hint: {err}")) + "port: `".len();
    let cmd = &err[start..start + err[start..].find('`').unwrap()];
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_ferry")).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    Command::new("sh")
        .args(["-c", cmd])
        .env("PATH", path)
        .env("FERRY_CACHE_DIR", cache)
        .env_remove("FERRY_SERVER")
        .env_remove("FERRY_TOKEN")
        .current_dir(cwd)
        .output()
        .unwrap()
}

/// Issue 48 kind 6: every TLS failure of the CLI is said in words, with what to do — never
/// rustls's debug text. A self-signed certificate is called that (and `--cacert` offered); a
/// `--cacert` file that does not vouch for the server is named; a certificate for other names
/// says which names, and does not offer `--cacert` (it cannot help); `http://` to a TLS port and
/// `https://` to a plain port say which scheme the port speaks (exit 2) and print the command to
/// run, which works.
#[test]
fn tls_failures_say_the_cause_and_the_command() {
    use common::cli::{code, ferry, out, stderr};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let self_signed =
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"];
    openssl(dir, &[&self_signed[..], &["-keyout", "self.key", "-out", "self.pem"]].concat());
    openssl(dir, &[&self_signed[..], &["-keyout", "other.key", "-out", "other.pem"]].concat());
    make_ca(dir);
    // A certificate the CA signed for another name only.
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:files.example\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n").unwrap();
    make_server_cert(dir, "named");
    let tls = Server::start(&["--tls-cert", dir.join("self.pem").to_str().unwrap(), "--tls-key", dir.join("self.key").to_str().unwrap()]);
    let named = Server::start(&["--tls-cert", dir.join("named.pem").to_str().unwrap(), "--tls-key", dir.join("named.key").to_str().unwrap()]);
    let plain = Server::start(&[]);
    let cache = dir.join("cache");
    std::fs::write(dir.join("f.bin"), pseudo_random(70_000, 3)).unwrap();
    let no_debug_text = |err: &str| {
        for debug in ["Other(", "OtherError", "CaUsedAsEndEntity", "InvalidContentType", "DnsName(", "corrupt message"] {
            assert!(!err.contains(debug), "{debug:?} is rustls's debug text: {err}");
        }
    };
    let upload = |server: &str, extra: &[&str]| {
        let o = out(ferry(server, &cache, &[&["upload", "--json"], extra, &["f.bin"]].concat()).current_dir(dir));
        let err = stderr(&o);
        no_debug_text(&err);
        (code(&o), err)
    };

    let (c, err) = upload(&tls.base, &[]);
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("self-signed") && err.contains("--cacert FILE"), "{err}");
    let (c, err) = upload(&tls.base, &["--cacert", "other.pem"]);
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("--cacert file other.pem") && err.contains("self-signed"), "the file that did not vouch is named: {err}");
    let (c, err) = upload(&named.base, &["--cacert", "ca.pem"]);
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("valid for files.example, not for 127.0.0.1"), "{err}");
    assert!(!err.contains("pass --cacert"), "a name mismatch is not mended by --cacert: {err}");
    let (c, err) = upload(&named.base, &[]);
    assert_eq!(c, 5, "{err}");
    assert!(err.contains("authority this system does not trust"), "{err}");

    // http:// to the TLS port: the scheme it speaks, and a command that works.
    let http_to_tls = tls.base.replacen("https://", "http://", 1);
    let (c, err) = upload(&http_to_tls, &["--cacert", "self.pem"]);
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("speaks HTTPS") && err.contains(&format!("FERRY_SERVER={} ferry upload", tls.base)), "{err}");
    let o = run_hinted(&err, &cache, dir);
    assert_eq!(code(&o), 0, "the printed command works: {}", stderr(&o));
    // https:// to a plain port, given with --server: the command names the right scheme there.
    let https_to_plain = plain.base.replacen("http://", "https://", 1);
    let (c, err) = upload(&https_to_plain, &["--server", &https_to_plain]);
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("speaks plain HTTP") && err.contains(&format!("ferry upload --json --server {} f.bin", plain.base)), "{err}");
    let o = run_hinted(&err, &cache, dir);
    assert_eq!(code(&o), 0, "the printed command works: {}", stderr(&o));
    // A link argument with the wrong scheme is written again with the right one.
    let url: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let link = url["url"].as_str().unwrap().replacen("http://", "https://", 1);
    let o = out(ferry(&plain.base, &cache, &["download", &link, "-o", "copy.bin"]).current_dir(dir));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    no_debug_text(&stderr(&o));
    let o = run_hinted(&stderr(&o), &cache, dir);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(std::fs::read(dir.join("copy.bin")).unwrap(), std::fs::read(dir.join("f.bin")).unwrap());
}
