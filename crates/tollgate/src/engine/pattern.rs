//! Path patterns: `/v1/organizations/{org}/product/*`. A pattern matches a whole path,
//! segment by segment: a literal segment matches itself, `*` any one segment, `{name}` any one
//! segment and names it, `prefix*` a segment that starts with `prefix`, and a last `**` any
//! number of segments (none too).

use std::fmt;

/// A parsed path pattern; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
    rest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Prefix(String),
    Any,
    Named(String),
}

impl PathPattern {
    /// Parses `text`.
    ///
    /// # Errors
    /// A message saying what is wrong: no leading `/`, an empty or unclosed `{}`, a `**` that
    /// is not last, a name used twice.
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some(body) = text.strip_prefix('/') else {
            return Err(format!("path pattern `{text}` must start with `/`"));
        };
        let parts: Vec<&str> = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect()
        };
        let mut segments = Vec::with_capacity(parts.len());
        let mut rest = false;
        for (i, part) in parts.iter().enumerate() {
            if *part == "**" {
                if i + 1 != parts.len() {
                    return Err(format!(
                        "path pattern `{text}`: `**` must be the last segment"
                    ));
                }
                rest = true;
            } else if *part == "*" {
                segments.push(Segment::Any);
            } else if let Some(inner) = part.strip_prefix('{') {
                let name = inner.strip_suffix('}').filter(|n| {
                    !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
                let Some(name) = name else {
                    return Err(format!(
                        "path pattern `{text}`: `{part}` must be `{{name}}`, a name of letters, \
                         digits and `_`"
                    ));
                };
                if segments
                    .iter()
                    .any(|s| matches!(s, Segment::Named(n) if n == name))
                {
                    return Err(format!("path pattern `{text}`: `{{{name}}}` appears twice"));
                }
                segments.push(Segment::Named(name.to_string()));
            } else if let Some(prefix) = part.strip_suffix('*') {
                if prefix.contains(['*', '{', '}']) {
                    return Err(format!(
                        "path pattern `{text}`: `{part}` may hold one `*`, at its end"
                    ));
                }
                segments.push(Segment::Prefix(prefix.to_string()));
            } else if part.contains(['*', '{', '}']) {
                return Err(format!(
                    "path pattern `{text}`: `{part}` may hold one `*`, at its end"
                ));
            } else {
                segments.push(Segment::Literal((*part).to_string()));
            }
        }
        Ok(Self {
            text: text.to_string(),
            segments,
            rest,
        })
    }

    /// The pattern as written: what a counter key names as the route.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether this pattern names a segment `name`.
    pub fn names(&self, name: &str) -> bool {
        self.segments
            .iter()
            .any(|s| matches!(s, Segment::Named(n) if n == name))
    }

    /// Matches `path` (without its query), and if it matches, the value of each named segment.
    pub fn matches<'p>(&self, path: &'p str) -> Option<Vec<(&str, &'p str)>> {
        let body = path.strip_prefix('/')?;
        // "/" has no segment; "/a/" has two, the second empty.
        let mut parts = body.split('/').filter(|_| !body.is_empty());
        let mut named = Vec::new();
        for segment in &self.segments {
            let part = parts.next()?;
            match segment {
                Segment::Literal(l) if l == part => {}
                Segment::Prefix(p) if part.starts_with(p.as_str()) => {}
                Segment::Any if !part.is_empty() => {}
                Segment::Named(n) if !part.is_empty() => named.push((n.as_str(), part)),
                _ => return None,
            }
        }
        (self.rest || parts.next().is_none()).then_some(named)
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_match_as_written() {
        let p = PathPattern::parse("/v1/organizations/{org}/product/*").unwrap();
        assert_eq!(
            p.matches("/v1/organizations/acme/product/7"),
            Some(vec![("org", "acme")])
        );
        assert_eq!(p.matches("/v1/organizations/acme/product"), None);
        assert_eq!(p.matches("/v1/organizations/acme/product/7/x"), None);
        assert_eq!(p.matches("/v1/organizations//product/7"), None);
        assert_eq!(p.matches("v1/organizations/acme/product/7"), None);
    }

    #[test]
    fn prefixes_and_rest() {
        let p = PathPattern::parse("/static/img*/**").unwrap();
        assert!(p.matches("/static/img2").is_some());
        assert!(p.matches("/static/img-big/a/b/c").is_some());
        assert!(p.matches("/static/css/a").is_none());
        let root = PathPattern::parse("/").unwrap();
        assert!(root.matches("/").is_some());
        assert!(root.matches("/a").is_none());
        assert!(PathPattern::parse("/**").unwrap().matches("/").is_some());
    }

    #[test]
    fn bad_patterns_say_why() {
        for (text, says) in [
            ("v1", "must start with `/`"),
            ("/a/**/b", "`**` must be the last"),
            ("/{}", "must be `{name}`"),
            ("/{a}/{a}", "appears twice"),
            ("/a*b", "one `*`, at its end"),
        ] {
            let err = PathPattern::parse(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
