//! From `--nodes` (or `REDLOCK_NODES`) and the timeouts to a client.

use redlock_sync::{Redlock, RedlockBuilder};

use crate::args::NodeArgs;
use crate::exit::Failure;

/// The node URLs given, without the blanks a trailing comma or an empty
/// variable leaves.
pub fn urls(args: &NodeArgs) -> Result<Vec<String>, Failure> {
    let urls: Vec<String> = args
        .urls()
        .iter()
        .map(|url| url.trim())
        .filter(|url| !url.is_empty())
        .map(str::to_string)
        .collect();
    if urls.is_empty() {
        return Err(Failure::usage(
            "no nodes: give their URLs with --nodes redis://h1:6379,redis://h2:6379,redis://h3:6379 \
             or in the REDLOCK_NODES environment variable",
        ));
    }
    if !cfg!(feature = "tls") {
        if let Some(scheme) = urls.iter().find_map(|url| tls_scheme(url)) {
            return Err(Failure::usage(format!(
                "{scheme}:// nodes need TLS, and this redlock was built without it: \
                 build it with `cargo install --locked --path cli --features tls`"
            )));
        }
    }
    Ok(urls)
}

/// The scheme of a node URL that asks for TLS (`rediss`, `valkeys`, in
/// any case); `None` for any other.
fn tls_scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once("://")?;
    (scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys"))
        .then_some(scheme)
}

/// A client over the nodes, with the timeouts given and whatever `tune`
/// adds. Connects to nothing yet.
pub fn client(
    args: &NodeArgs,
    tune: impl FnOnce(RedlockBuilder) -> RedlockBuilder,
) -> Result<Redlock, Failure> {
    let mut builder = Redlock::builder(urls(args)?)
        .io_timeout(args.io_timeout)
        .connect_timeout(args.connect_timeout);
    if let Some(grace) = args.restart_grace {
        builder = builder.restart_grace(grace);
    }
    Ok(tune(builder).build()?)
}
