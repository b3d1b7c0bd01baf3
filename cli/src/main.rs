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
//! subcommands (`run`, `supervisor`, `status`, `explicit`); what they
//! share (`wait`, `nodes`); the mechanisms (`protocol`, `tree`, `events`);
//! the leaves (`args`, `exit`).

#![forbid(unsafe_code)]

mod args;
mod events;
mod exit;
mod explicit;
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
use exit::Failure;

fn main() -> ExitCode {
    // rustls needs a crypto provider for `rediss://` nodes; another one
    // already installed would do as well.
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let json = cli.command.json();
    let outcome = match &cli.command {
        Command::Run(args) => run_command(args),
        Command::Acquire(args) => explicit::acquire(args),
        Command::Extend(args) => explicit::extend(args),
        Command::Release(args) => explicit::release(args),
        Command::Status(args) => status::status(args),
        Command::Man(args) => man(args),
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

/// `redlock man`: the manual pages, made from the command line's
/// definition.
fn man(args: &args::ManArgs) -> Result<u8, Failure> {
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    if let Some(dir) = &args.dir {
        clap_mangen::generate_to(cli, dir).map_err(|e| {
            Failure::output(&e, "the manual pages").context(format_args!("in {}", dir.display()))
        })?;
        return Ok(0);
    }
    let page = match &args.subcommand {
        None => cli,
        Some(name) => cli
            .get_subcommands()
            .find(|sub| sub.get_name() == name && !sub.is_hide_set())
            .cloned()
            .ok_or_else(|| Failure::usage(format_args!("no subcommand `{name}`")))?,
    };
    let mut text = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut text)
        .map_err(|e| Failure::system(format!("cannot make the manual page: {e}")))?;
    write_out(&text, "the manual page")
}

/// `redlock completions SHELL`: the completion script.
fn completions(shell: clap_complete::Shell) -> Result<u8, Failure> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "redlock", &mut script);
    write_out(&script, "the completion script")
}

/// Writes `bytes` to standard output, flushed; a failure is the output
/// code's.
fn write_out(bytes: &[u8], what: &str) -> Result<u8, Failure> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::output(&e, what))?;
    Ok(0)
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

/// Whether `--json` is among the tool's own arguments (before a `--`),
/// for errors that come before they are parsed.
fn json_asked() -> bool {
    std::env::args_os()
        .skip(1)
        .take_while(|arg| arg != "--")
        .any(|arg| arg == "--json")
}
