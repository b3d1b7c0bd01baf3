//! Every key and the release channel of a resource lie in the resource's
//! own hash slot, as a Redis Cluster node computes it (`CLUSTER KEYSLOT`
//! on a server started with `--cluster-enabled yes`), whatever braces or
//! characters the name holds.

mod common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, cluster};
use redlock_sync::{fence_key, intents_key, released_channel, Kind, LockOptions};

const TTL: Duration = Duration::from_secs(10);

/// A server started with `--cluster-enabled yes`, stopped and its folder
/// removed on drop, also when the test fails.
struct ClusterEnabled {
    child: Child,
    dir: PathBuf,
    client: redis::Client,
}

impl ClusterEnabled {
    fn start() -> ClusterEnabled {
        let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("redlock-keyslot-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder for the node");
        let child = Command::new(&binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {binary} (install redis-server): {e}"));
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let server = ClusterEnabled { child, dir, client };
        let start = Instant::now();
        while server.client.get_connection().is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the server never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn slot(&self, key: &str) -> i64 {
        let mut con = self.client.get_connection().unwrap();
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut con)
            .unwrap()
    }
}

impl Drop for ClusterEnabled {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn every_key_and_channel_each_kind_leaves_lies_in_the_resources_own_slot() {
    let server = ClusterEnabled::start();
    let nodes = cluster(1);
    let locks = client(&nodes);
    let node = nodes.node(0);
    let names = [
        "plain",
        "a{x}b",
        "{x}",
        "a{}b",
        "{}",
        "}{",
        "{{x}}",
        "}",
        "ключ{ц}",
        "名前",
    ];
    for name in names {
        node.flushall().unwrap();
        // A fenced lock leaves its counter; a labelled reader its set and
        // the owners beside it.
        let fenced = locks.acquire(name, LockOptions::new(TTL).kind(Kind::Fenced));
        locks.release(fenced.expect("a fenced lock")).unwrap();
        let shared = LockOptions::new(TTL).kind(Kind::Shared).owner("host:1");
        let reader = locks.acquire(name, shared).expect("a reader");
        let mut keys = node.keys().unwrap();
        locks.release(reader).unwrap();
        keys.extend([fence_key(name), intents_key(name), released_channel(name)]);
        assert!(keys.len() >= 5, "{name}: {keys:?}");
        let slot = server.slot(name);
        for key in keys {
            assert_eq!(server.slot(&key), slot, "{name}: {key}");
        }
    }
}
