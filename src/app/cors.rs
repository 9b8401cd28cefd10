//! The CORS settings of the TUS endpoints (`/files/`): which web origins may use them from a
//! browser and which extra headers they may send and read. `http` enforces them; `config`
//! reads them from `[cors]`, `--cors-*` and `FERRY_CORS_*` through [`CorsConfig::new`].

/// Cross-origin access to the TUS endpoints (`/files/`) from web pages (`[cors]` in ferry.toml,
/// `--cors-*` flags, `FERRY_CORS_*`). The API and `/mcp` are never open to other origins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CorsConfig {
    /// The web origins whose pages may upload; a request from another origin is refused with
    /// 403. A page served from ferry's own host is always allowed.
    pub allow_origins: Origins,
    /// Lowercase request header names allowed in addition to the built-in TUS list.
    pub allow_headers: Vec<String>,
    /// Lowercase response header names exposed in addition to the built-in TUS list.
    pub expose_headers: Vec<String>,
}

/// Which web origins may upload from a browser (`[cors] allow_origins`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Origins {
    /// Nothing configured: any origin when the server has tokens (a page needs one to upload),
    /// only the server's own pages when it has none — else any page a browser visits could
    /// upload to a developer's tokenless ferry and fill its disk.
    #[default]
    Default,
    /// `*`, configured: any origin, tokens or not.
    Any,
    /// These exact origins (`scheme://host[:port]`, lowercase, default ports removed).
    Only(Vec<String>),
}

impl Origins {
    /// Whether a page on `origin` (not the server's own) may upload to a server that has
    /// tokens (`tokens`) or none.
    pub fn admits(&self, origin: &str, tokens: bool) -> bool {
        match self {
            Origins::Default => tokens,
            Origins::Any => true,
            Origins::Only(list) => list.iter().any(|o| o.eq_ignore_ascii_case(origin)),
        }
    }
}

impl CorsConfig {
    /// Validate and normalise. Errors name the offending value.
    pub fn new(origins: Option<Vec<String>>, allow_headers: Vec<String>, expose_headers: Vec<String>) -> anyhow::Result<CorsConfig> {
        let allow_origins = match origins {
            None => Origins::Default,
            Some(list) if list.iter().any(|o| o.trim() == "*") => {
                if list.len() > 1 {
                    anyhow::bail!("cors allow_origins: `*` allows every origin; list exact origins or only `*`, not both");
                }
                Origins::Any
            }
            Some(list) if list.is_empty() => anyhow::bail!("cors allow_origins: list at least one origin, or `*` for any"),
            Some(list) => Origins::Only(list.iter().map(|o| normalize_origin(o)).collect::<anyhow::Result<Vec<_>>>()?),
        };
        let names = |list: Vec<String>, key: &str| -> anyhow::Result<Vec<String>> {
            list.iter()
                .map(|h| {
                    let h = h.trim().to_ascii_lowercase();
                    http::HeaderName::from_bytes(h.as_bytes())
                        .map(|_| h.clone())
                        .map_err(|_| anyhow::anyhow!("cors {key}: {h:?} is not a header name"))
                })
                .collect()
        };
        Ok(CorsConfig {
            allow_origins,
            allow_headers: names(allow_headers, "allow_headers")?,
            expose_headers: names(expose_headers, "expose_headers")?,
        })
    }
}

/// What an operator could list in `[cors] allow_origins` to admit pages that send `Origin:
/// origin`, for the words of a refusal: the origin as ferry keeps it, or why listing it is not
/// the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listable {
    /// A web origin (`scheme://host[:port]`, normalised as [`CorsConfig::new`] keeps it).
    Origin(String),
    /// `null` (RFC 6454 §7.3): the opaque origin of sandboxed iframes, `file://` pages, `data:`
    /// URLs and some redirects. Every page can put itself in a sandboxed iframe, so listing
    /// `null` would admit every page, as `*` does.
    Opaque,
    /// Not an origin at all (a path, no scheme): no browser sends it, and the setting refuses it.
    NotAnOrigin,
}

/// [`Listable`] of the `Origin` header value `origin`.
pub fn listable(origin: &str) -> Listable {
    if origin.trim() == "null" {
        return Listable::Opaque;
    }
    match normalize_origin(origin) {
        Ok(o) => Listable::Origin(o),
        Err(_) => Listable::NotAnOrigin,
    }
}

/// An origin as browsers send it (RFC 6454 §6.1): `scheme://host[:port]`, lowercase, without
/// the scheme's default port and without a path; or `null`.
fn normalize_origin(o: &str) -> anyhow::Result<String> {
    let o = o.trim();
    if o == "null" {
        return Ok(o.to_string());
    }
    let bad = || anyhow::anyhow!("cors allow_origins: {o:?} is not an origin like https://app.example.com (scheme://host[:port], no path)");
    let (scheme, authority) = o.split_once("://").ok_or_else(bad)?;
    let uri: http::Uri = o.parse().map_err(|_| bad())?;
    if scheme.is_empty() || authority.is_empty() || authority.contains(['/', '?', '#', '@']) || uri.host().is_none() {
        return Err(bad());
    }
    let scheme = scheme.to_ascii_lowercase();
    let mut authority = authority.to_ascii_lowercase();
    for (s, port) in [("http", ":80"), ("https", ":443")] {
        if scheme == s && authority.ends_with(port) {
            authority.truncate(authority.len() - port.len());
        }
    }
    Ok(format!("{scheme}://{authority}"))
}
