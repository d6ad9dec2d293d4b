//! The generated parts of the reference in `docs/`: each page holds blocks between
//! `<!-- generated: NAME -->` and `<!-- end: NAME -->` that a test renders from the code and
//! compares with the page. `TOLLGATE_BLESS=1 cargo test -p tollgate-server --test NAME`
//! writes the rendered blocks into the pages instead, for a change that means to change them.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

/// The path of `page` in `docs/`.
pub fn page(page: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(page)
}

/// The text of `page` in `docs/`.
pub fn read(page: &str) -> String {
    let path = self::page(page);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Where the block `name` of `text` stands between its markers.
fn span(text: &str, name: &str) -> Option<std::ops::Range<usize>> {
    let begin = format!("<!-- generated: {name} -->\n");
    let end = format!("<!-- end: {name} -->");
    let start = text.find(&begin)? + begin.len();
    let stop = start + text[start..].find(&end)?;
    Some(start..stop)
}

/// The block `name` of `text`: what stands between its markers.
pub fn block<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    span(text, name).map(|r| &text[r])
}

/// Checks that block `name` of `page` is `rendered`; with `TOLLGATE_BLESS=1`, writes it.
pub fn check_block(page: &str, name: &str, rendered: &str) {
    let text = read(page);
    let Some(range) = span(&text, name) else {
        panic!(
            "docs/{page} has no block `{name}` (<!-- generated: {name} --> ... <!-- end: {name} -->)"
        );
    };
    let found = &text[range.clone()];
    if found == rendered {
        return;
    }
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        let updated = format!("{}{rendered}{}", &text[..range.start], &text[range.end..]);
        std::fs::write(self::page(page), updated).unwrap();
        return;
    }
    let first = found
        .lines()
        .zip(rendered.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| found.lines().count().min(rendered.lines().count()));
    panic!(
        "docs/{page}, block `{name}`, is not what the code says (first difference at its line \
         {}):\n  page: {:?}\n  code: {:?}\nRun with TOLLGATE_BLESS=1 to write what the code says.",
        first + 1,
        found.lines().nth(first).unwrap_or(""),
        rendered.lines().nth(first).unwrap_or(""),
    );
}

/// `text` as a table cell: lines joined, pipes escaped.
pub fn cell(text: &str) -> String {
    text.split('\n')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}
