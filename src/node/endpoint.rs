//! A node URL read once, into what connecting needs. That is the name
//! shown to people (never the password), the server's identity, the route
//! and the handshake bytes.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use super::resolve::Resolver;
use super::restart_guard;
use crate::error::ConfigError;
use crate::store::script;

/// A parsed node URL.
pub(crate) struct Endpoint {
    /// `host:port`, `tls host:port`, or the socket path; never the password.
    pub(crate) name: Arc<str>,
    /// What makes two nodes the same server: the address without the db.
    pub(crate) identity: String,
    /// Address only: no password, no db, no `CLIENT SETINFO`; we do the
    /// handshake ourselves, against the round's deadline.
    pub(super) client: redis::Client,
    /// How the node is reached.
    pub(super) route: Route,
    /// What a new connection sends first, packed (see [`handshake`]).
    pub(super) handshake: Vec<u8>,
    /// How many replies `AUTH` and `SELECT` give; an error there fails the
    /// connection. A `SCRIPT LOAD` reply per script follows; an error there
    /// means the scripts go as `EVAL`.
    pub(super) checked_replies: usize,
    /// The handshake begins with `AUTH`.
    pub(super) sends_auth: bool,
    /// What to check in the URL when the node refuses to authenticate us.
    pub(super) auth_hint: &'static str,
    /// The restarts of this node that the restart guard saw.
    pub(super) restarts: restart_guard::Seen,
}

impl Endpoint {
    /// Parses a node URL: `redis://`, `valkey://`, `redis+unix://`,
    /// `valkey+unix://`, or with the `tls` feature `rediss://`, `valkeys://`.
    /// User, password and db are read as the redis crate does.
    pub(crate) fn parse(url: &str) -> Result<Endpoint, ConfigError> {
        let bad = |reason: String| ConfigError::NodeUrl {
            url: redact(url),
            reason,
        };
        check_scheme(url).map_err(bad)?;
        let info: ConnectionInfo = url
            .into_connection_info()
            .map_err(|e| bad(diagnose(url).unwrap_or_else(|| e.to_string())))?;
        let redis = info.redis_settings();
        if redis.db() < 0 {
            return Err(bad(format!(
                "the database number {} is negative; databases are numbered from 0",
                redis.db()
            )));
        }
        let route = route(info.addr()).map_err(bad)?;
        // A TLS node is the same server as a plain one at its address.
        let addr = info.addr().to_string();
        let unix = matches!(info.addr(), ConnectionAddr::Unix(_));
        let name = match info.addr() {
            ConnectionAddr::TcpTls { .. } => format!("tls {addr}"),
            _ => addr.clone(),
        };
        let identity = match unix {
            true => format!("unix {addr}"),
            false => format!("tcp {}", addr.to_ascii_lowercase()),
        };
        let (handshake, checked_replies) = handshake(redis);
        let bare = info
            .clone()
            .set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name())
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(bare).map_err(|e| bad(e.to_string()))?;
        Ok(Endpoint {
            name: name.into(),
            identity,
            client,
            route,
            handshake,
            checked_replies,
            sends_auth: redis.password().is_some(),
            auth_hint: auth_hint(redis.username().is_some(), redis.password().is_some(), unix),
            restarts: restart_guard::Seen::default(),
        })
    }
}

/// What to check in the URL when the node refuses to authenticate us.
/// Never quotes the URL: a misplaced password (`redis://secret@host`)
/// would show.
fn auth_hint(user: bool, password: bool, unix: bool) -> &'static str {
    match (user, password, unix) {
        (_, true, false) => "check the password: redis://:password@host:port",
        (_, true, true) => "check the URL's ?pass= (and ?user=)",
        (true, false, false) => {
            "the URL names a user but gives no password: redis://:password@host:port"
        }
        (false, false, false) => "the server asks for a password: redis://:password@host:port",
        (_, false, true) => "the server asks for a password: ?pass=password (and &user=name)",
    }
}

/// Which part of a URL the redis crate refused, and why, in words. The
/// scheme is known to be ours. `None` when no part looks wrong; the redis
/// crate's message then stands. Like the redacted URL, it quotes nothing
/// before the address's last `@`.
fn diagnose(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme.ends_with("unix") {
        return diagnose_unix(rest);
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    if tail.contains('@') {
        return Some(
            "the user name or password holds a '/', '?' or '#', which ends the host part: \
             percent-encode it ('/' as %2F, '?' as %3F, '#' as %23)"
                .to_string(),
        );
    }
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let Some((inside, after)) = bracketed.split_once(']') else {
            return Some("the IPv6 address has no closing ']'".to_string());
        };
        if inside.parse::<std::net::Ipv6Addr>().is_err() {
            return Some(format!("the host [{inside}] is not an IPv6 address"));
        }
        match (after, after.strip_prefix(':')) {
            ("", _) => (inside, None),
            (_, Some(port)) => (inside, Some(port)),
            (_, None) => return Some(format!("`{after}` after the IPv6 address: expected :port")),
        }
    } else if host_port.matches(':').count() > 1 {
        return Some(
            "more than one ':' after the host: an IPv6 address goes in brackets \
             (redis://[::1]:6379), a password before an '@' (redis://:password@host:port)"
                .to_string(),
        );
    } else {
        (host_port.split_once(':')).map_or((host_port, None), |(host, port)| (host, Some(port)))
    };
    if host.is_empty() {
        return Some("the host is missing: expected redis://host:port".to_string());
    }
    if let Some(port) = port.filter(|p| !p.is_empty() && !matches!(p.parse::<u16>(), Ok(1..))) {
        return Some(format!("the port `{port}` is not a number from 1 to 65535"));
    }
    if let Some(c) = host
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || "<>\\^|%[]".contains(*c))
    {
        return Some(format!(
            "the host `{host}` holds {c:?}, which no host name may hold"
        ));
    }
    let path = tail.split(['?', '#']).next().unwrap_or("");
    let db = path.trim_matches('/');
    if !db.is_empty() && db.parse::<i64>().is_err() {
        return Some(format!(
            "the database `{db}` (after the host's '/') is not a number"
        ));
    }
    None
}

/// [`diagnose`] for a Unix socket URL (after the `://`).
fn diagnose_unix(rest: &str) -> Option<String> {
    let path = rest.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') || path == "/" {
        return Some(
            "the socket path is missing or not absolute: expected redis+unix:///path/to/socket (three slashes)"
                .to_string(),
        );
    }
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    let db = query.split('&').find_map(|pair| pair.strip_prefix("db="));
    if let Some(db) = db.filter(|db| db.parse::<i64>().is_err()) {
        return Some(format!("the database `{db}` (?db=) is not a number"));
    }
    None
}

/// How a node is reached.
pub(super) enum Route {
    /// A TCP address.
    Ip(SocketAddr),
    /// A TCP host name, resolved on each connect.
    Name(Resolver),
    /// A Unix socket.
    #[cfg(unix)]
    Unix(std::path::PathBuf),
    /// Through the `redis` crate's own connection (TLS), which cannot split.
    Unsplit,
}

/// The URL with any password replaced by `***`, for error messages. That
/// hides the one before the `@`, and every query value but `db` and `user`.
pub(crate) fn redact(url: &str) -> String {
    // Without a "://" (a mistyped scheme, say) the text may still hold a
    // password before an '@': read it all as the address.
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    // What to hide, as ranges of `url`.
    let mut hide = Vec::new();
    match rest.rfind('@') {
        // The last '@' anywhere: a password may hold a raw '/', '?' or '#',
        // and that malformed URL's error must still hide it. Without a ':'
        // the one name may be a password missing its colon.
        Some(at) => {
            hide.push(scheme_end + rest[..at].find(':').map_or(0, |c| c + 1)..scheme_end + at)
        }
        // An address that starts with ':' is a password whose '@' was
        // left out: hide the whole address.
        None if rest.starts_with(':') => {
            hide.push(
                scheme_end + 1..scheme_end + rest.find(['/', '?', '#']).unwrap_or(rest.len()),
            );
        }
        None => {}
    }
    // The query as written, even holding that '@': only `db` and `user`
    // show. The redis crate decodes names, so `pa%73s` is `pass` too.
    if let Some(mut at) = url.find('?').map(|q| q + 1) {
        for pair in url[at..].split('&') {
            let name = pair.split_once('=').map(|(name, _)| name);
            if let Some(name) = name.filter(|&name| name != "db" && name != "user") {
                hide.push(at + name.len() + 1..at + pair.len());
            }
            at += pair.len() + 1;
        }
    }
    hide.sort_by_key(|r| r.start);
    let (mut shown, mut from) = (String::new(), 0);
    for r in hide {
        if r.start >= from {
            shown += &url[from..r.start];
            shown += "***";
        }
        from = from.max(r.end);
    }
    shown + &url[from..]
}

/// Refuses a scheme this crate does not speak, or TLS without the feature.
fn check_scheme(url: &str) -> Result<(), String> {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let known = matches!(
        scheme,
        "redis" | "rediss" | "valkey" | "valkeys" | "redis+unix" | "valkey+unix" | "unix"
    );
    if !known {
        return Err(
            "expected redis://host:port[/db], redis+unix:///path, or rediss://host:port \
                    (or the same with valkey in place of redis)"
                .to_string(),
        );
    }
    if matches!(scheme, "rediss" | "valkeys") && !cfg!(feature = "tls") {
        return Err(format!(
            "{scheme}:// needs the crate's `tls` feature: redlock-sync = {{ features = [\"tls\"] }}"
        ));
    }
    Ok(())
}

/// How to reach `addr`: by address, by name (resolved with a timeout), or
/// via the redis crate. The last is for TLS, or Unix sockets the OS lacks.
fn route(addr: &ConnectionAddr) -> Result<Route, String> {
    Ok(match addr {
        ConnectionAddr::Tcp(_, 0) | ConnectionAddr::TcpTls { port: 0, .. } => {
            return Err("the port `0` is not a number from 1 to 65535".into());
        }
        ConnectionAddr::Tcp(host, port) => match host.parse::<IpAddr>() {
            Ok(ip) => Route::Ip(SocketAddr::new(ip, *port)),
            Err(_) => Route::Name(Resolver::new(host, *port)),
        },
        ConnectionAddr::TcpTls { .. } => Route::Unsplit,
        // Our own socket where the OS has them, else the redis crate's.
        #[cfg(unix)]
        ConnectionAddr::Unix(path) => Route::Unix(path.clone()),
        #[cfg(not(unix))]
        ConnectionAddr::Unix(_) => Route::Unsplit,
        other => return Err(format!("unsupported address {other:?}")),
    })
}

/// A new connection's handshake, packed, and how many replies it checks.
/// `AUTH` and `SELECT` as the URL asks, then every script loaded: loaded
/// scripts, unlike `EVAL`'s, are not evicted. Last, `INFO server` for the
/// `run_id` and the uptime.
fn handshake(redis: &RedisConnectionInfo) -> (Vec<u8>, usize) {
    let mut handshake = redis::pipe();
    if let Some(password) = redis.password() {
        handshake.cmd("AUTH").arg(redis.username()).arg(password);
    }
    if redis.db() != 0 {
        handshake.cmd("SELECT").arg(redis.db());
    }
    let checked_replies = handshake.len();
    for script in script::SCRIPTS {
        handshake.cmd("SCRIPT").arg("LOAD").arg(script.body);
    }
    handshake.cmd("INFO").arg("server");
    (handshake.get_packed_pipeline(), checked_replies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(
            redact("redis://alice:s3cret@h:1/2"),
            "redis://alice:***@h:1/2"
        );
        assert_eq!(redact("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact("no scheme"), "no scheme");
        assert_eq!(redact("redis://:pa/ss@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://u:p?a#s@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:s3cret127.0.0.1:1/2"), "redis://:***/2");
        assert_eq!(
            redact("redis+unix:///tmp/x.sock?db=1&pass=s3cret&user=u"),
            "redis+unix:///tmp/x.sock?db=1&pass=***&user=u"
        );
    }

    #[test]
    fn redact_hides_query_passwords_after_an_at_sign_in_the_query() {
        for url in [
            "redis+unix:///tmp/x.sock?user=alice@corp&pass=s3cret",
            "redis+unix:///tmp/x.sock?pass=s3@cret",
            "redis://h:1/0?user=a@b&pass=s3cret",
        ] {
            let shown = redact(url);
            assert!(
                !shown.contains("s3cret") && !shown.contains("cret"),
                "{url} shows as {shown}"
            );
        }
    }

    #[test]
    fn parse_reads_address_auth_and_db() {
        let endpoint = Endpoint::parse("redis://u:p@127.0.0.1:7001/3").unwrap();
        assert_eq!(&*endpoint.name, "127.0.0.1:7001");
        assert_eq!(endpoint.checked_replies, 2);
        let endpoint = Endpoint::parse("redis+unix:///tmp/x.sock").unwrap();
        assert_eq!(&*endpoint.name, "/tmp/x.sock");
        assert_eq!(endpoint.checked_replies, 0);
    }
}
