//! A cluster: `n` independent masters started side by side in one
//! temporary directory, and everything they leave behind (processes and the
//! directory) gone when it drops.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread;

use super::binary::redis_server_binary;
use super::certs;
use super::node::Node;
use super::proxy::Proxy;
use super::record::{self, Record};
use super::spawn::{make_cluster_dir, Listen, Spawner};
use super::watchdog::{self, Watch};
use super::{io_error, HarnessError};

/// `n` independent `redis-server` masters, each in the cluster's own
/// temporary directory, without persistence (with it:
/// [`Cluster::start_persistent`]).
///
/// Dropping the cluster kills (SIGKILL) and reaps every server it started,
/// paused ones included, and removes the temporary directory. A run killed
/// before its clusters dropped leaves them to the next [`Cluster::start`]
/// (on Linux): see the [crate docs](crate#cleaning-up-after-a-killed-run).
/// A `Cluster` is `Send + Sync`: share it by reference across threads.
///
/// ```
/// use redlock_sync_testing::Cluster;
///
/// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
/// let cluster = Cluster::start(3)?;
/// for (i, url) in cluster.urls().iter().enumerate() {
///     assert!(url.starts_with("redis://127.0.0.1:"));
///     assert_eq!(*url, cluster.node(i).url());
/// }
/// let client = redis::Client::open(cluster.urls()[1].as_str()).unwrap();
/// let mut con = client.get_connection().unwrap();
/// redis::cmd("SET").arg("k").arg("v").exec(&mut con).unwrap();
/// assert_eq!(cluster.node(1).keys()?, vec!["k".to_owned()]);
/// assert!(cluster.node(0).keys()?.is_empty());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    nodes: Vec<Node>,
    record: Option<Record>,
    /// Started by [`Cluster::start_tls`].
    tls: bool,
    /// The cluster's place among those the time bound names.
    _watch: Watch,
}

impl Cluster {
    /// Starts `n` masters listening on `127.0.0.1` (each on its own free
    /// port), in parallel, and waits until every one answers `PING`.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotInstalled`] if `redis-server` cannot be found,
    /// [`HarnessError::NotReady`] if a node does not come up (with the tail of
    /// its log), [`HarnessError::Io`] for I/O failures. Nodes already started
    /// are stopped again before the error is returned.
    pub fn start(n: usize) -> Result<Cluster, HarnessError> {
        Self::launch(redis_server_binary()?, n, Listen::Tcp, false)
    }

    /// Starts `n` masters as [`Cluster::start`] does, each with
    /// persistence: `appendonly yes` and `appendfsync always`. A node logs
    /// every write to its own append-only file and syncs it before it
    /// answers. So a node killed with [`Node::kill`] or [`Node::restart`]
    /// (SIGKILL) comes back with every write it acknowledged. Keys keep
    /// their expiry times, so the time it was down counts.
    ///
    /// ```
    /// use redlock_sync_testing::Cluster;
    ///
    /// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
    /// let cluster = Cluster::start_persistent(1)?;
    /// let node = cluster.node(0);
    /// node.query(&["SET", "k", "v", "PX", "60000"])?;
    /// node.restart()?; // SIGKILL, then started again on its port
    /// assert_eq!(node.get("k")?.as_deref(), Some("v"));
    /// assert!(node.pttl("k")? > 0);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`Cluster::start`].
    pub fn start_persistent(n: usize) -> Result<Cluster, HarnessError> {
        Self::launch(redis_server_binary()?, n, Listen::Tcp, true)
    }

    /// Starts `n` masters that listen only on Unix sockets (TCP port 0) in
    /// the cluster's temporary directory. Their URLs are
    /// `redis+unix:///path/to/node-<i>.sock`; [`Node::port`] is `None`.
    ///
    /// The socket paths are kept below 100 bytes: if the system temporary
    /// directory has a long path, `/tmp` is used instead.
    ///
    /// ```
    /// use redlock_sync_testing::Cluster;
    ///
    /// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
    /// let cluster = Cluster::start_unix(2)?;
    /// assert!(cluster.urls()[0].starts_with("redis+unix:///"));
    /// assert_eq!(cluster.node(0).port(), None);
    /// cluster.node(0).set("k", "v")?;
    /// assert_eq!(cluster.node(0).get("k")?.as_deref(), Some("v"));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`Cluster::start`].
    pub fn start_unix(n: usize) -> Result<Cluster, HarnessError> {
        Self::launch(redis_server_binary()?, n, Listen::Unix, false)
    }

    /// Starts `n` masters that speak TLS to clients on `127.0.0.1`, with a
    /// throwaway certificate authority made by the `openssl` program in the
    /// cluster's directory. Their URLs are `rediss://127.0.0.1:PORT`; a
    /// client trusts them through [`ca_file`](Self::ca_file) (rustls reads
    /// the `SSL_CERT_FILE` environment variable, for instance). The
    /// certificate is for `127.0.0.1` and `localhost`.
    ///
    /// Each node also listens on a plain TCP port that only the harness
    /// uses (readiness, the inspection helpers such as [`Node::get`]), so
    /// these work without the crate's `tls` feature. [`Cluster::proxies`]
    /// is for plain TCP nodes only.
    ///
    /// ```
    /// use redlock_sync_testing::Cluster;
    ///
    /// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
    /// let cluster = Cluster::start_tls(1)?;
    /// assert!(cluster.urls()[0].starts_with("rediss://127.0.0.1:"));
    /// assert!(cluster.ca_file().is_some_and(|ca| ca.is_file()));
    /// cluster.node(0).set("k", "v")?;
    /// assert_eq!(cluster.node(0).get("k")?.as_deref(), Some("v"));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`Cluster::start`]; and [`HarnessError::Io`] if `openssl`
    /// is missing or fails (the message says how to install it).
    pub fn start_tls(n: usize) -> Result<Cluster, HarnessError> {
        Self::launch(redis_server_binary()?, n, Listen::Tls, false)
    }

    fn launch(
        binary: PathBuf,
        n: usize,
        listen: Listen,
        persistent: bool,
    ) -> Result<Cluster, HarnessError> {
        let watch = watchdog::watch(n)?;
        record::reap_orphans();
        let dir = make_cluster_dir(listen == Listen::Unix, n)?;
        let record = match Record::create(&dir, &binary) {
            Ok(record) => record,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let record_path = record.as_ref().map(|record| record.path().to_path_buf());
        // From here on, Drop cleans up whatever was started.
        let mut cluster = Cluster {
            dir,
            nodes: Vec::with_capacity(n),
            record,
            tls: listen == Listen::Tls,
            _watch: watch,
        };
        if cluster.tls {
            certs::make(&cluster.dir)?;
        }
        let results: Vec<Result<Node, HarnessError>> = thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|index| {
                    let spawner = Spawner {
                        binary: binary.clone(),
                        dir: cluster.dir.clone(),
                        index,
                        record: record_path.clone(),
                        persistent,
                    };
                    scope.spawn(move || Node::launch(spawner, listen))
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let mut first_error = None;
        for result in results {
            match result {
                Ok(node) => cluster.nodes.push(node),
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(cluster),
        }
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no node (`Cluster::start(0)`).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes' URLs in node order: `redis://127.0.0.1:PORT`,
    /// `redis+unix:///path/to/node-<i>.sock`, or `rediss://127.0.0.1:PORT`
    /// ([`Cluster::start_tls`]).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// The node at index `i`.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`, like slice indexing.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// All nodes, in order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The cluster's temporary directory (nodes' logs `node-<i>.log` and
    /// Unix sockets `node-<i>.sock`). It is removed when the cluster drops.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The certificate of the authority that signed the nodes'
    /// certificate, for clients to trust: `ca.pem` in the cluster's
    /// directory. `None` unless the cluster was started by
    /// [`Cluster::start_tls`].
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir.join(certs::CA_FILE))
    }

    /// Starts a [`Proxy`] in front of every node; returns them in node order.
    ///
    /// ```
    /// use redlock_sync_testing::{Cluster, Fault};
    ///
    /// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
    /// let cluster = Cluster::start(2)?;
    /// let proxies = cluster.proxies()?;
    /// let client = redis::Client::open(proxies[0].url()).unwrap();
    /// let mut con = client.get_connection().unwrap();
    /// redis::cmd("SET").arg("k").arg("v").exec(&mut con).unwrap();
    /// assert_eq!(cluster.node(0).get("k")?.as_deref(), Some("v"));
    /// proxies[0].set_fault(Fault::Reset);
    /// assert!(redis::cmd("GET").arg("k").query::<String>(&mut con).is_err());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] for a Unix-socket or TLS cluster (the proxy
    /// speaks plain TCP) or if a proxy cannot start.
    pub fn proxies(&self) -> Result<Vec<Proxy>, HarnessError> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(index, node)| match node.port() {
                Some(port) if !node.is_tls() => Proxy::start(&format!("127.0.0.1:{port}")),
                _ => Err(io_error(
                    format!(
                        "Cluster::proxies: node {} listens on {}; proxies need plain TCP nodes (Cluster::start)",
                        index,
                        if node.is_tls() { "TLS" } else { "a Unix socket" }
                    ),
                    io::Error::new(io::ErrorKind::Unsupported, "not a plain TCP node"),
                )),
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.kill_quietly();
        }
        let _ = fs::remove_dir_all(&self.dir);
        // Last: should this process die halfway, the record still names
        // what is left.
        drop(self.record.take());
    }
}

#[cfg(test)]
mod tests {
    use super::super::binary::search_path;
    use super::super::proxy::Fault;
    use super::super::spawn::MAX_SOCKET_PATH;
    use super::super::test_support::*;
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn start_three_pingable_nodes() {
        let cluster = Cluster::start(3).unwrap();
        assert_eq!(cluster.len(), 3);
        assert!(!cluster.is_empty());
        assert_eq!(cluster.nodes().len(), 3);
        let urls = cluster.urls();
        for (i, node) in cluster.nodes().iter().enumerate() {
            let port = node.port().unwrap();
            assert_eq!(urls[i], format!("redis://127.0.0.1:{port}"));
            assert_eq!(node.url(), urls[i]);
            assert!(node.pid().is_some());
            assert!(!node.is_paused());
            assert_eq!(ping_tcp(node_addr(node), SHORT).unwrap(), "+PONG");
            assert_eq!(node.keys().unwrap(), Vec::<String>::new());
            assert!(node.log_path().starts_with(cluster.dir()));
        }
        let mut ports: Vec<_> = cluster.nodes().iter().map(Node::port).collect();
        ports.sort();
        ports.dedup();
        assert_eq!(ports.len(), 3, "ports must be distinct");
    }

    #[test]
    fn start_tls_serves_tls_to_clients_and_plain_tcp_to_the_harness() {
        let cluster = Cluster::start_tls(2).unwrap();
        let ca = cluster.ca_file().expect("a TLS cluster has a CA file");
        assert!(ca.is_file() && ca.starts_with(cluster.dir()));
        let node = cluster.node(1);
        let url = node.url();
        assert_eq!(url, format!("rediss://127.0.0.1:{}", node.port().unwrap()));
        assert!(node.is_tls());
        // The inspection helpers go over the plain port.
        node.set("k", "v").unwrap();
        assert_eq!(node.get("k").unwrap().as_deref(), Some("v"));
        // The client's port speaks only TLS: a plain PING gets no PONG.
        assert_ne!(
            ping_tcp(node_addr(node), SHORT).ok().as_deref(),
            Some("+PONG")
        );
        // A restart comes back on the same URL, with the same certificate.
        node.restart().unwrap();
        assert_eq!(node.url(), url);
        assert_eq!(node.get("k").unwrap(), None);
        assert!(
            cluster.proxies().is_err(),
            "proxies are for plain TCP nodes"
        );
        assert_eq!(Cluster::start(1).unwrap().ca_file(), None);
    }

    #[test]
    fn persistent_nodes_keep_what_they_acknowledged_across_sigkill_and_plain_nodes_do_not() {
        let cluster = Cluster::start_persistent(2).unwrap();
        for node in cluster.nodes() {
            // Each node its own file: the nodes share the cluster's folder.
            node.set("who", &node.url()).unwrap();
            node.query(&["ZADD", "z", "5", "m"]).unwrap();
            node.query(&["PEXPIRE", "z", "60000"]).unwrap();
        }
        for node in cluster.nodes() {
            let pid = node.pid();
            node.restart().unwrap();
            assert_ne!(node.pid(), pid);
            assert_eq!(node.get("who").unwrap(), Some(node.url()));
            let score = node.query(&["ZSCORE", "z", "m"]).unwrap();
            assert_eq!(redis::from_redis_value::<f64>(score).unwrap(), 5.0);
            let pttl = node.pttl("z").unwrap();
            assert!(pttl > 50_000 && pttl <= 60_000, "{pttl}");
        }
        // Killed, then started: the same.
        cluster.node(0).kill().unwrap();
        cluster.node(0).start().unwrap();
        assert_eq!(
            cluster.node(0).get("who").unwrap(),
            Some(cluster.node(0).url())
        );
        // A plain cluster's node forgets.
        let plain = Cluster::start(1).unwrap();
        plain.node(0).set("k", "v").unwrap();
        plain.node(0).restart().unwrap();
        assert_eq!(plain.node(0).get("k").unwrap(), None);
    }

    #[test]
    fn empty_cluster_and_out_of_range_index() {
        let cluster = Cluster::start(0).unwrap();
        assert!(cluster.is_empty());
        assert!(cluster.urls().is_empty());
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = cluster.node(0);
        }));
        assert!(result.is_err());
    }

    #[cfg(unix)]
    #[test]
    fn start_unix_works() {
        use std::os::unix::net::UnixStream;

        let cluster = Cluster::start_unix(2).unwrap();
        assert_eq!(cluster.len(), 2);
        for (i, node) in cluster.nodes().iter().enumerate() {
            assert_eq!(node.port(), None);
            let url = node.url();
            let path = url.strip_prefix("redis+unix://").unwrap();
            assert!(path.starts_with('/'));
            assert!(path.len() < MAX_SOCKET_PATH, "{path}");
            assert!(path.ends_with(&format!("node-{i}.sock")));
            let mut stream = UnixStream::connect(path).unwrap();
            stream.set_read_timeout(Some(SHORT)).unwrap();
            assert_eq!(ping_over(&mut stream).unwrap(), "+PONG");
        }
        let node = cluster.node(1);
        node.set("k", "v").unwrap();
        assert_eq!(node.get("k").unwrap().as_deref(), Some("v"));
        assert!(cluster.node(0).keys().unwrap().is_empty());
        let url = node.url();
        node.restart().unwrap();
        assert_eq!(node.url(), url);
        assert_eq!(node.get("k").unwrap(), None);
        node.kill().unwrap();
        assert!(node.get("k").is_err());
        node.start().unwrap();
        assert!(node.keys().unwrap().is_empty());
        assert!(matches!(cluster.proxies(), Err(HarnessError::Io { .. })));
    }

    #[test]
    fn drop_leaves_no_process_and_no_directory() {
        let cluster = Cluster::start(3).unwrap();
        let dir = cluster.dir().to_path_buf();
        assert!(dir.is_dir());
        let pids: Vec<u32> = cluster.nodes().iter().map(|n| n.pid().unwrap()).collect();
        for pid in &pids {
            assert!(process_exists(*pid));
        }
        // A paused node must die too, and so must a killed one stay dead.
        cluster.node(0).pause().unwrap();
        cluster.node(1).kill().unwrap();
        assert!(!process_exists(pids[1]));
        drop(cluster);
        for pid in &pids {
            assert!(!process_exists(*pid), "pid {pid} survived the drop");
        }
        assert!(!dir.exists(), "{} survived the drop", dir.display());

        let cluster = Cluster::start_unix(1).unwrap();
        let dir = cluster.dir().to_path_buf();
        let pid = cluster.node(0).pid().unwrap();
        drop(cluster);
        assert!(!process_exists(pid));
        assert!(!dir.exists());
    }

    #[test]
    fn drop_on_panic_cleans_up() {
        let mut seen = None;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let cluster = Cluster::start(1).unwrap();
            seen = Some((cluster.node(0).pid().unwrap(), cluster.dir().to_path_buf()));
            panic!("test failure inside a test");
        }));
        assert!(result.is_err());
        let (pid, dir) = seen.unwrap();
        assert!(!process_exists(pid));
        assert!(!dir.exists());
    }

    #[test]
    fn early_exit_is_not_ready_with_log_tail() {
        let Some(false_bin) = search_path(OsStr::new("false"), std::env::var_os("PATH").as_deref())
        else {
            return;
        };
        let err = Cluster::launch(false_bin, 2, Listen::Tcp, false).unwrap_err();
        let HarnessError::NotReady {
            node,
            reason,
            log,
            log_tail,
            ..
        } = &err
        else {
            panic!("expected NotReady, got {err:?}");
        };
        assert!(node.starts_with("127.0.0.1:"), "{node}");
        assert!(reason.contains("exited early"), "{reason}");
        assert!(log_tail.contains("no log"), "{log_tail}");
        // The cluster's directory was removed on the way out.
        assert!(!log.parent().unwrap().exists());
        let message = err.to_string();
        assert!(message.contains("did not become ready"), "{message}");
    }

    #[test]
    fn cluster_proxies_in_node_order() {
        let cluster = Cluster::start(3).unwrap();
        let proxies = cluster.proxies().unwrap();
        assert_eq!(proxies.len(), 3);
        for (i, proxy) in proxies.iter().enumerate() {
            let client = redis::Client::open(proxy.url()).unwrap();
            let mut con = client.get_connection_with_timeout(SHORT).unwrap();
            redis::cmd("SET").arg("who").arg(i).exec(&mut con).unwrap();
            assert_eq!(cluster.node(i).get("who").unwrap(), Some(i.to_string()));
        }
        proxies[1].set_fault(Fault::Partition);
        assert_eq!(proxies[0].fault(), Fault::None);
        assert_eq!(proxies[1].fault(), Fault::Partition);
    }
}
