#!/usr/bin/env python3
"""Size and prose of Rust source folders: code lines, doc and comment lines,
their ratio, the doc sentences' lengths, and (with --fns) the long functions.

Usage: python3 .ci/measure.py [--fns] [--files] ROOT_SRC_DIR...

Each ROOT_SRC_DIR is a folder of `.rs` files (searched recursively) or one
file. One line per root is printed, then one for all roots together; --files
adds a line per file, --fns every function longer than 80 lines. Python 3's
standard library only.

Lines. Each line of a file is one of:

- test: inside an item under `#[cfg(test)]` or `#[cfg(all(test, ..))]`
  (from the attribute to the item's closing brace or semicolon), or inside
  a `#[test]` fn. A file that a `#[cfg(test)] mod
  name;` declares (`name.rs` or `name/mod.rs` beside it, and its folder) is
  test as a whole. Test lines count as nothing below: not code, not doc,
  not comment.
- code: a line with any token outside comments. A string literal is code on
  every line it spans (Lua or other text in a string constant is code), and
  so is a line with code and a trailing comment.
- doc: a line with only a doc comment (`///`, `//!`, `/** */`, `/*! */`).
- comment: a line with only other comments (`//`, `/* */`).
- blank: nothing but whitespace.

The ratio is (doc + comment) / code.

Sentences. The doc comments outside test lines are read as blocks: a run of
`///` (or `//!`) lines with nothing else between them, or one `/** */`
(`/*! */`) comment. In a block, the comment markers are stripped and the
lines between ``` (or ~~~) fences are left out, as are link definitions
(`[name]: target`). The rest is cut into sentences:

- a sentence ends at `.`, `!` or `?` followed by whitespace or the end of
  the block (so "e.g. this" ends one at "e.g.", and "0.6" ends none);
- a Markdown block also ends one: a blank doc line, a heading (`# ...`), a
  list item's start (`- `, `* `, `1. `), each table row (`| ... |`; the
  `|---|` row is left out), and a code fence.

A sentence's length is its number of words: whitespace-separated pieces
that hold at least one letter or digit (so `[`Lock`](crate::Lock)` is one
word and a lone `-` none). Sentences of no words are dropped. The median is
the middle length (the mean of the two middle ones for an even count); the
90th percentile is the nearest rank: the length at position ceil(0.9 n) of
the n lengths sorted.

Functions. A function's length is its lines from the line of its `fn`
keyword to the line of its closing brace; functions inside test lines are
left out.
"""
import bisect
import math
import os
import re
import statistics
import sys

LONG_FN = 80


def scan(text):
    """Blank out comments and literals (newlines kept) and tag each line.

    Returns (stripped, kinds, docs): `stripped` is `text` with comments,
    strings and char literals replaced by spaces; `kinds[i]` is the set of
    tags of line i (`code`, `doc`, `comment`); `docs` lists the doc comments
    as (first line, style, text), style `line` for `///`/`//!`, `block` for
    `/** */`/`/*! */`.
    """
    n = len(text)
    i = 0
    line = 0
    out = []
    kinds = [set()]
    docs = []

    def newline():
        nonlocal line
        out.append("\n")
        line += 1
        kinds.append(set())

    while i < n:
        c = text[i]
        if c == "\n":
            newline()
            i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            if j < 0:
                j = n
            seg = text[i:j]
            is_doc = (seg.startswith("///") and not seg.startswith("////")) or seg.startswith("//!")
            kinds[line].add("doc" if is_doc else "comment")
            if is_doc:
                docs.append((line, "line:" + seg[:3], seg[3:]))
            out.append(" " * (j - i))
            i = j
            continue
        if text.startswith("/*", i):
            is_doc = (
                text.startswith("/**", i)
                and not text.startswith("/**/", i)
                and not text.startswith("/***", i)
            ) or text.startswith("/*!", i)
            tag = "doc" if is_doc else "comment"
            first = line
            depth = 0
            j = i
            while j < n:
                if text.startswith("/*", j):
                    depth += 1
                    out.append("  ")
                    j += 2
                    continue
                if text.startswith("*/", j):
                    depth -= 1
                    out.append("  ")
                    j += 2
                    if depth == 0:
                        break
                    continue
                if text[j] == "\n":
                    newline()
                    j += 1
                    continue
                kinds[line].add(tag)
                out.append(" ")
                j += 1
            kinds[line].add(tag)
            if is_doc:
                docs.append((first, "block", text[i + 3 : max(i + 3, j - 2)]))
            i = j
            continue
        raw = re.match(r'(b?r)(#*)"', text[i : i + 300])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = '"' + raw.group(2)
            j = text.find(close, i + len(raw.group(0)))
            j = n if j < 0 else j + len(close)
            kinds[line].add("code")
            for ch in text[i:j]:
                if ch == "\n":
                    newline()
                    kinds[line].add("code")
                else:
                    out.append(" ")
            i = j
            continue
        if c == '"' or (
            text.startswith('b"', i)
            and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))
        ):
            j = i + (2 if c == "b" else 1)
            kinds[line].add("code")
            out.append(" " * (j - i))
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n and text[j + 1] != "\n":
                    out.append("  ")
                    j += 2
                    continue
                if text[j] == "\\":
                    out.append(" ")
                    j += 1
                    continue
                if text[j] == "\n":
                    newline()
                    kinds[line].add("code")
                    j += 1
                    continue
                out.append(" ")
                j += 1
            out.append(" ")
            i = j + 1
            continue
        if c == "'":
            lit = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'", text[i : i + 14])
            if lit:
                kinds[line].add("code")
                out.append(" " * len(lit.group(0)))
                i += len(lit.group(0))
                continue
        if not c.isspace():
            kinds[line].add("code")
        out.append(c)
        i += 1
    return "".join(out), kinds, docs


def closing(s, k):
    """Index of the brace that closes the one at `k` in stripped text `s`."""
    depth = 0
    for j in range(k, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


TEST_ATTR = re.compile(r"#\[\s*(cfg\s*\(\s*(all\s*\(\s*)?test\b|test\s*\])")


def test_lines(s, starts, nlines):
    """Which lines lie in test items, and the names of `mod name;` items
    declared under a test attribute."""
    test = [False] * (nlines + 1)
    test_mods = []
    for m in TEST_ATTR.finditer(s):
        j = m.end()
        depth = 0
        while j < len(s):  # past the attribute's closing `]`
            if s[j] == "[":
                depth += 1
            elif s[j] == "]":
                if depth == 0:
                    j += 1
                    break
                depth -= 1
            j += 1
        b = j
        while b < len(s) and s[b] not in "{;":
            b += 1
        if b < len(s) and s[b] == ";":
            decl = re.search(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", s[j:b])
            if decl:
                test_mods.append(decl.group(1))
            end = b
        else:
            end = closing(s, b) if b < len(s) else len(s) - 1
        first = bisect.bisect_right(starts, m.start()) - 1
        last = bisect.bisect_right(starts, end) - 1
        for k in range(first, min(last, nlines) + 1):
            test[k] = True
    return test, test_mods


def functions(s, starts, test):
    """(name, first line, length) of every fn with a body outside test lines
    (lines 1-based)."""
    found = []
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", s):
        b = m.end()
        depth = 0
        while b < len(s):
            ch = s[b]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif ch in "{;" and depth <= 0:
                break
            b += 1
        if b >= len(s) or s[b] == ";":
            continue
        first = bisect.bisect_right(starts, m.start()) - 1
        last = bisect.bisect_right(starts, closing(s, b)) - 1
        if not test[first]:
            found.append((m.group(1), first + 1, last - first + 1))
    return found


BLOCK_START = re.compile(r"^(#{1,6}\s|[-*+]\s|\d+[.)]\s|\|)")
LINK_DEF = re.compile(r"^\[[^\]]+\]:\s")
FENCE = re.compile(r"^(```|~~~)")
TABLE_RULE = re.compile(r"^\|?[\s:|-]+\|?$")


def doc_blocks(docs, test):
    """The doc comments outside test lines, as blocks of text lines."""
    blocks = []
    prev = None
    for first, style, body in docs:
        if test[first]:
            continue
        if style == "block":
            lines = [re.sub(r"^\s*\*(?!/)\s?", "", l) for l in body.split("\n")]
            blocks.append(lines)
            prev = None
            continue
        text = body[1:] if body.startswith(" ") else body
        if prev and prev[0] == first - 1 and prev[1] == style:
            blocks[-1].append(text)
        else:
            blocks.append([text])
        prev = (first, style)
    return blocks


def sentences(lines):
    """Word counts of the sentences of one doc block (see the module doc)."""
    counts = []
    words = []

    def end():
        if words:
            counts.append(len(words))
            words.clear()

    fenced = False
    for raw in lines:
        text = raw.strip()
        if FENCE.match(text):
            end()
            fenced = not fenced
            continue
        if fenced or LINK_DEF.match(text):
            continue
        if not text or BLOCK_START.match(text):
            end()
            if text.startswith("|") and TABLE_RULE.match(text):
                continue
        for piece in re.split(r"(\s+)", text):
            if not piece or piece.isspace():
                continue
            if any(ch.isalnum() for ch in piece):
                words.append(piece)
            if piece[-1] in ".!?":
                end()
        if text.startswith("|"):
            end()
    end()
    return counts


def module_dir(path):
    """The folder in which the modules that `path` declares live."""
    base = os.path.basename(path)
    if base in ("lib.rs", "main.rs", "mod.rs"):
        return os.path.dirname(path)
    return os.path.splitext(path)[0]


def analyse(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    s, kinds, docs = scan(text)
    starts = [0] + [m.end() for m in re.finditer("\n", s)]
    nlines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    test, test_mods = test_lines(s, starts, nlines)
    counts = dict(code=0, doc=0, comment=0, test=0, blank=0)
    for k in range(nlines):
        tags = kinds[k] if k < len(kinds) else set()
        if test[k]:
            counts["test" if tags else "blank"] += 1
        elif "code" in tags:
            counts["code"] += 1
        elif "doc" in tags:
            counts["doc"] += 1
        elif "comment" in tags:
            counts["comment"] += 1
        else:
            counts["blank"] += 1
    lengths = [c for block in doc_blocks(docs, test) for c in sentences(block)]
    excluded = []
    here = module_dir(path)
    for name in test_mods:
        excluded += [os.path.join(here, name + ".rs"), os.path.join(here, name)]
    return counts, lengths, functions(s, starts, test), excluded


def rust_files(root):
    if os.path.isfile(root):
        return [root]
    found = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        found += [os.path.join(d, f) for f in sorted(files) if f.endswith(".rs")]
    return found


def percentile(values, p):
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


class Total:
    def __init__(self):
        self.counts = dict(code=0, doc=0, comment=0, test=0, blank=0)
        self.lengths = []

    def add(self, counts, lengths):
        for k in self.counts:
            self.counts[k] += counts[k]
        self.lengths += lengths

    def row(self, name):
        c = self.counts
        ratio = (c["doc"] + c["comment"]) / c["code"] if c["code"] else 0.0
        med = statistics.median(self.lengths) if self.lengths else 0
        return (
            f"{name:<40} {c['code']:>6} {c['doc']:>6} {c['comment']:>7} {ratio:>5.2f}"
            f" {len(self.lengths):>9} {med:>6g} {percentile(self.lengths, 0.9):>4}"
        )


HEADER = f"{'root':<40} {'code':>6} {'doc':>6} {'comment':>7} {'ratio':>5} {'sentences':>9} {'median':>6} {'p90':>4}"


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    flags = {a for a in argv if a.startswith("--")}
    unknown = flags - {"--fns", "--files"}
    if not args or unknown:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    print(HEADER)
    everything = Total()
    long_fns = []
    for root in args:
        if not os.path.exists(root):
            print(f"{root}: no such file or folder", file=sys.stderr)
            return 2
        total = Total()
        results = {f: analyse(f) for f in rust_files(root)}
        excluded = [p for r in results.values() for p in r[3]]
        for path, (counts, lengths, fns, _) in results.items():
            if any(path == e or path.startswith(e + os.sep) for e in excluded):
                continue
            total.add(counts, lengths)
            if "--files" in flags:
                one = Total()
                one.add(counts, lengths)
                print(one.row("  " + os.path.relpath(path, root)))
            long_fns += [(path, *f) for f in fns if f[2] > LONG_FN]
        print(total.row(root))
        everything.add(total.counts, total.lengths)
    if len(args) > 1:
        print(everything.row("all"))
    if "--fns" in flags:
        print(f"\nfunctions over {LONG_FN} lines: {len(long_fns)}")
        for path, name, line, length in sorted(long_fns, key=lambda f: -f[3]):
            print(f"  {length:>4}  {path}:{line}  fn {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
