//! The links half of the catalog conformance suite (issue 51): a link comes back as it was
//! made (files in order, the passphrase hash kept), lists per principal, revokes at once and for
//! good, and counts downloads and request files with one winner per unit below the limit, also
//! across two handles on one database. Called from [`super::conformance::run_all`] and
//! [`super::conformance::run_concurrent`].

use super::links::{LinkKind, LinkRecord, PassphraseHash};
use super::{Catalog, CatalogError};

fn link(id: &str, principal: &str, kind: LinkKind, files: &[&str]) -> LinkRecord {
    LinkRecord {
        id: id.to_string(),
        principal: principal.to_string(),
        kind,
        files: files.iter().map(|f| f.to_string()).collect(),
        message: "for the audit: last quarter's exports".into(),
        passphrase_hash: None,
        max_downloads: None,
        downloads: 0,
        max_files: files.len() as u32,
        expires_at_ms: 10_000,
        revoked_at_ms: None,
        created_at_ms: 1_000,
    }
}

pub async fn run_all(cat: &dyn Catalog, p: &str) {
    check_link_roundtrip_and_listing(cat, p).await;
    check_downloads_and_revocation(cat, p).await;
    check_request_slots(cat, p).await;
}

/// What goes in comes out; a taken id is `AlreadyExists`; listing is per principal, newest first.
pub async fn check_link_roundtrip_and_listing(cat: &dyn Catalog, p: &str) {
    let owner = format!("{p}-links-owner");
    let mut a = link(&format!("{p}lnka"), &owner, LinkKind::Share, &["f3", "f1", "f2"]);
    a.passphrase_hash = Some(PassphraseHash("$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".into()));
    a.max_downloads = Some(1);
    cat.create_link(&a).await.unwrap();
    assert_eq!(cat.get_link(&a.id).await.unwrap().as_ref(), Some(&a));
    assert!(matches!(cat.create_link(&a).await, Err(CatalogError::AlreadyExists)));
    let mut b = link(&format!("{p}lnkb"), &owner, LinkKind::Request, &[]);
    b.max_files = 5;
    b.created_at_ms = 2_000;
    cat.create_link(&b).await.unwrap();
    let other = link(&format!("{p}lnkc"), &format!("{p}-someone-else"), LinkKind::Share, &["x"]);
    cat.create_link(&other).await.unwrap();
    let listed: Vec<String> = cat.list_links(&owner, 10).await.unwrap().into_iter().map(|l| l.id).collect();
    assert_eq!(listed, vec![b.id.clone(), a.id.clone()]);
    assert_eq!(cat.list_links(&owner, 1).await.unwrap().len(), 1);
    assert_eq!(cat.get_link(&format!("{p}nosuchlink")).await.unwrap(), None);
    assert_eq!(cat.link_of_file("f1").await.unwrap(), Some(a.id.clone()));
    assert_eq!(cat.link_of_file(&format!("{p}-no-such-file")).await.unwrap(), None);
    // The hash never shows in a record's Debug.
    assert!(!format!("{a:?}").contains("argon2"));
}

/// A limit of 2 hands out exactly 2; an expired or revoked link none; revocation is only by
/// its principal and keeps its first time.
pub async fn check_downloads_and_revocation(cat: &dyn Catalog, p: &str) {
    let owner = format!("{p}-links-dl");
    let mut l = link(&format!("{p}lnkdl"), &owner, LinkKind::Share, &["f"]);
    l.max_downloads = Some(2);
    cat.create_link(&l).await.unwrap();
    assert!(cat.take_download(&l.id, 5_000).await.unwrap());
    assert!(cat.take_download(&l.id, 5_000).await.unwrap());
    assert!(!cat.take_download(&l.id, 5_000).await.unwrap(), "a third download of a two-download link");
    let got = cat.get_link(&l.id).await.unwrap().unwrap();
    assert_eq!(got.downloads, 2);
    assert!(got.used_up());

    let open = link(&format!("{p}lnkopen"), &owner, LinkKind::Share, &["f"]);
    cat.create_link(&open).await.unwrap();
    for _ in 0..5 {
        assert!(cat.take_download(&open.id, 5_000).await.unwrap(), "no limit");
    }
    assert!(!cat.take_download(&open.id, 10_000).await.unwrap(), "expired at 10 000");
    assert!(!cat.revoke_link("someone-else", &open.id, 6_000).await.unwrap(), "only its principal revokes it");
    assert!(cat.revoke_link(&owner, &open.id, 6_000).await.unwrap());
    assert!(cat.revoke_link(&owner, &open.id, 7_000).await.unwrap(), "revoking again is no error");
    assert_eq!(cat.get_link(&open.id).await.unwrap().unwrap().revoked_at_ms, Some(6_000));
    assert!(!cat.take_download(&open.id, 6_500).await.unwrap(), "revoked");
    assert!(!cat.take_download(&format!("{p}nosuchlink"), 5_000).await.unwrap());
}

/// A request of 2 files gives slots 0 and 1, then none; a share, a revoked request none.
pub async fn check_request_slots(cat: &dyn Catalog, p: &str) {
    let owner = format!("{p}-links-rq");
    let mut r = link(&format!("{p}lnkrq"), &owner, LinkKind::Request, &[]);
    r.max_files = 2;
    cat.create_link(&r).await.unwrap();
    let s0 = cat.take_file_slot(&r.id, 5_000).await.unwrap().unwrap();
    let s1 = cat.take_file_slot(&r.id, 5_000).await.unwrap().unwrap();
    assert_eq!((s0, s1), (0, 1));
    assert_eq!(cat.take_file_slot(&r.id, 5_000).await.unwrap(), None, "full");
    cat.record_link_file(&r.id, s1, "second").await.unwrap();
    cat.record_link_file(&r.id, s0, "first").await.unwrap();
    assert_eq!(cat.get_link(&r.id).await.unwrap().unwrap().files, vec!["first".to_string(), "second".to_string()]);
    assert!(matches!(cat.record_link_file(&r.id, s0, "again").await, Err(CatalogError::AlreadyExists)));
    let share = link(&format!("{p}lnkrqs"), &owner, LinkKind::Share, &["f"]);
    cat.create_link(&share).await.unwrap();
    assert_eq!(cat.take_file_slot(&share.id, 5_000).await.unwrap(), None, "a share takes no files");
    let mut r2 = link(&format!("{p}lnkrq2"), &owner, LinkKind::Request, &[]);
    r2.max_files = 9;
    cat.create_link(&r2).await.unwrap();
    assert_eq!(cat.take_file_slot(&r2.id, 10_000).await.unwrap(), None, "expired");
    cat.revoke_link(&owner, &r2.id, 5_000).await.unwrap();
    assert_eq!(cat.take_file_slot(&r2.id, 5_500).await.unwrap(), None, "revoked");
}

/// Two handles (two replicas) counting one link's downloads at once: exactly the limit wins.
pub async fn check_racing_downloads(a: &dyn Catalog, b: &dyn Catalog, p: &str) {
    let mut l = link(&format!("{p}lnkrace"), "racer", LinkKind::Share, &["f"]);
    l.max_downloads = Some(7);
    a.create_link(&l).await.unwrap();
    async fn take(c: &dyn Catalog, id: &str) -> u32 {
        let mut won = 0;
        for _ in 0..10 {
            if c.take_download(id, 5_000).await.unwrap() {
                won += 1;
            }
        }
        won
    }
    let (x, y) = tokio::join!(take(a, &l.id), take(b, &l.id));
    assert_eq!(x + y, 7, "{x} + {y} downloads of a seven-download link");
}
