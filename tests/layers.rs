//! The floor plan: every file imports only what lies below it. The layers
//! of the library and of the tool are declared once, below, from the top
//! down; a room is a top-level module, with the files of its own folder
//! (`client.rs` and `client/`), whose files may use each other. The test
//! reads every `crate::` path in code (comments and strings left out,
//! paths inside function bodies included; `super::` stays in its room) and
//! fails, naming the files, on an import that runs up or sideways to a
//! room not below, which is also what any import circle needs.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The library's rooms, from the top down.
const LIBRARY: &[&str] = &[
    "lib", "client", "request", "retry", "wait", "round", "node", "lock", "kind", "store", "event",
    "token", "time", "setters", "sync", "error",
];

/// The tool's rooms, from the top down.
const TOOL: &[&str] = &[
    "main",
    "man",
    "run",
    "supervisor",
    "status",
    "explicit",
    "wait",
    "nodes",
    "protocol",
    "tree",
    "events",
    "args",
    "exit",
];

/// `text` with comments, string and character literals blanked out.
fn code_only(text: &str) -> String {
    let (bytes, mut out, mut i) = (text.as_bytes(), String::new(), 0);
    while i < bytes.len() {
        let rest = &text[i..];
        let skip = if rest.starts_with("//") {
            rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            rest.find("*/").map_or(rest.len(), |end| end + 2)
        } else if let Some(raw) = raw_string(rest) {
            raw
        } else if rest.starts_with('"') {
            quoted(rest, '"')
        } else if rest.starts_with('\'') && !is_lifetime(rest) {
            quoted(rest, '\'')
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
            continue;
        };
        out.push(' ');
        i += skip;
    }
    out
}

/// The length of a raw string literal at the start of `rest`, if one is.
fn raw_string(rest: &str) -> Option<usize> {
    let body = rest.strip_prefix("br").or_else(|| rest.strip_prefix('r'))?;
    let hashes = body.len() - body.trim_start_matches('#').len();
    let open = body[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let end = open.find(&close)?;
    Some(rest.len() - open.len() + end + close.len())
}

/// The length of a literal quoted by `quote` at the start of `rest`.
fn quoted(rest: &str, quote: char) -> usize {
    let mut escaped = false;
    for (i, c) in rest.char_indices().skip(1) {
        match c {
            '\\' if !escaped => escaped = true,
            c if c == quote && !escaped => return i + 1,
            _ => escaped = false,
        }
    }
    rest.len()
}

/// Whether the `'` at the start of `rest` begins a lifetime, not a char.
fn is_lifetime(rest: &str) -> bool {
    let mut chars = rest.chars().skip(1);
    match (chars.next(), chars.next()) {
        (Some(c), Some(next)) => (c.is_alphabetic() || c == '_') && next != '\'',
        _ => false,
    }
}

/// The room of a source file under `src`: its top-level module.
fn room(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("a file under src");
    let first = rel.components().next().expect("a path");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The imports of the crate under `src` that do not run down `layers`:
/// `file -> room (named)`.
fn upward(src: &Path, layers: &[&str]) -> Vec<String> {
    let rank = |room: &str| layers.iter().position(|r| *r == room);
    let mut files = Vec::new();
    sources(src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in files {
        let from = room(src, &file);
        let Some(from_rank) = rank(&from) else {
            wrong.push(format!("{}: room `{from}` has no layer", file.display()));
            continue;
        };
        let code = code_only(&fs::read_to_string(&file).expect("a readable source"));
        let mut seen = BTreeMap::new();
        for (at, _) in code.match_indices("crate::") {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let to: String = code[at + 7..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            seen.entry(to).or_insert(());
        }
        for to in seen.into_keys().filter(|to| *to != from) {
            match rank(&to) {
                Some(to_rank) if to_rank > from_rank => {}
                _ => wrong.push(format!("{} ({from}) imports `crate::{to}`", file.display())),
            }
        }
    }
    wrong
}

#[test]
fn every_library_file_imports_only_what_lies_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let wrong = upward(&src, LIBRARY);
    assert!(
        wrong.is_empty(),
        "imports that do not run down:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_tool_file_imports_only_what_lies_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("cli/src");
    if !src.exists() {
        eprintln!(
            "{} is not here (a packaged crate): the tool not checked",
            src.display()
        );
        return;
    }
    let wrong = upward(&src, TOOL);
    assert!(
        wrong.is_empty(),
        "imports that do not run down:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reader_sees_paths_in_code_and_not_in_comments_or_strings() {
    let code = code_only("use crate::a; // crate::b\nlet s = \"crate::c\"; f::<'x>(crate::d::e);\n/* crate::f */ r#\"crate::g\"#");
    assert!(
        code.contains("crate::a") && code.contains("crate::d"),
        "{code}"
    );
    for hidden in ["crate::b", "crate::c", "crate::f", "crate::g"] {
        assert!(!code.contains(hidden), "{hidden} in {code}");
    }
}
