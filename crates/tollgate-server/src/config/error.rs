//! Where a configuration's parts were written, and the error of a rule file: its file, line
//! and column, and what is wrong, in a reader's words.

use std::fmt;
use std::path::{Path, PathBuf};

use super::places::{key_at, plain, scalar_at};

/// A place in a rule file: the file, and the line and column (from 1) when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The file.
    pub file: PathBuf,
    /// Line and column.
    pub at: Option<(u64, u64)>,
}

impl Place {
    /// An error at this place.
    pub fn error(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::new(&self.file, self.at, message)
    }
}

/// Where the parts of a configuration were written.
#[derive(Debug, Clone, Default)]
pub struct Places {
    /// The first file.
    pub first: Option<PathBuf>,
    /// The `server` section, if a file has one.
    pub server: Option<Place>,
    /// The `store` section, if a file has one.
    pub store: Option<Place>,
    /// Each native rule, by id.
    pub rules: std::collections::HashMap<String, Place>,
}

impl Places {
    /// The place of the `server` section, or the first file.
    pub fn server(&self) -> Place {
        self.server.clone().unwrap_or_else(|| self.file())
    }

    /// The place of the `store` section, or the first file.
    pub fn store(&self) -> Place {
        self.store.clone().unwrap_or_else(|| self.file())
    }

    /// The place of rule `id`, or the first file.
    pub fn rule(&self, id: &str) -> Place {
        self.rules.get(id).cloned().unwrap_or_else(|| self.file())
    }

    /// The first file, with no place in it.
    pub fn file(&self) -> Place {
        Place {
            file: self.first.clone().unwrap_or_else(|| PathBuf::from("-")),
            at: None,
        }
    }
}

/// A rule file that cannot be loaded: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// Line and column (from 1), when the error has a place.
    pub at: Option<(u64, u64)>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some((line, column)) => write!(
                f,
                "{}:{line}:{column}: {}",
                self.file.display(),
                self.message
            ),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// An error in `file`, at line and column `at` when known.
    pub fn new(file: &Path, at: Option<(u64, u64)>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            at,
            message: message.into(),
        }
    }

    /// A YAML error in `text`, with its place and without the snippet the message may carry,
    /// in plain words: a message that names no field ("invalid boolean") is given the key
    /// written where it points, what is expected there and what is written instead.
    pub(crate) fn yaml(file: &Path, text: &str, err: &serde_saphyr::Error) -> Self {
        let at = err
            .location()
            .filter(|l| l.line() > 0)
            .map(|l| (l.line(), l.column()));
        let rendered = err.without_snippet().to_string();
        // The library prefixes its own rendering of the place; keep the reason.
        let first = rendered.lines().next().unwrap_or("invalid YAML").trim();
        // The place is said once, in front.
        let message = match first.rfind(" at line ") {
            Some(i) if at.is_some() => &first[..i],
            _ => first,
        };
        let mut message = plain(message).unwrap_or_else(|| message.to_string());
        // A scalar of the wrong kind: what was expected, and what is written there.
        let wanted = match message.as_str() {
            "invalid boolean" => Some("true or false"),
            m if m.starts_with("invalid u") || m.starts_with("invalid i") => Some("a whole number"),
            _ => None,
        };
        if let Some(wanted) = wanted {
            message = match at.and_then(|(line, column)| scalar_at(text, line, column)) {
                Some(found) => format!("expected {wanted}, found `{found}`"),
                None => format!("expected {wanted}"),
            };
        }
        // Messages that name their own field keep it; the others get the key they are about.
        let named = ["unknown field", "`", "missing field"]
            .iter()
            .any(|n| message.starts_with(n));
        if let Some(key) = at.and_then(|(line, column)| key_at(text, line, column))
            && !named
            && !message.starts_with(&format!("{key}:"))
        {
            message = format!("{key}: {message}");
        }
        Self::new(file, at, message)
    }
}
