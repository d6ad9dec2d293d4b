//! Reloads the rules when their files change: the files' directories are watched, and a
//! symbolic link on the way to them (`RUNTIME_ROOT` pointing at a deployment's directory) too,
//! so that a swapped link reloads from its new target. SIGHUP reloads as well (`serve`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};

use crate::service::Service;

/// What a watched event touched: a rule file (or a file of a rule directory), or a symbolic
/// link on the way to one (a deployment that swaps `current` to a new directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    File,
    Link,
}

/// Watches the rule files' directories and reloads, a moment after the last change, when one
/// of the files changed (editors and config maps replace files rather than write them). A
/// symbolic link on the way to them (`RUNTIME_ROOT` pointing at a deployment's directory) is
/// watched too: when it is swapped, the rules reload from its new target, which is watched
/// from then on. Lives for as long as the process.
pub fn watch(files: &[PathBuf], service: Arc<Service>) {
    let files = files.to_vec();
    // The first watcher is in place before this returns (before the service says it listens),
    // so that no change after start is missed.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Change>();
    let initial = watcher(&files, tx).map(|w| (w, rx));
    tokio::spawn(async move {
        let mut relinked = false;
        let mut next = initial;
        loop {
            let Some((watching, mut rx)) = next.take() else {
                return;
            };
            if relinked {
                // A file written between the reload and this watcher is read now.
                tracing::info!("watching the new rule directory: reloading");
                let _ = super::reload(&service);
            }
            // A path not there yet (a runtime directory a deployment has not written, under
            // FORCE_START_WITHOUT_INITIAL_CONFIG) cannot be watched: it is looked for every
            // second, and watched once it appears.
            let missing = files.iter().any(|f| !f.exists());
            let mut looking = tokio::time::interval(Duration::from_secs(1));
            loop {
                let first = tokio::select! {
                    change = rx.recv() => match change {
                        Some(change) => change,
                        None => return,
                    },
                    _ = looking.tick(), if missing => {
                        if files.iter().any(|f| !f.exists()) {
                            continue;
                        }
                        Change::Link
                    }
                };
                // Let a burst of events (write, rename, chmod) settle into one reload.
                tokio::time::sleep(Duration::from_millis(200)).await;
                relinked = first == Change::Link;
                while let Ok(change) = rx.try_recv() {
                    relinked |= change == Change::Link;
                }
                tracing::info!("a rule file changed: reloading");
                let _ = super::reload(&service);
                if relinked {
                    break;
                }
            }
            // Watched again, where the paths lead now.
            drop(watching);
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Change>();
            next = watcher(&files, tx).map(|w| (w, rx));
        }
    });
}

/// A watcher of `files` as they resolve now, telling `tx` of each change.
fn watcher(
    files: &[PathBuf],
    tx: tokio::sync::mpsc::UnboundedSender<Change>,
) -> Option<notify::RecommendedWatcher> {
    let targets: Vec<PathBuf> = files
        .iter()
        .map(|f| std::fs::canonicalize(f).unwrap_or_else(|_| f.clone()))
        .collect();
    let names: Vec<_> = targets
        .iter()
        .filter(|t| !t.is_dir())
        .filter_map(|t| t.file_name().map(|n| n.to_owned()))
        .collect();
    // A directory's every file is a rule file, those added later included.
    let whole: Vec<PathBuf> = targets.iter().filter(|t| t.is_dir()).cloned().collect();
    // The symbolic links on the way to the files, as written.
    let links: Vec<PathBuf> = files
        .iter()
        .flat_map(|f| f.ancestors())
        .filter(|a| a.is_symlink())
        .map(Path::to_path_buf)
        .collect();
    let watched_links = links.clone();
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if event.kind.is_access() {
            return;
        }
        let link = event
            .paths
            .iter()
            .any(|p| watched_links.iter().any(|l| l == p));
        let file = event.paths.iter().any(|p| {
            p.file_name().is_some_and(|n| names.iter().any(|m| m == n))
                || whole.iter().any(|d| p.starts_with(d))
        });
        if link {
            let _ = tx.send(Change::Link);
        } else if file {
            let _ = tx.send(Change::File);
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the rule files; reload with SIGHUP");
            return None;
        }
    };
    let mut dirs: Vec<(PathBuf, RecursiveMode)> = targets
        .iter()
        .filter_map(|t| match t.is_dir() {
            true => Some((t.clone(), RecursiveMode::Recursive)),
            false => t
                .parent()
                .map(|p| (PathBuf::from(p), RecursiveMode::NonRecursive)),
        })
        .chain(links.iter().filter_map(|l| {
            l.parent()
                .map(|p| (p.to_path_buf(), RecursiveMode::NonRecursive))
        }))
        .collect();
    dirs.sort_by(|a, b| a.0.cmp(&b.0));
    dirs.dedup_by(|a, b| a.0 == b.0);
    for (dir, mode) in &dirs {
        if let Err(e) = watcher.watch(dir, *mode) {
            tracing::warn!(error = %e, dir = %dir.display(), "cannot watch; reload with SIGHUP");
        }
    }
    Some(watcher)
}
