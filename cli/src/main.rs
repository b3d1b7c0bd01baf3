//! `redlock`: run a command under a distributed lock held on a quorum of
//! independent Redis or Valkey masters, with `redlock-sync`; and take,
//! extend, release and inspect such locks from scripts.
//!
//! ```text
//! redlock run [OPTIONS] RESOURCE -- COMMAND [ARGS...]
//! redlock acquire [OPTIONS] RESOURCE          # prints the token
//! redlock extend [OPTIONS] RESOURCE TOKEN
//! redlock release [OPTIONS] RESOURCE TOKEN
//! redlock status [OPTIONS] RESOURCE
//! ```
//!
//! An example of embedding the library in a command-line tool, built on
//! its public API only. [`wait`] waits for the lock through the library's
//! cancellable wait. In [`run`], the `LockGuard` and its watchdog keep the
//! lock alive while the command runs, and say when it is lost. In
//! [`explicit`], tokens carry a lock across invocations. The exit codes
//! are in [`exit`] and in each subcommand's `--help`.
//!
//! The files import only downwards, in these layers: `main`; the
//! subcommands (`run`, `supervisor`, `status`, `explicit`, `man`); what they
//! share (`wait`, `nodes`); the mechanisms (`protocol`, `tree`, `events`);
//! the leaves (`args`, `exit`).

#![forbid(unsafe_code)]

mod args;
mod events;
mod exit;
mod explicit;
mod man;
mod nodes;
#[cfg(unix)]
mod protocol;
#[cfg(unix)]
mod run;
mod status;
#[cfg(unix)]
mod supervisor;
#[cfg(unix)]
mod tree;
mod wait;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use args::{Cli, Command};
use exit::{write_out, Failure};

fn main() -> ExitCode {
    // rustls needs a crypto provider for `rediss://` nodes; another one
    // already installed would do as well.
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(mut e) => {
            suggest_subcommand(&mut e);
            return usage_error(&e);
        }
    };
    let json = cli.command.json();
    let outcome = match &cli.command {
        Command::Run(args) => run_command(args),
        Command::Acquire(args) => explicit::acquire(args),
        Command::Extend(args) => explicit::extend(args),
        Command::Release(args) => explicit::release(args),
        Command::Status(args) => status::status(args),
        Command::Man(args) => man::man(args),
        Command::Completions(args) => completions(args.shell),
        #[cfg(unix)]
        Command::Supervise(args) => Ok(supervisor::supervise(args)),
        #[cfg(not(unix))]
        Command::Supervise(_) => Err(Failure::usage("`redlock supervise` needs Unix")),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            failure.print(json);
            ExitCode::from(failure.code)
        }
    }
}

#[cfg(unix)]
fn run_command(args: &args::RunArgs) -> Result<u8, Failure> {
    run::run(args)
}

/// Without Unix signals the command could not be stopped when the lock is
/// lost, nor be passed the signals the tool gets: refuse rather than run
/// it unguarded.
#[cfg(not(unix))]
fn run_command(_: &args::RunArgs) -> Result<u8, Failure> {
    Err(Failure::new(
        exit::SYSTEM,
        "unsupported",
        "`redlock run` needs Unix signals (Linux, macOS) to stop the command when the lock is lost; \
         on this system use `redlock acquire`, `extend` and `release`",
    ))
}

/// `redlock completions SHELL`: the completion script.
fn completions(shell: clap_complete::Shell) -> Result<u8, Failure> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "redlock", &mut script);
    write_out(&script, "the completion script")
}

/// Help and version go to standard output with code 0. A command line
/// that does not parse gets clap's message and the usage code (not clap's
/// own 2), with `--json` also as an object.
fn usage_error(e: &clap::Error) -> ExitCode {
    if !e.use_stderr() {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let _ = e.print();
    if json_asked() {
        let failure = Failure::usage(e.kind());
        let out = serde_json::json!({
            "error": failure.kind,
            "message": e.to_string().lines().next().unwrap_or_default(),
            "exit_code": failure.code,
        });
        let _ = exit::print_line(out);
    }
    ExitCode::from(exit::USAGE)
}

/// Adds "a similar subcommand exists" to an unknown subcommand's error
/// where clap found none: clap's measure misses swapped letters
/// (`redlock rnu`).
fn suggest_subcommand(e: &mut clap::Error) {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != clap::error::ErrorKind::InvalidSubcommand
        || e.get(ContextKind::SuggestedSubcommand).is_some()
    {
        return;
    }
    let Some(ContextValue::String(typed)) = e.get(ContextKind::InvalidSubcommand) else {
        return;
    };
    let cli = Cli::command();
    let near = cli
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set())
        .map(|sub| sub.get_name())
        .chain(["help"])
        .map(|name| (edits(typed, name), name))
        .filter(|(distance, name)| *distance <= 2 && *distance < name.len() / 2 + 1)
        .min();
    if let Some((_, name)) = near {
        let names = ContextValue::Strings(vec![name.to_string()]);
        e.insert(ContextKind::SuggestedSubcommand, names);
    }
}

/// The edits from `a` to `b`: letters inserted, deleted, replaced, or two
/// neighbours swapped (the optimal string alignment distance).
fn edits(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let replace = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + replace);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// Whether `--json` is among the tool's own arguments (before a `--`),
/// for errors that come before they are parsed.
fn json_asked() -> bool {
    std::env::args_os()
        .skip(1)
        .take_while(|arg| arg != "--")
        .any(|arg| arg == "--json")
}
