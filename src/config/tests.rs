use super::*;
use crate::app::Origins;
use crate::units::parse_size;

#[test]
fn sizes_and_expiry() {
    assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
    assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
    assert_eq!(parse_size("1TiB").unwrap(), 1 << 40);
    assert!(parse_size("lots").is_err());
    assert!(parse_size("0").is_err());
    assert!(parse_size("16EiB").is_err());
    assert!(parse_expiry("0s").is_err());
    assert_eq!(parse_expiry("8000y").unwrap(), Expiry(Some(Duration::from_secs(100 * 365 * 86_400))));
    assert!(parse_interval("0s").is_err());
    assert_eq!(parse_expiry("never").unwrap(), Expiry(None));
    assert_eq!(parse_expiry("2s").unwrap(), Expiry(Some(Duration::from_secs(2))));
}

#[test]
fn file_values_that_could_never_work_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    let bad = [
        "[[tokens]]\nprincipal = \"a\"\nsha256 = \"nothex\"\n",
        "[[tokens]]\nprincipal = \"a b/../x\"\nsha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"\n",
        "[commands.\"bad name\"]\nprogram = \"/bin/true\"\n",
        "[tasks]\nworkers = 100000\n",
        "[[tokens]]\nprincipal = \"a\"\nsha256 = \"E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855\"\n",
        "url_secret = \"\"\n",
        "url_secret = \"0000000000000000000000000000000000000000000000000000000000000000\"\n",
        "[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_\"\n",
        "[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_c2hvcnQ=\"\n",
        "[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"\n",
        "[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
    ];
    for text in bad {
        std::fs::write(&path, text).unwrap();
        let args = ServeArgs { config: Some(path.clone()), ..Default::default() };
        assert!(Config::resolve(&args).is_err(), "accepted: {text}");
    }
}

#[test]
fn cors_origins_and_headers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    std::fs::write(
        &path,
        "[cors]\nallow_origins = [\"HTTPS://App.Example:443\", \"http://localhost:5173\", \"null\"]\nallow_headers = [\"X-Custom\"]\n",
    )
    .unwrap();
    let c = Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap();
    assert_eq!(c.cors.allow_origins, Origins::Only(vec!["https://app.example".to_string(), "http://localhost:5173".into(), "null".into()]));
    assert_eq!(c.cors.allow_headers, vec!["x-custom".to_string()]);
    // Flags replace the file's list.
    let args = ServeArgs { config: Some(path.clone()), cors_allow_origins: vec!["*".into()], ..Default::default() };
    assert_eq!(Config::resolve(&args).unwrap().cors.allow_origins, Origins::Any, "`*` configured");
    assert_eq!(
        Config::resolve(&ServeArgs::default()).unwrap().cors,
        CorsConfig::default(),
        "default: any origin with tokens, the server's own without"
    );
    for bad in [
        "[cors]\nallow_origins = [\"https://app.example/path\"]\n",
        "[cors]\nallow_origins = [\"app.example\"]\n",
        "[cors]\nallow_origins = [\"*\", \"https://a.example\"]\n",
        "[cors]\nallow_origins = []\n",
        "[cors]\nallow_headers = [\"bad header\"]\n",
        "[cors]\nexpose = [\"x\"]\n",
    ] {
        std::fs::write(&path, bad).unwrap();
        assert!(Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).is_err(), "accepted: {bad}");
    }
}

#[test]
fn flags_beat_file_beats_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    std::fs::write(&path, "max_size = \"2GiB\"\nlisten = \"127.0.0.1:9000\"\ndurability = \"relaxed\"\n").unwrap();
    let args = ServeArgs { config: Some(path), listen: Some("127.0.0.1:9999".into()), ..Default::default() };
    let c = Config::resolve(&args).unwrap();
    assert_eq!(c.listen.port(), 9999);
    assert_eq!(c.max_size, 2 << 30);
    assert_eq!(c.durability, Durability::Relaxed);
    assert_eq!(c.checkpoint_every, 64 << 20);
    assert_eq!(c.min_free_space, crate::exhaustion::Reserve::Default);
    assert_eq!(c.max_connections, None);
    assert_eq!(c.catalog, CatalogUrl::Sqlite(c.data.join("ferry.db")), "default catalog: SQLite in the data dir");
    assert_eq!(c.blobs, BlobLocation::Dir(c.data.join("blobs")));
}

#[test]
fn free_space_reserve_and_connection_cap_from_file_and_flags() {
    use crate::exhaustion::Reserve;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    std::fs::write(&path, "min_free_space = \"10%\"\nmax_connections = 500\n").unwrap();
    let c = Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap();
    assert_eq!((c.min_free_space, c.max_connections), (Reserve::Percent(10), Some(500)));
    let c = Config::resolve(&ServeArgs { config: Some(path.clone()), min_free_space: Some(Reserve::Bytes(0)), ..Default::default() }).unwrap();
    assert_eq!(c.min_free_space, Reserve::Bytes(0));
    std::fs::write(&path, "min_free_space = 1048576\n").unwrap();
    assert_eq!(Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap().min_free_space, Reserve::Bytes(1 << 20));
    for bad in ["min_free_space = \"lots\"\n", "min_free_space = \"150%\"\n", "max_connections = 0\n"] {
        std::fs::write(&path, bad).unwrap();
        assert!(Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).is_err(), "accepted: {bad}");
    }
}

#[test]
fn limits_default_and_per_principal_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    std::fs::write(
        &path,
        "[limits]\nmax_bytes = \"1GiB\"\nmax_uploads_in_progress = 5\nretain_finished = \"30d\"\n\n[limits.principals.alice]\n\
         max_bytes = \"unlimited\"\nretain_finished = \"never\"\n\n[limits.principals.bob]\nmax_uploads_in_progress = 0\n",
    )
    .unwrap();
    let l = Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap().limits;
    let day = Duration::from_secs(86_400);
    assert_eq!(l.of("carol"), crate::upload::Limits { max_bytes: Some(1 << 30), max_uploads_in_progress: Some(5), retain_finished: Some(30 * day) });
    assert_eq!(
        l.of("alice"),
        crate::upload::Limits { max_bytes: None, max_uploads_in_progress: Some(5), retain_finished: None },
        "keys left out are the default's"
    );
    assert_eq!(l.of("bob").max_uploads_in_progress, Some(0));
    assert_eq!(Config::resolve(&ServeArgs::default()).unwrap().limits, crate::upload::PrincipalLimits::default(), "no limits by default");
    for bad in [
        "[limits]\nmax_bytes = \"lots\"\n",
        "[limits]\nmax_uploads_in_progress = -1\n",
        "[limits]\nretain_finished = \"0s\"\n",
        "[limits]\nmax_files = 3\n",
        "[limits.principals.\"a b\"]\nmax_bytes = 1\n",
        "[limits.principals.x]\nmax = 1\n",
    ] {
        std::fs::write(&path, bad).unwrap();
        assert!(Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).is_err(), "accepted: {bad}");
    }
}

#[test]
fn listen_takes_ip_addresses_and_host_names() {
    assert_eq!(parse_listen("127.0.0.1:8080").unwrap(), vec!["127.0.0.1:8080".parse::<SocketAddr>().unwrap()]);
    assert_eq!(parse_listen("[::1]:0").unwrap(), vec!["[::1]:0".parse::<SocketAddr>().unwrap()]);
    let local = parse_listen("localhost:8080").unwrap();
    assert!(local.iter().all(|a| a.ip().is_loopback() && a.port() == 8080), "{local:?}");
    assert!(local[0].is_ipv4() || local.iter().all(|a| a.is_ipv6()), "IPv4 first: {local:?}");
    for bad in ["localhost", ":8080", "localhost:http", "localhost:70000", "no-such-host.invalid:1"] {
        assert!(parse_listen(bad).is_err(), "accepted {bad}");
    }
}

#[test]
fn catalog_from_flag_file_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    std::fs::write(&path, "catalog = \"postgres://ferry:hunter2@127.0.0.1/ferry\"\n").unwrap();
    let c = Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap();
    assert_eq!(c.catalog, CatalogUrl::Postgres("postgres://ferry:hunter2@127.0.0.1/ferry".into()));
    let args = ServeArgs { config: Some(path.clone()), catalog: Some("sqlite:/var/lib/ferry/x.db".into()), ..Default::default() };
    assert_eq!(Config::resolve(&args).unwrap().catalog, CatalogUrl::Sqlite("/var/lib/ferry/x.db".into()), "the flag beats the file");
    let args = ServeArgs { catalog: Some("mysql://u:hunter2@h/db".into()), ..Default::default() };
    let e = format!("{:#}", Config::resolve(&args).unwrap_err());
    assert!(e.contains("sqlite:PATH") && !e.contains("hunter2"), "{e}");
}

/// One setting, one check, one sentence, whichever source it came from (file, flag, env):
/// task workers, sizes, and `[fetch] allow_hosts`, which once took a URL and allowed nothing.
#[test]
fn every_source_of_a_setting_gets_the_same_check() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    let refused = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let e = Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).map(|_| ()).unwrap_err();
        let full = format!("{e:#}");
        full.strip_prefix(&format!("in {}: ", path.display())).unwrap_or(&full).to_string()
    };
    let flag = parse_task_workers("0").unwrap_err();
    assert_eq!(flag, "must be 1 to 256, not 0");
    assert_eq!(refused("[tasks]\nworkers = 0\n"), format!("[tasks] workers {flag}"));
    assert_eq!(parse_task_workers("257").unwrap_err(), "must be 1 to 256, not 257");
    assert!(parse_task_workers("four").unwrap_err().contains("not a whole number"));
    assert_eq!(parse_task_workers(" 256 "), Ok(256));

    let flag = parse_size("0").unwrap_err();
    assert_eq!(refused("max_size = 0\n"), format!("max_size: {flag}"));
    assert_eq!(refused("max_size = \"0\"\n"), format!("max_size: {flag}"));

    let e = refused("[fetch]\nallow_hosts = [\"https://files.example.com:8443/exports/\"]\n");
    assert!(e.starts_with("[fetch] allow_hosts: ") && e.contains("is a URL") && e.contains("\"files.example.com:8443\""), "{e}");
    for bad in ["", "files.example.com:99999", "files example.com", "/exports"] {
        let e = refused(&format!("[fetch]\nallow_hosts = [{bad:?}]\n"));
        assert!(e.contains("names no host"), "{bad:?}: {e}");
    }
    std::fs::write(&path, "[fetch]\nallow_hosts = [\"files.example.com\", \"10.0.0.5:8080\", \"[::1]:8443\", \"::1\", \"Files.Example.COM.\"]\n")
        .unwrap();
    Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap();
}

#[test]
fn s3_deferred_part_size_from_file_and_flag_within_s3s_part_limits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    let resolve = |args: ServeArgs| Config::resolve(&ServeArgs { config: Some(path.clone()), ..args });
    std::fs::write(&path, "").unwrap();
    assert_eq!(resolve(ServeArgs::default()).unwrap().s3.deferred_part_size, crate::blob::s3::DEFAULT_DEFERRED_PART);
    std::fs::write(&path, "[s3]\ndeferred_part_size = \"32MiB\"\n").unwrap();
    assert_eq!(resolve(ServeArgs::default()).unwrap().s3.deferred_part_size, 32 << 20);
    assert_eq!(
        resolve(ServeArgs { s3_deferred_part_size: Some(8 << 20), ..Default::default() }).unwrap().s3.deferred_part_size,
        8 << 20,
        "the flag beats the file"
    );
    let e = resolve(ServeArgs { s3_deferred_part_size: Some(1 << 20), ..Default::default() }).unwrap_err().to_string();
    assert!(e.contains("deferred_part_size") && e.contains("5MiB to 5GiB"), "{e}");
}

#[test]
fn s3_parts_in_flight_from_file_and_flag_within_one_to_sixteen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    let resolve = |args: ServeArgs| Config::resolve(&ServeArgs { config: Some(path.clone()), ..args });
    std::fs::write(&path, "").unwrap();
    assert_eq!(resolve(ServeArgs::default()).unwrap().s3.parts_in_flight, crate::blob::s3::DEFAULT_PARTS_IN_FLIGHT);
    std::fs::write(&path, "[s3]\nparts_in_flight = 4\n").unwrap();
    assert_eq!(resolve(ServeArgs::default()).unwrap().s3.parts_in_flight, 4);
    assert_eq!(resolve(ServeArgs { s3_parts_in_flight: Some(1), ..Default::default() }).unwrap().s3.parts_in_flight, 1, "the flag beats the file");
    for bad in [0, 17] {
        let e = resolve(ServeArgs { s3_parts_in_flight: Some(bad), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("parts_in_flight") && e.contains("1 to 16"), "{bad}: {e}");
        std::fs::write(&path, format!("[s3]\nparts_in_flight = {bad}\n")).unwrap();
        assert!(resolve(ServeArgs::default()).is_err(), "file accepted {bad}");
        std::fs::write(&path, "").unwrap();
    }
}
