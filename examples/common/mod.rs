//! What the examples share: the nodes they run against, and how they
//! report an error.

use std::error::Error;
use std::fmt;
use std::process::ExitCode;

use redlock_sync_testing::Cluster;

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

/// Ends an example: on error, prints it for a person (its message and each
/// cause, never the `Debug` form that `main() -> Result` would print) and
/// exits with a failure status.
pub fn exit_code(result: Result<(), Box<dyn Error>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", Chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// An error's message followed by each of its causes, one per line.
pub struct Chain<'a>(pub &'a dyn Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            // Many errors already quote their cause in their own message;
            // a reader needs each text once.
            let text = cause.to_string();
            if !shown.contains(&text) {
                write!(f, "\n  caused by: {text}")?;
            }
            shown = text;
            source = cause.source();
        }
        Ok(())
    }
}
