//! Where an error is in a rule file: the key a YAML error is about, the line and column of a
//! section's settings and of a rule's fields, and messages in a reader's words.

/// The key written before `column` on `line` of `text` (`enabled` in `    enabled: yes`), or,
/// for a value that starts on a line of its own, the key that ends the line above it.
pub(crate) fn key_at(text: &str, line: u64, column: u64) -> Option<&str> {
    let index = usize::try_from(line).ok()?.checked_sub(1)?;
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(index)?;
    let column = usize::try_from(column).ok()?.saturating_sub(1);
    let upto = here
        .char_indices()
        .nth(column)
        .map_or(*here, |(byte, _)| &here[..byte]);
    // `key:`, perhaps followed by a block scalar's indicator, a tag or an anchor.
    let key_of = |before: &str| -> Option<usize> {
        let mut before = before.trim_end();
        if let Some((head, last)) = before.rsplit_once(char::is_whitespace)
            && (last.starts_with(['|', '>', '!', '&']))
        {
            before = head.trim_end();
        }
        let before = before.strip_suffix(':')?.trim_end();
        Some(before.len())
    };
    // The place may be the key itself, or the `:` after it.
    let at_key = {
        let rest = &here[upto.len()..];
        let word = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        rest[word..]
            .trim_start()
            .starts_with(':')
            .then_some(upto.len() + word)
    };
    let (source, end) = match key_of(upto).or(at_key) {
        Some(end) => (*here, end),
        None if upto.trim().is_empty() || upto.trim() == "-" => {
            // The value began on a later line than its key: the nearest line above that
            // is not blank or a comment, if it ends with `key:`.
            let above = lines[..index]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))?;
            (*above, key_of(above)?)
        }
        None => return None,
    };
    let before = &source[..end];
    let start = before
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    Some(&before[start..]).filter(|k| k.starts_with(|c: char| c.is_alphabetic() || c == '_'))
}

/// The edit distance between `a` and `b` (insertions, deletions, substitutions).
pub(crate) fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            let next = (row[j] + 1).min(row[j + 1] + 1).min(previous + cost);
            previous = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The one of `names` nearest to `name`, when it is close enough to be a misspelling of it
/// (at most 3 edits, and fewer than `name` has characters).
pub(crate) fn nearest<'a>(name: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    names
        .into_iter()
        .map(|n| (distance(name, n), n))
        .min()
        .filter(|(d, _)| *d <= 3 && *d < name.chars().count())
        .map(|(_, n)| n)
}

/// A YAML library's message in a user's words: which key is written twice, what type was
/// expected in plain terms, the nearest name to an unknown one; `None` when it reads well.
pub(crate) fn plain(message: &str) -> Option<String> {
    if let Some(rest) = message.strip_prefix("duplicate mapping key: ") {
        let key = rest
            .split(", set DuplicateKeyPolicy")
            .next()
            .unwrap_or(rest);
        return Some(format!("`{key}` is written twice in one mapping: keep one"));
    }
    if message.starts_with("cannot deserialize null into ") {
        return Some("a value is needed here".into());
    }
    if let Some(rest) = message.strip_prefix("invalid type: ")
        && let Some((found, expected)) = rest.split_once(", expected ")
    {
        let found = found
            .replace("floating point", "the number")
            .replace(" `", " ")
            .replace('`', "");
        return Some(format!("expected {}, found {found}", kind(expected)));
    }
    for (prefix, what) in [("unknown field `", "field"), ("unknown variant `", "value")] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((name, expected)) = rest.split_once('`')
            && let Some(names) = expected.strip_prefix(", expected one of ")
        {
            let names = names.split(", ").map(|n| n.trim_matches('`'));
            let list: Vec<&str> = names.collect();
            let guess = nearest(name, list.iter().copied())
                .map(|n| format!(": did you mean `{n}`?"))
                .unwrap_or_else(|| ",".into());
            return Some(format!(
                "unknown {what} `{name}`{guess} expected one of {}",
                list.join(", ")
            ));
        }
    }
    None
}

/// What serde calls a type, as a rule file's reader would say it.
pub(crate) fn kind(expected: &str) -> String {
    let known = [
        ("usize", "a whole number"),
        ("u64", "a whole number"),
        ("u32", "a whole number"),
        ("u16", "a whole number"),
        ("a boolean", "true or false"),
        ("bool", "true or false"),
        (
            "a sequence",
            "a list (`[a, b]`, or lines starting with `- `)",
        ),
        (
            "a map",
            "a mapping (`key: value` lines, or `{ key: value }`)",
        ),
    ];
    if let Some((_, plain)) = known.iter().find(|(k, _)| *k == expected) {
        return (*plain).into();
    }
    if expected.starts_with("struct ") {
        return "a mapping (`key: value` lines, or `{ key: value }`)".into();
    }
    expected.to_string()
}

/// The lines of the section whose value starts at `at` in `text`: each line's number, the
/// byte where the section's part of it starts, and the line. The section ends at the first
/// later line (not blank, not a comment) indented less than its first key.
pub(crate) fn section_lines(
    text: &str,
    at: (u64, u64),
) -> impl Iterator<Item = (u64, usize, &str)> {
    let (first, column) = (at.0 as usize, at.1 as usize);
    text.lines()
        .enumerate()
        .skip(first.saturating_sub(1))
        .map(move |(i, line)| {
            let start = if i + 1 == first {
                line.char_indices()
                    .nth(column.saturating_sub(1))
                    .map_or(line.len(), |(b, _)| b)
            } else {
                0
            };
            (i as u64 + 1, start, line)
        })
        .take_while(move |(n, _, line)| {
            let content = line.trim_start();
            let indent = line.len() - content.len();
            *n as usize == first
                || content.is_empty()
                || content.starts_with('#')
                || indent + 1 >= column
        })
}

/// A byte offset of `line` as a column (from 1).
pub(crate) fn column_of(line: &str, byte: usize) -> u64 {
    line[..byte].chars().count() as u64 + 1
}

/// Where `key`'s value is written in the section at `at` (the key's own place when nothing
/// follows it on its line).
pub(crate) fn section_key_place(
    text: &str,
    at: Option<(u64, u64)>,
    key: &str,
) -> Option<(u64, u64)> {
    section_lines(text, at?).find_map(|(n, start, line)| {
        let mut from = start;
        while let Some(found) = line[from..].find(key) {
            let begin = from + found;
            let end = begin + key.len();
            from = end;
            let before = line[..begin].chars().next_back();
            let bounded = before.is_none_or(|c| " \t{,-".contains(c));
            let rest = &line[end..];
            if bounded && rest.trim_start().starts_with(':') {
                let value = rest.trim_start()[1..].trim_start();
                let byte = if value.is_empty() {
                    begin
                } else {
                    line.len() - value.len()
                };
                return Some((n, column_of(line, byte)));
            }
        }
        None
    })
}

/// Where `value` is first written in the section at `at`.
pub(crate) fn value_place(text: &str, at: Option<(u64, u64)>, value: &str) -> Option<(u64, u64)> {
    if value.is_empty() {
        return None;
    }
    section_lines(text, at?).find_map(|(n, start, line)| {
        line[start..]
            .find(value)
            .map(|found| (n, column_of(line, start + found)))
    })
}

/// The plain scalar written at `line`:`column` of `text`, up to the end of its line, a
/// comment or the end of a flow collection's item.
pub(crate) fn scalar_at(text: &str, line: u64, column: u64) -> Option<&str> {
    let line = text
        .lines()
        .nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
    let (byte, _) = line
        .char_indices()
        .nth(usize::try_from(column).ok()?.checked_sub(1)?)?;
    let rest = &line[byte..];
    let end = rest.find([',', '}', ']', '#']).unwrap_or(rest.len());
    Some(rest[..end].trim()).filter(|s| !s.is_empty())
}

/// Where `text`'s content starts: the first line that is not blank, a comment or a document
/// marker, at its first character; 1:1 for a file of none.
pub(crate) fn content_start(text: &str) -> (u64, u64) {
    text.lines()
        .enumerate()
        .find_map(|(i, line)| {
            let content = line.trim_start();
            let skip = content.is_empty() || content.starts_with('#') || content == "---";
            let column = line.chars().count() - content.chars().count();
            (!skip).then_some((i as u64 + 1, column as u64 + 1))
        })
        .unwrap_or((1, 1))
}

/// Where the field an error of rule `id` names (`rule `id`: tiers[1].period: ...`) is
/// written in `text`, given the rule's place: the line and column of its value, searched for
/// in the rule's lines (block or flow style); `None` when it is not written there (a
/// default).
pub(crate) fn field_place(
    text: &str,
    rule: (u64, u64),
    id: &str,
    error: &str,
) -> Option<(u64, u64)> {
    let path = error
        .strip_prefix(&format!("rule `{id}`: "))?
        .split(": ")
        .next()?;
    // `tiers[1].period`: the second `period:` of the rule; `match.path`: its `path:`.
    let (mut nth, mut name) = (0, path.rsplit('.').next()?);
    if let Some(open) = path.find('[') {
        nth = path[open + 1..].split(']').next()?.parse().ok()?;
        if !path.contains('.') {
            name = &path[..open];
            nth = 0;
        }
    }
    let name = name.split('[').next()?;
    let (first, column) = (usize::try_from(rule.0).ok()?, usize::try_from(rule.1).ok()?);
    let mut seen = 0;
    for (i, line) in text.lines().enumerate().skip(first.saturating_sub(1)) {
        // The next item at the rule's depth or above ends it.
        let indent = line.len() - line.trim_start().len();
        if i + 1 > first && !line.trim().is_empty() && indent + 1 < column {
            return None;
        }
        let mut from = 0;
        while let Some(found) = line[from..].find(name) {
            let at = from + found;
            let before = line[..at].chars().last();
            let after = &line[at + name.len()..];
            let is_key = before.is_none_or(|c| " {,-".contains(c)) && after.starts_with(':');
            if is_key {
                if seen == nth {
                    let value = at + name.len() + 1;
                    let pad = line[value..].len() - line[value..].trim_start().len();
                    return Some((i as u64 + 1, (value + pad) as u64 + 1));
                }
                seen += 1;
            }
            from = at + name.len();
        }
    }
    None
}
