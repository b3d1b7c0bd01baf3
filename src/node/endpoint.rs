//! A node URL read once, into what connecting needs: the name shown to
//! people (never the password), the identity that tells two URLs of one
//! server apart, the route to the server, and the handshake bytes.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use super::resolve::Resolver;
use super::restart_guard;
use crate::error::ConfigError;
use crate::script::{self, pack};

/// A parsed node URL.
pub(crate) struct Endpoint {
    /// `host:port`, `tls host:port`, or the socket path; never the
    /// password.
    pub(crate) name: Arc<str>,
    /// What makes two nodes the same server: the address without the db.
    pub(crate) identity: String,
    /// Address only: no password, no db, no `CLIENT SETINFO`; we do the
    /// handshake ourselves, against the round's deadline.
    pub(super) client: redis::Client,
    /// How the node is reached.
    pub(super) route: Route,
    /// What a new connection sends first, packed: `AUTH` and `SELECT` if
    /// the URL asks for them, then `SCRIPT LOAD` for our scripts.
    pub(super) handshake: Vec<u8>,
    /// How many replies the `AUTH` and `SELECT` give (an error there fails
    /// the connection).
    pub(super) checked_replies: usize,
    /// How many `SCRIPT LOAD` replies follow (an error there only means the
    /// scripts go as `EVAL`).
    pub(super) script_replies: usize,
}

impl Endpoint {
    /// Parses a node URL: `redis://`, `redis+unix://`, or (with the `tls`
    /// feature) `rediss://`; user, password and db as the redis crate reads
    /// them.
    pub(crate) fn parse(url: &str) -> Result<Endpoint, ConfigError> {
        let bad = |reason: String| ConfigError::NodeUrl {
            url: redact(url),
            reason,
        };
        let scheme = url.split("://").next().unwrap_or("");
        if !matches!(scheme, "redis" | "rediss" | "redis+unix" | "unix") || !url.contains("://") {
            return Err(bad(
                "expected redis://host:port[/db], redis+unix:///path, or rediss://host:port"
                    .to_string(),
            ));
        }
        if scheme == "rediss" && !cfg!(feature = "tls") {
            return Err(bad(
                "rediss:// needs the crate's `tls` feature: redlock-sync = { features = [\"tls\"] }"
                    .to_string(),
            ));
        }
        let info: ConnectionInfo = url.into_connection_info().map_err(|e| bad(e.to_string()))?;
        let redis = info.redis_settings();
        let route;
        let (name, identity) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                route = match host.parse::<IpAddr>() {
                    Ok(ip) => Route::Ip(SocketAddr::new(ip, *port)),
                    Err(_) => Route::Name(Resolver::new(host, *port)),
                };
                let n = format!("{host}:{port}");
                (n.clone(), format!("tcp {}", n.to_ascii_lowercase()))
            }
            ConnectionAddr::TcpTls { host, port, .. } => {
                route = Route::Unsplit;
                let n = format!("{host}:{port}");
                (
                    format!("tls {n}"),
                    format!("tcp {}", n.to_ascii_lowercase()),
                )
            }
            ConnectionAddr::Unix(path) => {
                route = unix_route(path);
                let n = path.display().to_string();
                (n.clone(), format!("unix {n}"))
            }
            other => return Err(bad(format!("unsupported address {other:?}"))),
        };
        let mut handshake = Vec::new();
        let mut checked_replies = 0;
        if let Some(password) = redis.password() {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = redis.username() {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            pack(&mut handshake, &args);
            checked_replies += 1;
        }
        if redis.db() != 0 {
            pack(
                &mut handshake,
                &[b"SELECT", redis.db().to_string().as_bytes()],
            );
            checked_replies += 1;
        }
        let script_replies = script::load_all(&mut handshake);
        // Last: the server's run_id (and uptime, for the restart guard).
        handshake.extend_from_slice(&restart_guard::info_server());
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
            script_replies,
        })
    }
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
    /// Through the `redis` crate's own connection (TLS): one that cannot be
    /// split.
    Unsplit,
}

/// How to reach a Unix socket: our own socket where the OS has them.
#[cfg(unix)]
fn unix_route(path: &Path) -> Route {
    Route::Unix(path.to_path_buf())
}

/// How to reach a Unix socket: through the `redis` crate elsewhere.
#[cfg(not(unix))]
fn unix_route(_: &Path) -> Route {
    Route::Unsplit
}

/// The URL with any password replaced by `***`, for error messages.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    // The last '@' anywhere, not only in the authority: a password may hold
    // a raw '/', '?' or '#', and the error for that malformed URL must
    // still hide it.
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
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
