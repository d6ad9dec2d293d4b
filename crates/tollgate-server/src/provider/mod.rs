//! Where the configuration comes from: rule files and directories of them (the Envoy
//! service's runtime directory among them), in either format, merged with the settings of
//! the environment into one [`Config`]; and the watcher that reloads them when they change
//! ([`watch`]); and, with `CONFIG_TYPE=GRPC_XDS_SOTW`, Envoy domains pushed by an xDS
//! management server ([`xds`]), served beside the files. A file is Envoy's when it has a
//! top-level `domain` or `descriptors`; every other file is native.

pub mod watch;
pub mod xds;

use std::path::{Path, PathBuf};

use tollgate::engine::{Domain, Engine, Node, Route};

use crate::config::{Config, ConfigError, Place, Places, RuleSpec, StoreConfig, native, places};
use crate::envoy::{file, settings};
use crate::service::Service;

/// One file, parsed: native sections, or an Envoy domain.
#[derive(Debug)]
enum Parsed {
    Native(Box<native::Sections>),
    Envoy(file::Parsed),
}

/// Where the Envoy ratelimit service reads its files, from the environment as it does:
/// `RUNTIME_ROOT` (`/srv/runtime_data/current`), `RUNTIME_SUBDIRECTORY` and
/// `RUNTIME_APPDIRECTORY` (`config`), one below the other.
pub fn runtime_directory() -> PathBuf {
    let setting = |name: &str, default: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_string())
    };
    let mut dir = PathBuf::from(setting("RUNTIME_ROOT", "/srv/runtime_data/current"));
    dir.push(setting("RUNTIME_SUBDIRECTORY", ""));
    dir.push(setting("RUNTIME_APPDIRECTORY", "config"));
    dir
}

/// The rule files `paths` name: a file itself, a directory every file below it (in name
/// order; files and directories whose names start with `.` left out, as editors' and
/// Kubernetes' own are, unless `RUNTIME_IGNOREDOTFILES` is set to false).
///
/// # Errors
/// A path that cannot be read, or `RUNTIME_IGNOREDOTFILES` that is not a boolean.
pub fn files_of(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ConfigError> {
    let hidden_too = settings::env_flag_set("RUNTIME_IGNOREDOTFILES")? == Some(false);
    fn walk(dir: &Path, files: &mut Vec<PathBuf>, hidden_too: bool) -> Result<(), ConfigError> {
        let entries = std::fs::read_dir(dir)
            .map_err(|e| ConfigError::new(dir, None, format!("cannot read: {e}")))?;
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let hidden = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if hidden && !hidden_too {
                continue;
            }
            if path.is_dir() {
                walk(&path, files, hidden_too)?;
            } else {
                files.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut files, hidden_too)?;
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// Loads and merges the files `paths` name (see [`files_of`]; each native or Envoy). With
/// `MERGE_DOMAIN_CONFIG` (the Envoy service's setting), files of one domain merge.
///
/// # Errors
/// The first file that cannot be read or is invalid, with the place and the reason; also two
/// files that both set `server` or `store`, two rules of one id, two domains of one name.
pub fn load(paths: &[PathBuf]) -> Result<Config, ConfigError> {
    load_texts(&read(paths)?)
}

/// Loads the files `paths` name with the domains an xDS server pushed (`Some`, with
/// `CONFIG_TYPE=GRPC_XDS_SOTW`: no file is needed then), or the files alone (`None`).
///
/// # Errors
/// As [`load`].
pub fn load_with(
    paths: &[PathBuf],
    pushed: Option<&[(PathBuf, String)]>,
) -> Result<Config, ConfigError> {
    let Some(pushed) = pushed else {
        return load(paths);
    };
    let mut texts = read(paths)?;
    texts.extend_from_slice(pushed);
    assemble(&texts)
}

/// The texts of the files `paths` name (see [`files_of`]).
fn read(paths: &[PathBuf]) -> Result<Vec<(PathBuf, String)>, ConfigError> {
    let files = files_of(paths)?;
    let mut texts = Vec::with_capacity(files.len());
    for file in &files {
        let bytes = std::fs::read(file)
            .map_err(|e| ConfigError::new(file, None, format!("cannot read: {e}")))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            // The place of the first byte that is not UTF-8.
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let line = valid.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
            let start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let column = String::from_utf8_lossy(&valid[start..]).chars().count() as u64 + 1;
            ConfigError::new(
                file,
                Some((line, column)),
                "not UTF-8 text: rule files are UTF-8",
            )
        })?;
        texts.push((file.clone(), text));
    }
    Ok(texts)
}

/// Reads the files `service` serves again and swaps their rules in, with the domains an xDS
/// server pushed last, when they are valid (see [`Service::reload`]).
///
/// # Errors
/// The files' first error; the rules in use keep serving.
pub fn reload(service: &Service) -> Result<(), ConfigError> {
    let pushed = service.pushed();
    service.reload(load_with(service.sources(), pushed.as_deref()))
}

/// Swaps in the domains an xDS server pushed, with the files, when they are valid; they are
/// then kept for the files' reloads.
///
/// # Errors
/// Why they are not valid; the rules in use keep serving.
pub fn apply_push(service: &Service, texts: xds::Texts) -> Result<(), ConfigError> {
    let mut pushed = service.pushed();
    service.reload(load_with(service.sources(), Some(&texts)))?;
    *pushed = Some(texts);
    Ok(())
}

/// Loads and merges files given as (name, text).
///
/// # Errors
/// As [`load`].
pub fn load_texts(texts: &[(PathBuf, String)]) -> Result<Config, ConfigError> {
    if texts.is_empty() {
        return Err(ConfigError::new(Path::new("-"), None, "no rule file given"));
    }
    assemble(texts)
}

/// A configuration of no rule file: the environment's settings and no rules, which
/// `FORCE_START_WITHOUT_INITIAL_CONFIG` serves until the files load.
///
/// # Errors
/// A setting of the environment, as [`load`] refuses it.
pub fn without_files() -> Result<Config, ConfigError> {
    assemble(&[])
}

/// The configuration of `texts`, merged, with the environment's settings.
fn assemble(texts: &[(PathBuf, String)]) -> Result<Config, ConfigError> {
    let (mut server, mut store) = (None, None);
    let mut specs: Vec<RuleSpec> = Vec::new();
    let mut routes: Vec<Route> = Vec::new();
    // Each domain's name, its nodes so far and the domain they make.
    let mut domains: Vec<(String, Vec<Node>, Domain)> = Vec::new();
    let merge = settings::env_flag("MERGE_DOMAIN_CONFIG")?;
    let mut places = Places {
        first: texts.first().map(|(file, _)| file.clone()),
        ..Places::default()
    };
    let place = |file: &Path, at| Place {
        file: file.to_path_buf(),
        at,
    };
    for (file, text) in texts {
        let (parsed, domain) = match parse(file, text)? {
            Parsed::Native(sections) => (*sections, None),
            Parsed::Envoy(domain) => (native::Sections::default(), Some(domain)),
        };
        if let Some((s, at)) = parsed.server {
            if server.replace(s).is_some() {
                return Err(ConfigError::new(file, at, "`server` is set in two files"));
            }
            places.server = Some(place(file, at));
        }
        if let Some((s, at)) = parsed.store {
            if store.replace(s).is_some() {
                return Err(ConfigError::new(file, at, "`store` is set in two files"));
            }
            places.store = Some(place(file, at));
        }
        for (spec, at) in parsed.specs {
            if specs.iter().any(|s| s.id == spec.id) {
                return Err(ConfigError::new(
                    file,
                    at,
                    format!("two rules have the id `{}`", spec.id),
                ));
            }
            let route = spec.route().map_err(|e| {
                let at =
                    at.map(|rule| places::field_place(text, rule, &spec.id, &e).unwrap_or(rule));
                ConfigError::new(file, at, e)
            })?;
            routes.push(route);
            places.rules.insert(spec.id.clone(), place(file, at));
            specs.push(spec);
        }
        if let Some(file::Parsed {
            domain: name,
            at,
            nodes,
        }) = domain
        {
            match domains.iter_mut().find(|(n, _, _)| *n == name) {
                Some((_, merged, domain)) if merge => {
                    // Built again with this file's nodes, so that a key this file repeats
                    // is this file's error.
                    merged.extend(nodes);
                    *domain = file::build(file, at, &name, merged.clone())?;
                }
                Some(_) => {
                    return Err(ConfigError::new(
                        file,
                        Some(at),
                        format!("duplicate domain '{name}' in config file"),
                    ));
                }
                None => {
                    let domain = file::build(file, at, &name, nodes.clone())?;
                    domains.push((name, nodes, domain));
                }
            }
        }
    }
    let domains = domains.into_iter().map(|(_, _, domain)| domain).collect();
    // What the engine refuses is two rules of one name (a native rule's id that an Envoy
    // domain's limit also makes): placed at the native rule.
    let engine = Engine::new(routes, domains).map_err(|e| {
        let named = |id: &String| e.contains(&format!("`{id}`"));
        match places.rules.iter().find(|(id, _)| named(id)) {
            Some((_, place)) => place.error(e),
            None => places.file().error(e),
        }
    })?;
    // The environment's settings of the Envoy service where no file sets these sections.
    let mut server = match server {
        Some(server) => server,
        None => settings::server_from_env()?,
    };
    server.envoy = settings::from_env()?;
    if server.grpc_tls.is_none() {
        server.grpc_tls = settings::grpc_tls_from_env()?;
    }
    server.grpc_uds = settings::env("GRPC_UDS").map(PathBuf::from);
    server.prometheus = settings::prometheus_from_env()?;
    if server.tracing.is_none() {
        server.tracing = settings::tracing_from_env()?;
    }
    let store = match store {
        Some(store) => store,
        None => settings::store_from_env()?.unwrap_or_default(),
    };
    if let (StoreConfig::Redis { .. }, None) = (&store, &places.store) {
        places.store = Some(Place {
            file: PathBuf::from("environment"),
            at: None,
        });
    }
    Ok(Config {
        server,
        store,
        specs,
        engine,
        places,
    })
}

/// Parses one file: Envoy's format when it has a top-level `domain` or `descriptors`, else
/// native. A file with nothing in it is refused.
fn parse(file: &Path, text: &str) -> Result<Parsed, ConfigError> {
    let top = |key: &str| {
        text.lines().any(|l| {
            l.strip_prefix(key)
                .or_else(|| {
                    l.strip_prefix('"')
                        .and_then(|l| l.strip_prefix(key)?.strip_prefix('"'))
                })
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
    };
    let empty = text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---" || l == "..."
    });
    if empty {
        return Err(ConfigError::new(
            file,
            Some((1, 1)),
            "the file is empty: config file cannot have empty domain (an Envoy file needs \
             `domain` and `descriptors`, a native file `rules`)",
        ));
    }
    if top("domain") || top("descriptors") {
        Ok(Parsed::Envoy(file::parse(file, text)?))
    } else {
        Ok(Parsed::Native(Box::new(native::parse(file, text)?)))
    }
}
