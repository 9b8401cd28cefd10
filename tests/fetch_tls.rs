//! The `fetch` kind over `https://`: a loopback HTTPS server (Python's `http.server` wrapped in
//! TLS) with a certificate from a test CA made by the `openssl` command. With the CA in
//! `[fetch] ca_file` the file arrives byte-exact; without it the task fails saying the
//! certificate is not trusted, and nothing is stored; an unreadable `ca_file` stops start-up.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl (apt install openssl)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA (`ca.pem`) and a server certificate for 127.0.0.1 signed by it (`server.pem`, `server.key`).
fn make_certificates(dir: &Path) {
    openssl(
        dir,
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ferry test CA"],
    );
    openssl(dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
}

/// `python3 -m http.server` over TLS serving `root` on a free loopback port.
struct HttpsServer {
    child: Child,
    port: u16,
}

impl HttpsServer {
    fn start(certs: &Path, root: &Path) -> HttpsServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let script = format!(
            "import http.server, ssl, functools\n\
             h = functools.partial(http.server.SimpleHTTPRequestHandler, directory={root:?})\n\
             s = http.server.ThreadingHTTPServer(('127.0.0.1', {port}), h)\n\
             c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n\
             c.load_cert_chain({cert:?}, {key:?})\n\
             s.socket = c.wrap_socket(s.socket, server_side=True)\n\
             s.serve_forever()\n",
            root = root.to_str().unwrap(),
            cert = certs.join("server.pem").to_str().unwrap(),
            key = certs.join("server.key").to_str().unwrap(),
        );
        let child =
            Command::new("python3").arg("-c").arg(script).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("python3");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the HTTPS server never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        HttpsServer { child, port }
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_over_https_trusts_the_configured_ca_and_only_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (certs, root) = (tmp.path().join("certs"), tmp.path().join("www"));
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::create_dir_all(&root).unwrap();
    make_certificates(&certs);
    let data = pseudo_random(3 << 20, 41);
    std::fs::write(root.join("export.bin"), &data).unwrap();
    let https = HttpsServer::start(&certs, &root);
    let url = format!("https://127.0.0.1:{}/export.bin", https.port);
    let args = serde_json::json!({ "url": url }).to_string();

    // Trusted through [fetch] ca_file: the bytes arrive whole.
    let allow = format!("[fetch]\nallow_hosts = [\"127.0.0.1:{}\"]\n", https.port);
    let with_ca = write_file(tmp.path(), "with-ca.toml", &format!("{allow}ca_file = {:?}\n", certs.join("ca.pem").to_str().unwrap()));
    let s = Server::start(&["--config", with_ca.to_str().unwrap()]);
    let api = Api::new(&s);
    let t = api.start("fetch", &args).await;
    let v = api.wait_status(t["id"].as_str().unwrap(), "completed", 60).await;
    let id = v["result"]["file"]["id"].as_str().unwrap_or_else(|| panic!("no file in {v}"));
    assert_eq!(sha256_hex(&api.download(id).await), sha256_hex(&data));
    assert_eq!(api.file(id).await["sha256"], sha256_hex(&data));
    drop(s);

    // The same server without the CA: the certificate is refused, the task fails saying so.
    let without = write_file(tmp.path(), "without-ca.toml", &allow);
    let s = Server::start(&["--config", without.to_str().unwrap()]);
    let api = Api::new(&s);
    let t = api.start("fetch", &args).await;
    let v = api.wait_status(t["id"].as_str().unwrap(), "failed", 120).await;
    let text = v.to_string().to_lowercase();
    assert!(text.contains("certificate") || text.contains("tls"), "the failure names the TLS problem: {v}");
    drop(s);

    // A ca_file that is not a certificate stops start-up with one clear line.
    let junk = write_file(tmp.path(), "junk.pem", "not a certificate\n");
    let bad = write_file(tmp.path(), "bad-ca.toml", &format!("{allow}ca_file = {:?}\n", junk.to_str().unwrap()));
    let out = Command::new(ferry_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(tmp.path().join("d"))
        .arg("--config")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ca_file") && err.contains("junk.pem"), "{err}");
}
