//! Which server process each node reached. One server has one vote, even
//! under two names (`localhost` and `127.0.0.1`, or two forwarded ports).
//!
//! Each handshake reads the server's `run_id` (`INFO server`), which each
//! process draws at random at start. The client's first node to reach a
//! server claims its id. Any other node reaching it does not vote.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::{InfoDict, Value};

use super::pace::Pace;
use crate::error::NodeError;

/// What one client's nodes share: the servers they reached, by `run_id`,
/// and the pace of the client's threads.
#[derive(Default)]
pub(crate) struct Servers {
    claimed: Mutex<HashMap<String, (usize, Arc<str>)>>,
    pub(crate) pace: Pace,
}

impl Servers {
    /// Records that node `index` (named `name`) reached the server that
    /// answered `info`. Fails if another node reached it first. A reply
    /// without a `run_id` (INFO disabled, an odd server) passes: there is
    /// nothing to compare.
    pub(crate) fn claim(
        &self,
        info: &Value,
        index: usize,
        name: &Arc<str>,
    ) -> Result<(), NodeError> {
        let Some(run_id) = info_fields(info).get("run_id") else {
            return Ok(());
        };
        let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        let (other, other_name) =
            (claimed.entry(run_id)).or_insert_with(|| (index, Arc::clone(name)));
        let other = (*other != index).then(|| other_name.to_string());
        other.map_or(Ok(()), |other| Err(NodeError::SameServer { other }))
    }
}

/// An `INFO` reply's fields (none if the reply is not text).
pub(crate) fn info_fields(info: &Value) -> InfoDict {
    redis::from_redis_value_ref(info).unwrap_or_else(|_| InfoDict::new(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(run_id: &str) -> Value {
        Value::BulkString(
            format!("# Server\r\nrun_id:{run_id}\r\nuptime_in_seconds:5\r\n").into_bytes(),
        )
    }

    #[test]
    fn a_second_node_reaching_a_claimed_server_is_refused() {
        let servers = Servers::default();
        let (a, b): (Arc<str>, Arc<str>) = ("127.0.0.1:7001".into(), "localhost:7001".into());
        assert_eq!(servers.claim(&info("abc"), 0, &a), Ok(()));
        assert_eq!(
            servers.claim(&info("abc"), 0, &a),
            Ok(()),
            "the same node again"
        );
        assert_eq!(
            servers.claim(&info("abc"), 1, &b),
            Err(NodeError::SameServer {
                other: "127.0.0.1:7001".to_string()
            })
        );
        assert_eq!(servers.claim(&info("def"), 1, &b), Ok(()), "another server");
        assert_eq!(
            servers.claim(&Value::Nil, 2, &b),
            Ok(()),
            "no run_id to compare"
        );
    }

    #[test]
    fn info_fields_reads_whole_names_only() {
        let reply = info_fields(&info("abc"));
        assert_eq!(reply.get("run_id"), Some("abc".to_string()));
        assert_eq!(reply.get("uptime_in_seconds"), Some(5u64));
        assert_eq!(reply.get::<String>("run"), None);
        assert!(info_fields(&Value::Int(1))
            .get::<String>("run_id")
            .is_none());
    }
}
