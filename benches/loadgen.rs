//! The HTTP load generator of `benches/peers/run` (issue 6: S2, S3, random ranges of S4): one
//! client for every server, a plain blocking HTTP/1.1 client over `std::net::TcpStream` with
//! keep-alive, bodies sent from memory (no client-side copies) and responses discarded.
//!
//!     rustc -O --edition 2021 benches/loadgen.rs -o target/loadgen   # what benches/peers/run does (std only)
//!     cargo bench --bench loadgen --no-run        # the same, as cargo builds it (target/release/deps/loadgen-*)
//!     loadgen chunks  FILE URL CHUNK_MIB [tus|draft]  # S2: POST, then PATCHes of CHUNK_MIB in order (`64k`: KiB)
//!     loadgen uploads FILE URL N MIB [tus|put]    # S3: N concurrent uploads of MIB each
//!     loadgen ranges  FILE URL N MIB [SEED]       # S4: N random MIB-sized Range GETs of URL
//!     loadgen slow    FILE URL N SECS [PID]       # S6: N uploads at once, each trickling in
//!
//! URL is `http://HOST:PORT/path` (the TUS creation URL for `chunks` and `uploads tus`, the
//! prefix of PUT targets for `uploads put`, the file for `ranges`). FILE is read into memory
//! once; every body is a slice of it. Prints one line of `key=value` pairs: `mbps` (10^6 B/s
//! over the timed part), `secs`, `bytes`, `requests`, and for `uploads` and `ranges` the
//! request latencies `p50_ms` `p99_ms` `max_ms` (`uploads`: each upload's PATCH or PUT,
//! `ranges`: each GET). `ranges` checks every 16th body against FILE. Exits non-zero on any
//! unexpected answer. The TUS uploads it created are listed on stderr (`upload=PATH`), so the
//! caller can delete them. `harness = false`; cargo's trailing `--bench` argument is ignored.
//!
//! `chunks … draft` speaks the IETF resumable-upload draft (interop version 8) instead of TUS:
//! POST with `Upload-Complete: ?0` and `Upload-Length`, then appends
//! (`application/partial-upload`), the last with `Upload-Complete: ?1` — the same requests and
//! bytes as the TUS run, for draft-vs-TUS comparisons.
//!
//! `slow` (issue 14's "1 000 concurrent slow uploads"): N TUS uploads of SECS × 16 KiB each, all
//! open at once on N connections; every PATCH declares its whole length, then each connection
//! sends 16 KiB per second (one thread writes to every socket in turn), so the server holds N
//! bodies in flight for SECS seconds. With PID (the server's), prints the server's `VmRSS` and
//! `VmHWM` (MiB) read at the end of the trickle, before the last bytes go: `rss_mib` `hwm_mib`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Res<T> = Result<T, String>;

struct Url {
    host: String,
    path: String,
}

fn parse_url(u: &str) -> Res<Url> {
    let rest = u.strip_prefix("http://").ok_or_else(|| format!("not an http:// URL: {u}"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    Ok(Url { host: host.to_string(), path: path.to_string() })
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One keep-alive connection.
struct Conn {
    host: String,
    r: Option<BufReader<TcpStream>>,
    scratch: Vec<u8>,
}

impl Conn {
    fn new(host: &str) -> Conn {
        Conn { host: host.to_string(), r: None, scratch: vec![0; 1 << 20] }
    }

    fn stream(&mut self) -> Res<&mut BufReader<TcpStream>> {
        if self.r.is_none() {
            let s = TcpStream::connect(&self.host).map_err(|e| format!("connect {}: {e}", self.host))?;
            s.set_nodelay(true).ok();
            s.set_read_timeout(Some(Duration::from_secs(600))).ok();
            self.r = Some(BufReader::with_capacity(64 << 10, s));
        }
        Ok(self.r.as_mut().expect("connected"))
    }

    /// Send a request with `body` and read the answer. `keep` = keep the response body (else
    /// it is read and discarded; with `check` it is compared against `check`).
    fn request(&mut self, method: &str, path: &str, headers: &[(&str, String)], body: &[u8], keep: bool, check: Option<&[u8]>) -> Res<Response> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.host);
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !body.is_empty() || method != "GET" {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let r = self.stream()?;
        let s = r.get_mut();
        s.write_all(head.as_bytes()).map_err(|e| format!("send: {e}"))?;
        s.write_all(body).map_err(|e| format!("send body: {e}"))?;
        let res = self.read_response(method == "HEAD", keep, check);
        if res.is_err() {
            self.r = None;
        }
        res
    }

    fn read_response(&mut self, head_only: bool, keep: bool, check: Option<&[u8]>) -> Res<Response> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let r = self.r.as_mut().expect("connected");
        let mut line = String::new();
        let status = loop {
            line.clear();
            r.read_line(&mut line).map_err(|e| format!("read status: {e}"))?;
            if line.is_empty() {
                return Err("connection closed before a response".into());
            }
            let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("bad status line {line:?}"))?;
            let mut headers = Vec::new();
            loop {
                line.clear();
                r.read_line(&mut line).map_err(|e| format!("read header: {e}"))?;
                let l = line.trim_end();
                if l.is_empty() {
                    break;
                }
                if let Some((k, v)) = l.split_once(':') {
                    headers.push((k.trim().to_string(), v.trim().to_string()));
                }
            }
            if status == 100 {
                continue;
            }
            break (status, headers);
        };
        let (status, headers) = status;
        let mut res = Response { status, headers, body: Vec::new() };
        let close = res.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let chunked = res.header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let len: Option<u64> = res.header("content-length").and_then(|v| v.parse().ok());
        if head_only || status == 204 || status == 304 {
        } else if chunked {
            loop {
                line.clear();
                r.read_line(&mut line).map_err(|e| format!("read chunk size: {e}"))?;
                let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16).map_err(|_| format!("bad chunk size {line:?}"))?;
                if n == 0 {
                    loop {
                        line.clear();
                        r.read_line(&mut line).map_err(|e| format!("read trailer: {e}"))?;
                        if line.trim_end().is_empty() {
                            break;
                        }
                    }
                    break;
                }
                let mut buf = vec![0; n + 2];
                r.read_exact(&mut buf).map_err(|e| format!("read chunk: {e}"))?;
                if keep {
                    res.body.extend_from_slice(&buf[..n]);
                }
            }
        } else if let Some(mut left) = len {
            let mut at = 0usize;
            while left > 0 {
                let n = (left as usize).min(scratch.len());
                r.read_exact(&mut scratch[..n]).map_err(|e| format!("read body: {e}"))?;
                if keep {
                    res.body.extend_from_slice(&scratch[..n]);
                }
                if let Some(c) = check {
                    if c.get(at..at + n) != Some(&scratch[..n]) {
                        return Err(format!("body differs from the file at byte {at}"));
                    }
                }
                at += n;
                left -= n as u64;
            }
        } else {
            r.read_to_end(&mut res.body).map_err(|e| format!("read body: {e}"))?;
            self.r = None;
        }
        self.scratch = scratch;
        if close {
            self.r = None;
        }
        Ok(res)
    }
}

const TUS: (&str, &str) = ("Tus-Resumable", "1.0.0");

/// POST a TUS upload of `len` bytes; its URL path.
fn tus_create(c: &mut Conn, create_path: &str, len: usize) -> Res<String> {
    let res = c.request("POST", create_path, &[(TUS.0, TUS.1.into()), ("Upload-Length", len.to_string())], &[], false, None)?;
    if res.status != 201 {
        return Err(format!("POST answered {}", res.status));
    }
    let loc = res.header("location").ok_or("POST gave no Location")?;
    Ok(match loc.strip_prefix("http://") {
        Some(rest) => rest[rest.find('/').unwrap_or(rest.len())..].to_string(),
        None => loc.to_string(),
    })
}

fn tus_patch(c: &mut Conn, path: &str, offset: usize, body: &[u8]) -> Res<()> {
    let h = [(TUS.0, TUS.1.into()), ("Content-Type", "application/offset+octet-stream".into()), ("Upload-Offset", offset.to_string())];
    let res = c.request("PATCH", path, &h, body, false, None)?;
    if res.status != 204 && res.status != 200 {
        return Err(format!("PATCH at {offset} answered {}", res.status));
    }
    let got: Option<usize> = res.header("upload-offset").and_then(|v| v.parse().ok());
    if got != Some(offset + body.len()) {
        return Err(format!("PATCH at {offset} of {} bytes answered Upload-Offset {got:?}", body.len()));
    }
    Ok(())
}

const DRAFT: (&str, &str) = ("Upload-Draft-Interop-Version", "8");

/// POST an upload of `len` bytes over the IETF draft, no content yet; its URL path.
fn draft_create(c: &mut Conn, create_path: &str, len: usize) -> Res<String> {
    let h = [(DRAFT.0, DRAFT.1.into()), ("Upload-Complete", "?0".into()), ("Upload-Length", len.to_string())];
    let res = c.request("POST", create_path, &h, &[], false, None)?;
    if res.status != 201 {
        return Err(format!("draft POST answered {}", res.status));
    }
    let loc = res.header("location").ok_or("draft POST gave no Location")?;
    Ok(match loc.strip_prefix("http://") {
        Some(rest) => rest[rest.find('/').unwrap_or(rest.len())..].to_string(),
        None => loc.to_string(),
    })
}

/// An IETF draft append at `offset`; `last` completes the upload.
fn draft_append(c: &mut Conn, path: &str, offset: usize, body: &[u8], last: bool) -> Res<()> {
    let h = [
        (DRAFT.0, DRAFT.1.into()),
        ("Content-Type", "application/partial-upload".into()),
        ("Upload-Offset", offset.to_string()),
        ("Upload-Complete", if last { "?1" } else { "?0" }.into()),
    ];
    let res = c.request("PATCH", path, &h, body, false, None)?;
    if res.status != 204 && res.status != 200 {
        return Err(format!("draft append at {offset} answered {}", res.status));
    }
    let got: Option<usize> = res.header("upload-offset").and_then(|v| v.parse().ok());
    if got != Some(offset + body.len()) {
        return Err(format!("draft append at {offset} of {} bytes answered Upload-Offset {got:?}", body.len()));
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

fn report(bytes: u64, secs: f64, requests: usize, mut lat_ms: Vec<f64>) {
    let mut line = format!("mbps={:.1} secs={secs:.3} bytes={bytes} requests={requests}", bytes as f64 / secs / 1e6);
    if !lat_ms.is_empty() {
        lat_ms.sort_by(f64::total_cmp);
        line.push_str(&format!(
            " p50_ms={:.1} p99_ms={:.1} max_ms={:.1}",
            percentile(&lat_ms, 50.0),
            percentile(&lat_ms, 99.0),
            lat_ms.last().copied().unwrap_or(f64::NAN)
        ));
    }
    println!("{line}");
}

/// Deterministic xorshift64 for the random ranges.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn num(args: &[String], i: usize, what: &str) -> Res<usize> {
    args.get(i).ok_or(format!("missing {what}"))?.parse().map_err(|_| format!("{what} is not a number"))
}

fn run(args: &[String]) -> Res<()> {
    let mode = args.first().ok_or("usage: loadgen chunks|uploads|ranges|slow FILE URL ...")?.as_str();
    let file = std::fs::read(args.get(1).ok_or("missing FILE")?).map_err(|e| format!("reading FILE: {e}"))?;
    let url = parse_url(args.get(2).ok_or("missing URL")?)?;
    match mode {
        "chunks" => {
            // CHUNK_MIB, or `NNk` for KiB (benches/peers/run's S8: many small PATCHes)
            let chunk = match args.get(3).and_then(|a| a.strip_suffix('k')) {
                Some(kib) => kib.parse::<usize>().map_err(|e| format!("CHUNK_MIB {kib}k: {e}"))? << 10,
                None => num(args, 3, "CHUNK_MIB")? << 20,
            };
            let draft = match args.get(4).map(String::as_str) {
                None | Some("tus") => false,
                Some("draft") => true,
                Some(other) => return Err(format!("unknown protocol {other:?} (tus or draft)")),
            };
            let mut c = Conn::new(&url.host);
            let t = Instant::now();
            let path = if draft { draft_create(&mut c, &url.path, file.len())? } else { tus_create(&mut c, &url.path, file.len())? };
            let mut n = 1;
            let parts = file.len().div_ceil(chunk.max(1));
            for (i, part) in file.chunks(chunk.max(1)).enumerate() {
                if draft {
                    draft_append(&mut c, &path, i * chunk, part, i + 1 == parts)?;
                } else {
                    tus_patch(&mut c, &path, i * chunk, part)?;
                }
                n += 1;
            }
            report(file.len() as u64, t.elapsed().as_secs_f64(), n, Vec::new());
            eprintln!("upload={path}");
        }
        "uploads" => {
            let n = num(args, 3, "N")?;
            let size = (num(args, 4, "MIB")? << 20).min(file.len());
            let put = args.get(5).map(String::as_str) == Some("put");
            let file = Arc::new(file);
            let barrier = Arc::new(std::sync::Barrier::new(n + 1));
            let threads: Vec<_> = (0..n)
                .map(|i| {
                    let (file, barrier, host, base) = (file.clone(), barrier.clone(), url.host.clone(), url.path.clone());
                    std::thread::spawn(move || -> Res<f64> {
                        let mut c = Conn::new(&host);
                        // a different slice of the file per upload
                        let start = (i * size) % (file.len() - size + 1);
                        let body = &file[start..start + size];
                        let target = if put { None } else { Some(tus_create(&mut c, &base, size)) };
                        if let Some(Ok(p)) = &target {
                            eprintln!("upload={p}");
                        }
                        barrier.wait();
                        let t = Instant::now();
                        match target {
                            Some(path) => tus_patch(&mut c, &path?, 0, body)?,
                            None => {
                                let res = c.request("PUT", &format!("{}up{i}.bin", base), &[], body, false, None)?;
                                if res.status != 201 && res.status != 204 {
                                    return Err(format!("PUT answered {}", res.status));
                                }
                            }
                        }
                        Ok(t.elapsed().as_secs_f64() * 1e3)
                    })
                })
                .collect();
            barrier.wait();
            let t = Instant::now();
            let mut lat = Vec::with_capacity(n);
            for th in threads {
                lat.push(th.join().map_err(|_| "an upload thread panicked")??);
            }
            report((n * size) as u64, t.elapsed().as_secs_f64(), n, lat);
        }
        "ranges" => {
            let n = num(args, 3, "N")?;
            let size = num(args, 4, "MIB")? << 20;
            let seed = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(0x9e37_79b9_7f4a_7c15u64);
            if size == 0 || size > file.len() {
                return Err("MIB must be between 1 and the file's size".into());
            }
            let mut rng = Rng(seed | 1);
            let mut c = Conn::new(&url.host);
            let mut lat = Vec::with_capacity(n);
            let t = Instant::now();
            for i in 0..n {
                let start = (rng.next() % (file.len() - size + 1) as u64) as usize;
                let check = (i % 16 == 0).then(|| &file[start..start + size]);
                let a = Instant::now();
                let res = c.request("GET", &url.path, &[("Range", format!("bytes={}-{}", start, start + size - 1))], &[], false, check)?;
                lat.push(a.elapsed().as_secs_f64() * 1e3);
                if res.status != 206 || res.header("content-length") != Some(size.to_string().as_str()) {
                    return Err(format!("GET range at {start} answered {} with {:?} bytes", res.status, res.header("content-length")));
                }
            }
            report((n * size) as u64, t.elapsed().as_secs_f64(), n, lat);
        }
        "slow" => {
            const SLICE: usize = 16 << 10;
            let n = num(args, 3, "N")?;
            let secs = num(args, 4, "SECS")?.max(1);
            let pid = args.get(5).map(|p| p.parse::<u32>().map_err(|_| "PID is not a number".to_string())).transpose()?;
            let len = SLICE * secs;
            if len > file.len() {
                return Err("FILE is smaller than SECS × 16 KiB".into());
            }
            let mut conns = Vec::with_capacity(n);
            for i in 0..n {
                let mut c = Conn::new(&url.host);
                let path = tus_create(&mut c, &url.path, len)?;
                eprintln!("upload={path}");
                let head = format!(
                    "PATCH {path} HTTP/1.1\r\nHost: {}\r\nTus-Resumable: 1.0.0\r\nContent-Type: \
                     application/offset+octet-stream\r\nUpload-Offset: 0\r\nContent-Length: {len}\r\n\r\n",
                    url.host
                );
                c.stream()?.get_mut().write_all(head.as_bytes()).map_err(|e| format!("send PATCH {i}: {e}"))?;
                conns.push(c);
            }
            let t = Instant::now();
            let mut memory = None;
            for round in 0..secs {
                let tick = Instant::now();
                let body = &file[round * SLICE..(round + 1) * SLICE];
                if round + 1 == secs {
                    // Every body is open and has received all but its last slice: the peak.
                    memory = pid.map(|p| {
                        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
                        let kib = |key: &str| {
                            status
                                .lines()
                                .find_map(|l| l.strip_prefix(key))
                                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                                .unwrap_or(f64::NAN)
                        };
                        (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
                    });
                }
                for (i, c) in conns.iter_mut().enumerate() {
                    c.stream()?.get_mut().write_all(body).map_err(|e| format!("send slice {round} of upload {i}: {e}"))?;
                }
                if round + 1 < secs {
                    std::thread::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed()));
                }
            }
            for (i, c) in conns.iter_mut().enumerate() {
                let res = c.read_response(false, false, None)?;
                if res.status != 204 || res.header("upload-offset") != Some(len.to_string().as_str()) {
                    return Err(format!("slow upload {i} answered {} at offset {:?}", res.status, res.header("upload-offset")));
                }
            }
            let mut line = format!(
                "mbps={:.1} secs={:.3} bytes={} requests={n}",
                (n * len) as f64 / t.elapsed().as_secs_f64() / 1e6,
                t.elapsed().as_secs_f64(),
                n * len
            );
            if let Some((rss, hwm)) = memory {
                line.push_str(&format!(" rss_mib={rss:.1} hwm_mib={hwm:.1}"));
            }
            println!("{line}");
        }
        other => return Err(format!("unknown mode {other:?}")),
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if let Err(e) = run(&args) {
        eprintln!("loadgen: {e}");
        std::process::exit(1);
    }
}
