//! Durable key-value state over a JetStream KV bucket, for a process whose
//! state must outlive it without a database of its own (the simulated
//! site's machines). Values are JSON; a key is `[-_=./a-zA-Z0-9]+`
//! ([`key_token`] makes one from anything). A write returns once the
//! server stored it. A bucket keeps its values for good
//! ([`Bucket::open`]) or drops each a set time after its last write
//! ([`Bucket::open_expiring`]: records that outlive their use only by
//! that time, such as a command's run record, so the server's store does
//! not grow with every command ever run).

use async_nats::jetstream::kv;
use futures::StreamExt as _;
use serde::{de::DeserializeOwned, Serialize};

use crate::{Bus, BusError};

/// A JetStream KV bucket of JSON values.
#[derive(Clone)]
pub struct Bucket {
    store: kv::Store,
    name: String,
    js: async_nats::jetstream::Context,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("name", &self.name).finish()
    }
}

fn err(bucket: &str, e: impl std::fmt::Display) -> BusError {
    BusError::Stream {
        stream: format!("KV_{bucket}"),
        why: e.to_string(),
    }
}

/// Turns any text into a key token: `[a-zA-Z0-9_-]` kept, anything else
/// as `=xx` (hex), so two texts never share a key.
pub fn key_token(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' => out.push(b as char),
            other => out.push_str(&format!("={other:02x}")),
        }
    }
    out
}

impl Bucket {
    /// Opens the bucket `name` (one of [`crate::Subjects::kv_bucket`]),
    /// creating it (file storage, one value per key, kept for good) if it
    /// does not exist. An existing bucket is taken as it is. Waits through
    /// a NATS outage as [`crate::streams::ensure_all`] does.
    pub async fn open(bus: &Bus, name: &str) -> Result<Self, BusError> {
        crate::streams::through_outage(bus, &format!("KV_{name}"), || Self::open_once(bus, name))
            .await
    }

    async fn open_once(bus: &Bus, name: &str) -> Result<Self, BusError> {
        let name = name.to_owned();
        let js = bus.jetstream();
        let store = match js.get_key_value(&name).await {
            Ok(s) => s,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: name.clone(),
                    history: 1,
                    storage: async_nats::jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .map_err(|e| err(&name, e))?,
        };
        Ok(Self {
            store,
            name,
            js: js.clone(),
        })
    }

    /// Opens the bucket `name`, whose values each expire `max_age` after
    /// their last write: created so if missing. An existing bucket is
    /// taken as it is but for its `max_age`, changed to this one if it
    /// differs (one made before its values expired then expires them; its
    /// replicas, limits and placement stay as its operator set them).
    /// Waits through a NATS outage as [`crate::streams::ensure_all`] does.
    pub async fn open_expiring(
        bus: &Bus,
        name: &str,
        max_age: std::time::Duration,
    ) -> Result<Self, BusError> {
        crate::streams::through_outage(bus, &format!("KV_{name}"), || {
            Self::open_expiring_once(bus, name, max_age)
        })
        .await
    }

    async fn open_expiring_once(
        bus: &Bus,
        name: &str,
        max_age: std::time::Duration,
    ) -> Result<Self, BusError> {
        let name = name.to_owned();
        let js = bus.jetstream();
        let store = match js.get_key_value(&name).await {
            Ok(s) => s,
            Err(_) => match js
                .create_key_value(kv::Config {
                    bucket: name.clone(),
                    history: 1,
                    max_age,
                    storage: async_nats::jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
            {
                Ok(s) => s,
                // Made meanwhile by another process: take it as below.
                Err(e) => js.get_key_value(&name).await.map_err(|_| err(&name, e))?,
            },
        };
        let bucket = Self {
            store,
            name,
            js: js.clone(),
        };
        let stream = bucket.stream().await?;
        if stream.cached_info().config.max_age != max_age {
            let mut config = stream.cached_info().config.clone();
            config.max_age = max_age;
            js.update_stream(config)
                .await
                .map_err(|e| err(&bucket.name, e))?;
            tracing::info!(bucket = %bucket.name, ?max_age, "the bucket's values now expire");
        }
        Ok(bucket)
    }

    /// How long a value is kept after its last write (`None`: for good),
    /// as the server has it now.
    pub async fn max_age(&self) -> Result<Option<std::time::Duration>, BusError> {
        let age = self.stream().await?.cached_info().config.max_age;
        Ok((!age.is_zero()).then_some(age))
    }

    /// The bucket's stream, its configuration as the server has it now
    /// (`kv::Store::status` gives the one read when the store was opened).
    async fn stream(&self) -> Result<async_nats::jetstream::stream::Stream, BusError> {
        self.js
            .get_stream(format!("KV_{}", self.name))
            .await
            .map_err(|e| err(&self.name, e))
    }

    /// The value at `key`; `None` when absent. A value that does not
    /// decode is an error (never read as absent).
    pub async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, BusError> {
        match self.store.get(key).await.map_err(|e| err(&self.name, e))? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| err(&self.name, format!("{key}: {e}"))),
        }
    }

    /// Stores `value` at `key`.
    pub async fn put<T: Serialize>(&self, key: &str, value: &T) -> Result<(), BusError> {
        let bytes = serde_json::to_vec(value).map_err(|e| err(&self.name, e))?;
        self.store
            .put(key, bytes.into())
            .await
            .map_err(|e| err(&self.name, e))?;
        Ok(())
    }

    /// Stores `value` at `key` only if `key` holds nothing: false when it
    /// already did (someone was first).
    pub async fn create<T: Serialize>(&self, key: &str, value: &T) -> Result<bool, BusError> {
        let bytes = serde_json::to_vec(value).map_err(|e| err(&self.name, e))?;
        match self.store.create(key, bytes.into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(err(&self.name, e)),
        }
    }

    /// Every key starting with `prefix` and its value. A value that does
    /// not decode is skipped with a log line.
    pub async fn scan<T: DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, BusError> {
        let mut keys = self.store.keys().await.map_err(|e| err(&self.name, e))?;
        let mut wanted = vec![];
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| err(&self.name, e))?;
            if k.starts_with(prefix) {
                wanted.push(k);
            }
        }
        let mut out = Vec::with_capacity(wanted.len());
        for k in wanted {
            match self.get::<T>(&k).await {
                Ok(Some(v)) => out.push((k, v)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(bucket = %self.name, key = %k, error = %e, "skipping a value that does not decode")
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::key_token;

    #[test]
    fn key_tokens_are_valid_keys_and_never_collide() {
        assert_eq!(key_token("sim://a-1"), "sim=3a=2f=2fa-1");
        assert_eq!(key_token("52:54:00:aa"), "52=3a54=3a00=3aaa");
        assert_ne!(key_token("a=3a"), key_token("a:"));
    }
}
