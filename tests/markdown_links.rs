//! The repository's Markdown files link only to what exists: every relative
//! link names a file or folder of the repository, and every `#anchor` names
//! a heading of its target (by GitHub's heading slugs) or an explicit HTML
//! anchor. External URLs are not checked (CI has no network), and neither
//! is anything inside code. The intra-doc links of the rustdoc are checked
//! by `cargo doc` with warnings denied.
//!
//! Every `.md` file under the repository is checked (build output and
//! hidden folders left out), so a new page needs no entry here. In the
//! packaged crate, which leaves those pages out, the links are not checked.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// Pages that other work is writing in parallel, and that the README
/// already links to. A link to one of them is let through while it is
/// missing; once it exists its entry must go (the test says so), so that
/// from then on its links and anchors are checked like any other.
const PENDING: &[&str] = &[];

/// Most lines the README may have: a page a newcomer reads in minutes;
/// the reference is the rustdoc.
const README_MAX_LINES: usize = 350;

/// The repository's root: the library's package folder.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether `root` is a checkout of the repository (`.git` is a folder, or
/// a file in a worktree), rather than the packaged crate, which leaves out
/// the pages and folders (`docs/`, `cli/`) that the links point to.
fn is_checkout(root: &Path) -> bool {
    let checkout = root.join(".git").exists();
    if !checkout {
        eprintln!(
            "{} is not a repository checkout: links not checked",
            root.display()
        );
    }
    checkout
}

/// Every Markdown file under `dir`, but in build output and hidden folders.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a folder entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !(name.starts_with('.') || name == "target") {
                markdown_files(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// A link as written in a page, with the line it is on.
struct Link {
    line: usize,
    dest: String,
}

/// What one page holds: its links, and the anchors it offers.
struct Page {
    links: Vec<Link>,
    anchors: Vec<String>,
}

/// GitHub's slug of a heading's text: lower case; letters, digits, `-` and
/// `_` kept, spaces turned into `-`, everything else dropped.
fn slug(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The `id="..."` and `name="..."` values of an HTML fragment: explicit
/// anchors such as `<a id="x"></a>`.
fn html_anchors(html: &str, anchors: &mut Vec<String>) {
    for attr in ["id=\"", "name=\""] {
        let mut rest = html;
        while let Some(at) = rest.find(attr) {
            let preceded_by_space = at == 0
                || rest[..at]
                    .chars()
                    .next_back()
                    .is_some_and(char::is_whitespace);
            rest = &rest[at + attr.len()..];
            if let (true, Some(end)) = (preceded_by_space, rest.find('"')) {
                anchors.push(rest[..end].to_string());
            }
        }
    }
}

/// The Markdown that GitHub renders: CommonMark with tables, footnotes,
/// strikethrough, task lists and alerts (no smart punctuation, no heading
/// attributes: they would change the slugs GitHub makes).
fn github_flavour() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_GFM
}

/// Reads a page's links and anchors. Repeated headings get GitHub's `-1`,
/// `-2`, ... suffixes.
fn parse(text: &str) -> Page {
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    let mut page = Page {
        links: Vec::new(),
        anchors: Vec::new(),
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut heading: Option<String> = None;
    for (event, range) in Parser::new_ext(text, github_flavour()).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let n = seen.entry(base.clone()).or_insert(0);
                page.anchors.push(match *n {
                    0 => base.clone(),
                    k => format!("{base}-{k}"),
                });
                *n += 1;
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Html(h) | Event::InlineHtml(h) => html_anchors(&h, &mut page.anchors),
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => {
                page.links.push(Link {
                    line: line_of(range.start),
                    dest: dest_url.to_string(),
                });
            }
            _ => {}
        }
    }
    page
}

/// A link to elsewhere: it has a scheme (`https:`, `mailto:`), or starts
/// with `//`.
fn is_external(dest: &str) -> bool {
    if dest.starts_with("//") {
        return true;
    }
    match dest.find(':') {
        Some(colon) => {
            let scheme = &dest[..colon];
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }
        None => false,
    }
}

/// `path` with `.` and `..` worked out, or `None` if it climbs above the
/// root it started from.
fn normalized(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// Whether `anchor` is a GitHub line anchor (`L12` or `L12-L20`) within a
/// file of `lines` lines.
fn line_anchor_fits(anchor: &str, lines: usize) -> bool {
    let line = |s: &str| s.strip_prefix('L').and_then(|n| n.parse::<usize>().ok());
    let (first, last) = match anchor.split_once('-') {
        Some((a, b)) => (line(a), line(b)),
        None => (line(anchor), line(anchor)),
    };
    matches!((first, last), (Some(a), Some(b)) if 1 <= a && a <= b && b <= lines)
}

/// What is wrong with one link of `from` (relative to the root), if
/// anything.
fn check_link(
    root: &Path,
    from: &Path,
    dest: &str,
    pages: &BTreeMap<PathBuf, Page>,
) -> Option<String> {
    let (path, anchor) = match dest.split_once('#') {
        Some((p, a)) => (p, Some(a.to_string())),
        None => (dest, None),
    };
    // Taken as written: `%xx` escapes are not decoded (the repository's
    // file names and headings need none).
    let path = path.split('?').next().unwrap_or("");
    let target = if path.is_empty() {
        from.to_path_buf()
    } else {
        let joined = match path.strip_prefix('/') {
            Some(from_root) => PathBuf::from(from_root),
            None => from.parent().unwrap_or(Path::new("")).join(path),
        };
        match normalized(&joined) {
            Some(t) => t,
            None => return Some("points above the repository".to_string()),
        }
    };
    let pending = PENDING.iter().any(|p| Path::new(p) == target);
    let full = root.join(&target);
    if !full.exists() {
        return (!pending).then(|| format!("`{}` does not exist", target.display()));
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    if let Some(page) = pages.get(&target) {
        return (!page.anchors.contains(&anchor)).then(|| {
            format!(
                "`{}` has no heading or anchor `#{anchor}` (it has: {})",
                target.display(),
                page.anchors.join(", ")
            )
        });
    }
    let lines = fs::read_to_string(&full).map_or(0, |t| t.lines().count());
    (!line_anchor_fits(&anchor, lines)).then(|| {
        format!(
            "`#{anchor}` in `{}`, which is no Markdown page: only line anchors (`#L12`) fit there",
            target.display()
        )
    })
}

/// Every Markdown page of the repository, parsed, keyed by its path from
/// the root.
fn pages(root: &Path) -> BTreeMap<PathBuf, Page> {
    let mut files = Vec::new();
    markdown_files(root, &mut files);
    files
        .into_iter()
        .map(|file| {
            let text = fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
            let relative = file
                .strip_prefix(root)
                .expect("under the root")
                .to_path_buf();
            (relative, parse(&text))
        })
        .collect()
}

#[test]
fn every_relative_link_and_anchor_in_the_markdown_files_resolves() {
    let root = root();
    if !is_checkout(&root) {
        return;
    }
    let pages = pages(&root);
    for expected in [
        "README.md",
        "CHANGELOG.md",
        "docs/design.md",
        "tests/README.md",
    ] {
        assert!(
            pages.contains_key(Path::new(expected)),
            "{expected} was not found among the pages checked"
        );
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for (from, page) in &pages {
        for link in page.links.iter().filter(|l| !is_external(&l.dest)) {
            checked += 1;
            if let Some(why) = check_link(&root, from, &link.dest, &pages) {
                broken.push(format!(
                    "{}:{}: ({}) {why}",
                    from.display(),
                    link.line,
                    link.dest
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken link(s) of {checked}:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn every_page_listed_as_pending_is_still_missing() {
    let root = root();
    if !is_checkout(&root) {
        return;
    }
    let landed: Vec<&str> = PENDING
        .iter()
        .copied()
        .filter(|p| root.join(p).exists())
        .collect();
    assert!(
        landed.is_empty(),
        "{landed:?} exist now: remove them from PENDING in tests/markdown_links.rs, so that \
         links to them are checked"
    );
}

#[test]
fn the_readme_stays_short_enough_to_read_in_minutes() {
    let text = fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, over {README_MAX_LINES}: move reference material into \
         the rustdoc or docs/ and link to it"
    );
}

#[test]
fn headings_get_github_slugs() {
    assert_eq!(
        slug("Scoped locking: `with_lock` and `lock`"),
        "scoped-locking-with_lock-and-lock"
    );
    assert_eq!(
        slug("What a lease can (and cannot) promise"),
        "what-a-lease-can-and-cannot-promise"
    );
    assert_eq!(slug("Redis 7.0 / Valkey 9.1"), "redis-70--valkey-91");
    let page = parse("# A\n\n## A\n\n## A\n\n<a id=\"here\"></a>\n");
    assert_eq!(page.anchors, ["a", "a-1", "a-2", "here"]);
}

#[test]
fn external_links_and_line_anchors_are_told_apart() {
    assert!(is_external("https://docs.rs/redlock-sync"));
    assert!(is_external("mailto:someone@example.com"));
    assert!(!is_external("docs/design.md#the-way-data-flows"));
    assert!(!is_external("#known-limits"));
    assert!(line_anchor_fits("L3", 10));
    assert!(line_anchor_fits("L3-L10", 10));
    assert!(!line_anchor_fits("L11", 10));
    assert!(!line_anchor_fits("the-top", 10));
}
