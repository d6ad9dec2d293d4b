//! The layout holds: imports run one way between the files of each crate (no file is in a
//! circle of imports with another, in its folder or across folders), and README's "Layout"
//! names every part of the tree and nothing that is not there.
//!
//! A part is a top-level module: a folder under `src/` or a file beside them. Imports are read
//! from the source: `crate::a::b` and `super::` paths (in `use` trees too), outside comments
//! and `#[cfg(test)]` modules; a module's use of its own descendants is its structure and not
//! counted, their use of it is. A name re-exported by a module file counts as an import of the
//! file that defines it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `src`, by its path relative to `src` (`http/mod.rs`), with its code.
fn sources(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path
                    .strip_prefix(src)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(name, code(&std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// `text` without comments, string literals' contents and `#[cfg(test)]` modules.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let line = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The module path of a file (`http/mod.rs` -> `[http]`, `lib.rs` -> `[]`).
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

struct Crate {
    files: BTreeMap<String, String>,
}

impl Crate {
    /// The file of module `path`, if it is one.
    fn file_of(&self, path: &[String]) -> Option<String> {
        if path.is_empty() {
            return Some("lib.rs".into());
        }
        let joined = path.join("/");
        [format!("{joined}.rs"), format!("{joined}/mod.rs")]
            .into_iter()
            .find(|f| self.files.contains_key(f))
    }

    /// The names module file `file` re-exports (`pub use a::b::{C, D};`), to their paths.
    fn reexports(&self, file: &str) -> BTreeMap<String, Vec<String>> {
        let me = module_of(file);
        let code = &self.files[file];
        let mut out = BTreeMap::new();
        for statement in code.split(';') {
            let mut statement = statement.trim();
            // Attributes first (`#[cfg(feature = "redis")]`).
            while let Some(rest) = statement.strip_prefix("#[") {
                statement = rest.split_once(']').map_or("", |(_, r)| r).trim_start();
            }
            let Some(rest) = ["pub use ", "pub(crate) use ", "pub(super) use "]
                .iter()
                .find_map(|p| statement.strip_prefix(p))
            else {
                continue;
            };
            let rest: String = rest.split_whitespace().collect();
            let (prefix, names) = match rest.split_once("::{") {
                Some((prefix, names)) => (prefix.to_string(), names.trim_end_matches('}')),
                None => match rest.rsplit_once("::") {
                    Some((prefix, name)) => (prefix.to_string(), name),
                    None => continue,
                },
            };
            let mut base: Vec<String> = prefix.split("::").map(String::from).collect();
            if base.first().is_some_and(|b| b == "crate") {
                base.remove(0);
            } else {
                base = me.iter().cloned().chain(base).collect();
            }
            for name in names.split(',').filter(|n| !n.is_empty()) {
                out.insert(name.to_string(), base.clone());
            }
        }
        out
    }

    /// The file that defines what `path` names: its longest prefix that is a module, or the
    /// module a name of it is re-exported from.
    fn resolve(&self, path: &[String]) -> Option<String> {
        for k in (0..=path.len()).rev() {
            if let Some(file) = self.file_of(&path[..k]) {
                if k < path.len()
                    && let Some(target) = self.reexports(&file).get(&path[k])
                {
                    let mut full = target.clone();
                    full.extend_from_slice(&path[k..]);
                    if full != path {
                        return self.resolve(&full);
                    }
                }
                return Some(file);
            }
        }
        None
    }

    /// Each file's imports of other files.
    fn imports(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges = BTreeMap::new();
        for (file, code) in &self.files {
            let me = module_of(file);
            let mut to = BTreeSet::new();
            // A module's use of its own descendants is its structure, not an import.
            let mut add = |path: Vec<String>| {
                if let Some(target) = self.resolve(&path)
                    && target != *file
                    && !module_of(&target).starts_with(&me)
                {
                    to.insert(target);
                }
            };
            for path in paths(code) {
                let mut path = path;
                let base = match path[0].as_str() {
                    "crate" => Vec::new(),
                    "super" => me[..me.len().saturating_sub(1)].to_vec(),
                    "self" => me.clone(),
                    child
                        if self
                            .file_of(&[me.clone(), vec![child.to_string()]].concat())
                            .is_some() =>
                    {
                        path.insert(0, "self".into());
                        me.clone()
                    }
                    _ => continue,
                };
                let mut full = base;
                full.extend(path.into_iter().skip(1).filter(|p| p != "super"));
                add(full);
            }
            edges.insert(file.clone(), to);
        }
        edges
    }
}

/// Every path of two segments or more in `code`, `use` trees expanded one level
/// (`crate::{a, b::c}` gives `crate::a` and `crate::b::c`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let bytes: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            segments.push(bytes[start..j].iter().collect::<String>());
            if bytes.get(j) == Some(&':') && bytes.get(j + 1) == Some(&':') {
                j += 2;
                if bytes.get(j) == Some(&'{') {
                    let end = bytes[j..]
                        .iter()
                        .position(|&c| c == '}')
                        .map_or(bytes.len(), |e| j + e);
                    let inner: String = bytes[j + 1..end].iter().collect();
                    for item in inner.split(',') {
                        let item: String = item.split_whitespace().next().unwrap_or("").into();
                        if !item.is_empty() {
                            let mut path = segments.clone();
                            path.extend(item.split("::").map(String::from));
                            out.push(path);
                        }
                    }
                    j = end;
                    segments.clear();
                    break;
                }
                if j < bytes.len() && ident(bytes[j]) {
                    continue;
                }
            }
            break;
        }
        if segments.len() >= 2 {
            out.push(segments);
        }
        i = j.max(i + 1);
    }
    out
}

/// The strongly connected components of `edges` with more than one file.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    // Kosaraju: finish order on the graph, then components on its reverse.
    fn finish(
        v: &str,
        e: &BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(v.to_string()) {
            return;
        }
        for w in &e[v] {
            finish(w, e, seen, order);
        }
        order.push(v.to_string());
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for v in edges.keys() {
        finish(v, edges, &mut seen, &mut order);
    }
    let mut reverse: BTreeMap<String, BTreeSet<String>> =
        edges.keys().map(|k| (k.clone(), BTreeSet::new())).collect();
    for (v, ws) in edges {
        for w in ws {
            reverse.get_mut(w).unwrap().insert(v.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for v in order.iter().rev() {
        let mut component = Vec::new();
        finish(v, &reverse, &mut assigned, &mut component);
        if component.len() > 1 {
            out.push(component.into_iter().collect());
        }
    }
    out
}

/// The circles of imports of the crate at `src`, each as its files.
fn circles_of(src: &Path) -> Vec<String> {
    let krate = Crate {
        files: sources(src),
    };
    circles(&krate.imports())
        .into_iter()
        .map(|c| c.into_iter().collect::<Vec<_>>().join(" -> "))
        .collect()
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

#[test]
fn no_file_of_the_service_is_in_a_circle_of_imports() {
    let found = circles_of(&crate_src("tollgate-server"));
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn no_file_of_the_library_is_in_a_circle_of_imports() {
    let found = circles_of(&crate_src("tollgate"));
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn the_checker_sees_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "mod a;\nmod b;\npub use b::Thing;\n");
    write("a/mod.rs", "mod inner;\nuse crate::Thing;\n");
    write("a/inner.rs", "pub struct Inner;\n");
    write(
        "b.rs",
        "use crate::a::{self, inner::Inner};\npub struct Thing;\n// use crate::c;\n",
    );
    let found = circles_of(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("a/mod.rs") && found[0].contains("b.rs"),
        "{found:?}"
    );
    write("b.rs", "pub struct Thing;\n");
    assert!(circles_of(dir.path()).is_empty());
    // Within one folder too: a module file and its child, through a crate-wide re-export.
    write(
        "a/mod.rs",
        "mod inner;\nuse inner::Inner;\npub(crate) use crate::b::Thing;\n",
    );
    write("a/inner.rs", "use super::Thing;\npub struct Inner;\n");
    write("b.rs", "use crate::a::inner;\npub struct Thing;\n");
    let found = circles_of(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("a/inner.rs") && found[0].contains("b.rs"),
        "{found:?}"
    );
    // A module that uses its child, and the child that uses it, are one part: no circle.
    write("b.rs", "pub struct Thing;\n");
    write(
        "a/mod.rs",
        "mod inner;\nuse inner::Inner;\npub struct Outer;\n",
    );
    write("a/inner.rs", "use super::Outer;\npub struct Inner;\n");
    assert!(circles_of(dir.path()).is_empty());
}

/// The first column of the README's layout block under `crates/NAME/src/`: the parts named.
fn readme_layout(name: &str) -> BTreeSet<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let start = readme
        .find("## Layout")
        .expect("README has a Layout section");
    let block = &readme[start..];
    let block = &block[block.find("```text").unwrap()..];
    let block = &block[..block[7..].find("```").unwrap() + 7];
    let header = format!("crates/{name}/src/");
    let mut inside = false;
    let mut names = BTreeSet::new();
    for line in block.lines() {
        if line.starts_with("crates/") {
            inside = line.starts_with(&header);
            continue;
        }
        if inside
            && line.starts_with("  ")
            && !line.starts_with("   ")
            && let Some(first) = line.split_whitespace().next()
        {
            names.insert(first.trim_end_matches('/').to_string());
        }
    }
    names
}

/// The top-level entries of a crate's `src/`: folders and files (without `.rs`).
fn tree(name: &str) -> BTreeSet<String> {
    std::fs::read_dir(crate_src(name))
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                file
            } else {
                file.trim_end_matches(".rs").to_string()
            }
        })
        .filter(|n| n != "lib")
        .collect()
}

#[test]
fn readme_layout_follows_the_tree() {
    for name in ["tollgate-server", "tollgate"] {
        let named: BTreeSet<String> = readme_layout(name)
            .into_iter()
            .map(|n| n.trim_end_matches(".rs").to_string())
            .collect();
        let tree = tree(name);
        let missing: Vec<_> = tree.difference(&named).collect();
        let stale: Vec<_> = named.difference(&tree).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "README's layout of {name}: not named {missing:?}; named but not in the tree {stale:?}"
        );
    }
}

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A heading's anchor as GitHub makes it: lower case, spaces to dashes, other punctuation out.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every markdown page the documentation is made of: README, BENCHMARKS and docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

#[test]
fn readme_orients_and_links_every_page_of_the_reference() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md is {lines} lines: it orients, the reference is in docs/"
    );
    for page in pages().iter().skip(2) {
        let name = page.file_name().unwrap().to_string_lossy();
        assert!(
            readme.contains(&format!("(docs/{name})")),
            "README.md does not link docs/{name}"
        );
    }
}

#[test]
fn links_between_the_pages_resolve() {
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let mut in_code = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            }
            if in_code {
                continue;
            }
            for part in line.split("](").skip(1) {
                let Some(target) = part.split(')').next() else {
                    continue;
                };
                if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                    continue;
                }
                let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
                let linked = if file.is_empty() {
                    page.clone()
                } else {
                    page.parent().unwrap().join(file)
                };
                assert!(
                    linked.exists(),
                    "{}: a link to {target}, which does not exist",
                    page.display()
                );
                if !fragment.is_empty() && linked.extension().is_some_and(|e| e == "md") {
                    let text = std::fs::read_to_string(&linked).unwrap();
                    let anchors: BTreeSet<String> = text
                        .lines()
                        .filter(|l| l.starts_with('#'))
                        .map(|l| anchor(l.trim_start_matches('#')))
                        .collect();
                    assert!(
                        anchors.contains(fragment),
                        "{}: a link to {target}, a heading {} does not have",
                        page.display(),
                        linked.display()
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 30, "only {checked} links checked");
}
