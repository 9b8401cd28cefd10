use super::layout::*;
use super::*;
use std::io::Read;

fn crc(data: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(data);
    c.sum()
}

fn md(filename: &str) -> String {
    let mut m = ferry_tus::UploadMetadata::new();
    m.insert("filename", Some(filename.as_bytes().to_vec())).unwrap();
    m.to_string()
}

/// Build an archive in memory the way the job does, resuming (layout-wise) nowhere.
fn build(format: Format, files: &[(&str, &[u8])]) -> Vec<u8> {
    let members: Vec<Member> = files.iter().map(|(n, d)| Member { name: n.to_string(), size: d.len() as u64, mtime: 1_700_000_000 }).collect();
    let layout = Layout::new(format, &members);
    let mut out = Vec::new();
    let mut crcs = Vec::new();
    for (i, (_, d)) in files.iter().enumerate() {
        assert_eq!(out.len() as u64, layout.position(i, 0));
        out.extend(layout.header(i));
        if !d.is_empty() {
            out.extend_from_slice(&d[..1]);
            assert_eq!(out.len() as u64, layout.position(i, 1));
            out.extend_from_slice(&d[1..]);
        }
        let c = crc(d);
        out.extend(layout.trailer(i, c));
        crcs.push(c);
    }
    out.extend(layout.end(&crcs));
    assert_eq!(out.len() as u64, layout.len);
    out
}

#[test]
fn sanitizes_names() {
    assert_eq!(sanitize_name("/etc/passwd").as_deref(), Some("etc/passwd"));
    assert_eq!(sanitize_name("../../x/./y//z").as_deref(), Some("x/y/z"));
    assert_eq!(sanitize_name("C:\\dir\\f.txt").as_deref(), Some("C:/dir/f.txt"));
    assert_eq!(sanitize_name("a\nb\0c").as_deref(), Some("a_b_c"));
    assert_eq!(sanitize_name("../.."), None);
    assert_eq!(sanitize_name(""), None);
    assert_eq!(sanitize_name(&"é".repeat(1000)).unwrap().len(), 1024);
}

#[test]
fn dedupes_and_falls_back_to_ids() {
    let a = md("report.pdf");
    let b = md("/report.pdf");
    let c = md("report-1.pdf");
    let d = md("..");
    let e = md(".bashrc");
    let names = member_names([
        ("id1", a.as_str()),
        ("id2", b.as_str()),
        ("id3", c.as_str()),
        ("id4", d.as_str()),
        ("id5", ""),
        ("id6", e.as_str()),
        ("id7", e.as_str()),
        ("id8", "garbage !!"),
    ]);
    assert_eq!(names, ["report.pdf", "report-1.pdf", "report-1-1.pdf", "id4", "id5", ".bashrc", ".bashrc-1", "id8"]);
    let mut t = HashSet::new();
    assert_eq!(dedupe("d.x/f", &mut t), "d.x/f");
    assert_eq!(dedupe("d.x/f", &mut t), "d.x/f-1");
}

#[test]
fn crc_combines() {
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    for split in [0, 1, 5, 4096, 77_777, 100_000] {
        let (a, b) = data.split_at(split);
        assert_eq!(crc32_combine(crc(a), crc(b), b.len() as u64), crc(&data), "split {split}");
    }
    // Resuming twice.
    let (a, rest) = data.split_at(10);
    let (b, c) = rest.split_at(50_000);
    let ab = crc32_combine(crc(a), crc(b), b.len() as u64);
    assert_eq!(crc32_combine(ab, crc(c), c.len() as u64), crc(&data));
}

#[test]
fn tar_reads_back() {
    let long = format!("{}/{}.bin", "d".repeat(80), "n".repeat(60));
    let big = vec![7u8; 1000];
    let files: Vec<(&str, &[u8])> = vec![("a.txt", b"hello"), ("dir/empty", b""), (&long, &big), ("x", &[1u8; 512])];
    let bytes = build(Format::Tar, &files);
    assert_eq!(bytes.len() % 512, 0);
    let mut ar = tar::Archive::new(&bytes[..]);
    let mut seen = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().to_string_lossy().into_owned();
        assert_eq!(e.header().mode().unwrap(), 0o644);
        assert_eq!(e.header().mtime().unwrap(), 1_700_000_000);
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        seen.push((path, data));
    }
    let want: Vec<(String, Vec<u8>)> = files.iter().map(|(n, d)| (n.to_string(), d.to_vec())).collect();
    assert_eq!(seen, want);
}

#[test]
fn tar_header_sizes() {
    let m = Member { name: "a".into(), size: 10 << 30, mtime: 0 };
    let h = tar_header(&m);
    assert_eq!(h.len(), 512);
    let hdr = tar::Header::from_byte_slice(&h);
    assert_eq!(hdr.size().unwrap(), 10 << 30);
    assert_eq!(hdr.cksum().unwrap(), {
        let mut c = hdr.clone();
        c.set_cksum();
        c.cksum().unwrap()
    });
    let long = Member { name: "x".repeat(300), size: 1, mtime: 0 };
    assert_eq!(tar_header(&long).len(), 512 + 512 + 512);
}

#[test]
fn zip_reads_back() {
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let files: Vec<(&str, &[u8])> = vec![("a.txt", b"hello"), ("dir/empty", b""), ("caf\u{e9}/b.bin", &big)];
    let bytes = build(Format::Zip, &files);
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    assert_eq!(z.len(), 3);
    for (i, (name, data)) in files.iter().enumerate() {
        let mut f = z.by_index(i).unwrap();
        assert_eq!(f.name().unwrap(), *name);
        assert_eq!(f.size(), data.len() as u64);
        assert_eq!(f.crc32(), crc(data));
        assert_eq!(f.unix_mode(), Some(0o100644));
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        assert_eq!(&got, data);
    }
}

#[test]
fn zip64_records() {
    // A member over 4 GiB: zip64 local extra, 8-byte descriptor, zip64 central extra, and
    // the central directory past 4 GiB needs the zip64 end records.
    let m = Member { name: "big".into(), size: 5 << 30, mtime: 0 };
    let lh = zip_local_header(&m, 0);
    assert_eq!(lh.len(), 30 + 3 + 20);
    assert_eq!(&lh[18..26], &[0xFF; 8]);
    assert_eq!(zip_descriptor(&m, 1).len() as u64, zip_descriptor_len(&m));
    let members = [m];
    let layout = Layout::new(Format::Zip, &members);
    let cd_offset = layout.starts[1];
    assert_eq!(cd_offset, 53 + (5 << 30) + 24);
    let end = layout.end(&[42]);
    assert_eq!(end.len() as u64, layout.len - cd_offset);
    // central header (46 + 3 + 4 + 16) + zip64 end (56) + locator (20) + end (22)
    assert_eq!(end.len(), 69 + 56 + 20 + 22);
    let eocd = &end[end.len() - 22..];
    assert_eq!(&eocd[16..20], &[0xFF; 4]);
    let eocd64 = &end[69..69 + 56];
    assert_eq!(u64::from_le_bytes(eocd64[48..56].try_into().unwrap()), cd_offset);
}

#[test]
fn dos_dates() {
    // 2023-11-14 22:13:20 UTC
    let (t, d) = dos_datetime(1_700_000_000);
    assert_eq!(d, ((2023 - 1980) << 9) | (11 << 5) | 14);
    assert_eq!(t, (22 << 11) | (13 << 5) | 10);
    assert_eq!(dos_datetime(0), (0, (1 << 5) | 1));
    // 2000-02-29 00:00:00
    assert_eq!(dos_datetime(951_782_400).1, (20 << 9) | (2 << 5) | 29);
}

#[test]
fn validates_shape() {
    let ok = |s: &str| parse_args(&RawValue::from_string(s.to_string()).unwrap()).is_ok();
    assert!(ok(r#"{"files":["a"],"format":"tar"}"#), "the deprecated name");
    assert!(ok(r#"{"file_ids":["a"],"format":"tar"}"#));
    assert!(!ok(r#"{"file_ids":["a"],"files":["b"],"format":"tar"}"#), "one name at a time");
    assert!(ok(r#"{"files":["a","b"],"format":"zip","name":"out.zip"}"#));
    assert!(!ok(r#"{"files":[],"format":"tar"}"#));
    assert!(!ok(r#"{"files":["a"],"format":"rar"}"#));
    assert!(!ok(r#"{"files":[1],"format":"tar"}"#));
    assert!(!ok(r#"{"files":"a","format":"tar"}"#));
    let many = serde_json::json!({"files": vec!["a"; MAX_MEMBERS + 1], "format": "tar"}).to_string();
    assert!(!ok(&many));
}
