//! `redlock man`: the manual pages, made from the command line's
//! definition. clap_mangen writes each page; its SYNOPSIS is replaced by
//! one that names each option's value (`--ttl DURATION`), which
//! clap_mangen's leaves out.

use std::io;
use std::path::Path;

use clap::CommandFactory;

use crate::args::{Cli, ManArgs};
use crate::exit::{write_out, Failure, OUTPUT};

/// Runs `redlock man`: one page on standard output, or every page into
/// `--dir`, which is created with its parents if need be.
pub fn man(args: &ManArgs) -> Result<u8, Failure> {
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    if let Some(dir) = &args.dir {
        write_pages(&cli, dir).map_err(|e| {
            let message = format!("cannot write the manual pages into {}: {e}", dir.display());
            Failure::new(OUTPUT, "output", message)
        })?;
        return Ok(0);
    }
    let page = match &args.subcommand {
        None => cli,
        Some(name) => visible(&cli)
            .find(|sub| sub.get_name() == name)
            .cloned()
            .ok_or_else(|| Failure::usage(format_args!("no subcommand `{name}`")))?,
    };
    let text =
        render(&page).map_err(|e| Failure::system(format!("cannot make the manual page: {e}")))?;
    write_out(text.as_bytes(), "the manual page")
}

/// The subcommands that have a page: all but the hidden ones.
fn visible(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands().filter(|sub| !sub.is_hide_set())
}

/// Writes the page of `cmd` and of each visible subcommand into `dir`
/// (`redlock.1`, `redlock-run.1`, ...), creating `dir` first.
fn write_pages(cmd: &clap::Command, dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for sub in visible(cmd) {
        write_pages(sub, dir)?;
    }
    let name = clap_mangen::Man::new(cmd.clone()).get_filename();
    std::fs::write(dir.join(name), render(cmd)?)
}

/// The page of `cmd` (roff), with the tool's SYNOPSIS.
fn render(cmd: &clap::Command) -> io::Result<String> {
    let mut bytes = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut bytes)?;
    let page = String::from_utf8(bytes).map_err(io::Error::other)?;
    let heading = ".SH SYNOPSIS\n";
    let Some(start) = page.find(heading).map(|at| at + heading.len()) else {
        return Ok(page);
    };
    let end = page[start..]
        .find("\n.SH ")
        .map_or(page.len(), |at| start + at + 1);
    Ok(format!(
        "{}{}\n{}",
        &page[..start],
        synopsis(cmd),
        &page[end..]
    ))
}

/// The SYNOPSIS line of `cmd`: its name, each option with its value name
/// (`[--ttl DURATION]`), its operands, and `<subcommand>` if it has any.
fn synopsis(cmd: &clap::Command) -> String {
    let name = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    let mut line = bold(name);
    let options = cmd
        .get_arguments()
        .filter(|arg| !arg.is_hide_set() && !arg.is_positional());
    for arg in options {
        let mut names: Vec<String> = Vec::new();
        names.extend(arg.get_short().map(|short| bold(&format!("-{short}"))));
        names.extend(arg.get_long().map(|long| bold(&format!("--{long}"))));
        let mut option = names.join("|");
        if arg.get_action().takes_values() {
            option = format!("{option} {}", italic(&value_name(arg)));
        }
        line.push_str(&bracketed(arg, option));
    }
    for arg in cmd.get_positionals().filter(|arg| !arg.is_hide_set()) {
        let operand = italic(&value_name(arg));
        let operand = if arg.is_required_set() {
            format!(" <{operand}>")
        } else {
            format!(" [{operand}]")
        };
        line.push_str(&operand);
        if arg.get_num_args().is_some_and(|n| n.max_values() > 1) {
            line.push_str("...");
        }
    }
    if visible(cmd).next().is_some() {
        line.push_str(&format!(" <{}>", italic("subcommand")));
    }
    // `\%` before each word: no word is hyphenated (`DU-RATION`).
    let words: Vec<String> = line.split(' ').map(|word| format!("\\%{word}")).collect();
    words.join(" ")
}

/// ` OPTION`, or ` [OPTION]` for an option that may be left out.
fn bracketed(arg: &clap::Arg, option: String) -> String {
    if arg.is_required_set() {
        format!(" {option}")
    } else {
        format!(" [{option}]")
    }
}

/// The name of an argument's value: `DURATION`, `RESOURCE`.
fn value_name(arg: &clap::Arg) -> String {
    match arg.get_value_names() {
        Some(names) => names
            .iter()
            .map(|name| name.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        None => arg.get_id().as_str().to_uppercase(),
    }
}

fn bold(text: &str) -> String {
    format!("\\fB{}\\fR", escaped(text))
}

fn italic(text: &str) -> String {
    format!("\\fI{}\\fR", escaped(text))
}

/// `text` for roff: backslashes and hyphens escaped.
fn escaped(text: &str) -> String {
    text.replace('\\', "\\\\").replace('-', "\\-")
}
