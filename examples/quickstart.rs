//! A tour of redlock-sync: acquire, contention, extend, a node failure, and
//! a token carried to another client.
//!
//! Run it with `cargo run --example quickstart`. It starts five throwaway
//! local redis-server nodes itself (redis-server must be installed), unless
//! `REDLOCK_NODES` names real ones, comma-separated:
//!
//! ```text
//! REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379 \
//!     cargo run --example quickstart
//! ```

mod common;

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use redlock_sync::{Kind, Lock, LockError, Redlock, RetryPolicy};

fn main() -> ExitCode {
    common::exit_code(run())
}

fn run() -> Result<(), Box<dyn Error>> {
    // Real nodes if REDLOCK_NODES names them, else five throwaway ones.
    let (cluster, urls) = common::nodes(5)?;
    println!("nodes: {}", urls.join(", "));

    let locks = Redlock::builder(&urls)
        .retry_policy(
            RetryPolicy::default()
                .retries(2)
                .delay(Duration::from_millis(50))
                .jitter(Duration::from_millis(50)),
        )
        .build()?;
    println!("quorum: {} of {}\n", locks.quorum(), urls.len());
    let ttl = Duration::from_secs(10);

    // 1. Acquire, and see what each node answered.
    let mut lock = locks.acquire("quickstart:invoice-42", ttl)?;
    println!("acquired `{}`", lock.resource());
    println!("  token:    {}", lock.token());
    println!("  validity: {:?}", lock.validity());
    println!("  round:    {}\n", lock.report());

    // 2. Contention: a second client (another thread, or another process)
    //    cannot get it while we hold it.
    let rival = Redlock::new(&urls)?;
    match rival.try_acquire("quickstart:invoice-42", ttl) {
        Err(LockError::Contended { report, .. }) => {
            println!("a rival is refused while we hold it:\n  {report}\n")
        }
        Ok(_) => return Err("the rival must not get a held lock".into()),
        Err(e) => return Err(e.into()),
    }

    // 3. Extend before the validity runs low.
    locks.extend(&mut lock, ttl)?;
    println!("extended: validity {:?}\n", lock.validity());

    // 4. Hand the lock to "another process": all it needs is the resource
    //    and the token, as text.
    let (resource, token) = (lock.resource().to_string(), lock.token().to_string());
    drop(lock);
    let carried = Lock::from_token(resource, token.parse()?, Kind::Plain)?;
    let report = rival.release(carried)?;
    println!("released by the rival client from (resource, token): {report}\n");

    // 5. A node failure: with one node down, a quorum still answers.
    match &cluster {
        Some(cluster) => {
            cluster.node(0).kill()?;
            println!("killed node {}", cluster.node(0).url());
            let lock = locks.acquire("quickstart:after-failure", ttl)?;
            println!("acquired anyway: {}", lock.report());
            locks.release(lock)?;
            cluster.node(1).kill()?;
            cluster.node(2).kill()?;
            println!("killed two more: only 2 of 5 left");
            match locks.acquire("quickstart:no-quorum", ttl) {
                Err(e @ LockError::NoQuorum { .. }) => println!("as expected: {e}"),
                Ok(_) => return Err("2 of 5 nodes must not grant a lock".into()),
                Err(e) => return Err(e.into()),
            }
        }
        None => println!("(the node-failure demo runs only on the throwaway local nodes)"),
    }
    Ok(())
}
