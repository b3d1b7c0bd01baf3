//! What the examples share: the nodes they run against.

use std::error::Error;

use redlock_sync::testing::Cluster;

/// The node URLs named in `REDLOCK_NODES` (comma-separated), or else `n`
/// throwaway local redis-server nodes. Keep the returned cluster alive while
/// using its nodes: dropping it stops them.
pub fn nodes(n: usize) -> Result<(Option<Cluster>, Vec<String>), Box<dyn Error>> {
    match std::env::var("REDLOCK_NODES") {
        Ok(list) if !list.trim().is_empty() => {
            let urls = list.split(',').map(|u| u.trim().to_string()).collect();
            Ok((None, urls))
        }
        _ => {
            let cluster = Cluster::start(n)?;
            let urls = cluster.urls();
            Ok((Some(cluster), urls))
        }
    }
}
