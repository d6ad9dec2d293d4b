//! The rules a service runs: reloaded from the files (a new set swapped in whole, an invalid
//! one refused), edited through the admin API, and shared with the other instances on one
//! Redis.

use super::*;

impl Service {
    /// Swaps in the rules of `config`, the files read again, when it loaded and is valid;
    /// otherwise keeps the rules running and returns why. Counters of rules that kept their
    /// name and state layout carry over. A changed `server` or `store` section needs a
    /// restart (logged).
    ///
    /// # Errors
    /// The files' first error, or what [`check`] refuses.
    pub fn reload(&self, config: Result<Config, ConfigError>) -> Result<(), ConfigError> {
        let result = config.and_then(|config| {
            check(&config)?;
            let old = self.current.load();
            if config.store != old.config.store || config.server != old.config.server {
                tracing::warn!("the server and store sections take effect at the next restart");
            }
            let overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
            let overrides = self.overrides();
            let stated = self.caller_limits();
            compose(config, &overlay, &overrides, &stated, &self.store).map_err(|message| {
                ConfigError {
                    file: self.files.first().cloned().unwrap_or_default(),
                    at: None,
                    message,
                }
            })
        });
        let now = crate::console::now_micros() / 1_000_000;
        match result {
            Ok(loaded) => {
                let rules = loaded.engine.rules().count();
                self.current.store(Arc::new(loaded));
                metrics::reload(true);
                let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
                status.version += 1;
                status.loaded_at = now;
                status.last_error = None;
                tracing::info!(rules, "rules reloaded");
                Ok(())
            }
            Err(err) => {
                metrics::reload(false);
                let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
                status.last_error = Some((now, err.to_string()));
                tracing::error!(error = %err, "rule files rejected; the previous rules keep serving");
                Err(err)
            }
        }
    }

    /// Creates or replaces (`Some`) or deletes (`None`) the native rule `id` (the admin
    /// API), keeping it across reloads of the files, and, on a Redis store, for every instance.
    /// Returns whether the rule existed.
    ///
    /// # Errors
    /// [`EditError::Invalid`] when the rules that would result are invalid,
    /// [`EditError::Unavailable`] when the shared rules cannot be written; nothing changes.
    pub async fn edit(&self, id: &str, spec: Option<RuleSpec>) -> Result<bool, EditError> {
        let _one_at_a_time = self.edits.lock().await;
        let mut candidate = self
            .overlay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let old = self.current.load_full();
        let existed = old.specs.iter().any(|s| s.id == id);
        candidate.insert(id.to_string(), spec.clone());
        let loaded = compose(
            old.config.clone(),
            &candidate,
            &self.overrides(),
            &self.caller_limits(),
            &self.store,
        )
        .map_err(EditError::Invalid)?;
        if let Some(shared) = &self.shared {
            let version = shared
                .write(id, spec.as_ref())
                .await
                .map_err(|e| EditError::Unavailable(e.to_string()))?;
            self.shared_version.store(version, Ordering::Relaxed);
        }
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        overlay.insert(id.to_string(), spec);
        self.current.store(Arc::new(loaded));
        Ok(existed)
    }

    /// Whether `spec` would be taken by [`edit`](Self::edit), changing nothing: the rules
    /// that would result, checked on this store.
    ///
    /// # Errors
    /// Why the rules that would result are invalid.
    pub fn try_rule(&self, spec: &RuleSpec) -> Result<(), String> {
        let mut candidate = self
            .overlay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        candidate.insert(spec.id.clone(), Some(spec.clone()));
        let old = self.current.load_full();
        compose(
            old.config.clone(),
            &candidate,
            &self.overrides(),
            &self.caller_limits(),
            &self.store,
        )
        .map(drop)
    }

    /// The ids of the rules the admin API created or replaced (and not deleted).
    pub fn admin_ids(&self) -> std::collections::HashSet<String> {
        let overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        overlay
            .iter()
            .filter(|(_, spec)| spec.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Applies the shared admin rules when another instance changed them; called every
    /// [`POLL`](crate::shared::POLL) by [`Service::follow_shared`].
    async fn refresh_shared(&self, shared: &SharedRules) {
        let version = match shared.version().await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the shared rules' version");
                return;
            }
        };
        if version == self.shared_version.load(Ordering::Relaxed) {
            return;
        }
        let _one_at_a_time = self.edits.lock().await;
        let Shared {
            version,
            overlay,
            overrides,
        } = match shared.read().await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the shared admin rules");
                return;
            }
        };
        let mut mine = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        let config = self.current.load().config.clone();
        match compose(
            config,
            &overlay,
            &overrides,
            &self.caller_limits(),
            &self.store,
        ) {
            Ok(loaded) => {
                *mine = overlay;
                *self.overrides.lock().unwrap_or_else(|e| e.into_inner()) = overrides;
                self.current.store(Arc::new(loaded));
                tracing::info!(version, "shared admin rules applied");
            }
            Err(e) => {
                metrics::reload(false);
                tracing::error!(error = %e, version, "shared admin rules rejected here; the previous rules keep serving");
            }
        }
        self.shared_version.store(version, Ordering::Relaxed);
    }

    /// Follows the admin rules other instances edit, until the service is dropped; returns at
    /// once when the store is not Redis.
    pub async fn follow_shared(self: Arc<Self>) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let weak = Arc::downgrade(&self);
        drop(self);
        loop {
            tokio::time::sleep(crate::shared::POLL).await;
            let Some(service) = weak.upgrade() else {
                return;
            };
            service.refresh_shared(&shared).await;
            service.refresh_lists(&shared).await;
        }
    }
}
