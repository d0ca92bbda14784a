//! Typed ids. Generated ids (nodes, workflows, commands) are a kind prefix
//! and a ULID, so they sort by creation time; names chosen by operators
//! (tenants, pools, sites) are lowercase slugs that are safe as NATS subject
//! tokens.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} id {value:?}: {why}")]
pub struct IdError {
    pub kind: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// The digits of a lowercase ULID (Crockford base32: no i, l, o, u).
const ULID_DIGITS: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";

macro_rules! ulid_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(ulid::Ulid);

        impl $name {
            /// The prefix of the textual form.
            pub const PREFIX: &'static str = $prefix;

            /// A new id, ordered after the ones made before it.
            pub fn generate() -> Self {
                Self(ulid::Ulid::new())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", $prefix, self.0.to_string().to_lowercase())
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                let err = |why| IdError { kind: stringify!($name), value: s.chars().take(64).collect(), why };
                let rest = s.strip_prefix($prefix).ok_or_else(|| err(concat!("must start with ", $prefix)))?;
                // Exactly what the published pattern says: the lowercase
                // Crockford base32 this code writes, a first digit of 0-7.
                let well_formed = rest.len() == 26
                    && rest.bytes().all(|b| ULID_DIGITS.contains(&b))
                    && matches!(rest.as_bytes().first(), Some(b'0'..=b'7'));
                if !well_formed {
                    return Err(err("must be the prefix and a lowercase ULID (26 base32 characters, the first 0-7)"));
                }
                ulid::Ulid::from_string(&rest.to_uppercase())
                    .map(Self)
                    .map_err(|_| err("not a ULID"))
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> String {
                stringify!($name).to_owned()
            }
            fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
                schemars::schema::SchemaObject {
                    instance_type: Some(schemars::schema::InstanceType::String.into()),
                    string: Some(Box::new(schemars::schema::StringValidation {
                        pattern: Some(concat!("^", $prefix, "[0-7][0-9a-hjkmnp-tv-z]{25}$").to_owned()),
                        ..Default::default()
                    })),
                    ..Default::default()
                }
                .into()
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .pattern(Some(concat!("^", $prefix, "[0-7][0-9a-hjkmnp-tv-z]{25}$")))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

ulid_id!(
    /// A node's id, e.g. `node_01k…`.
    NodeId,
    "node_"
);
ulid_id!(
    /// A workflow's id.
    WorkflowId,
    "wf_"
);
ulid_id!(
    /// A command's id: the dedupe key of every executor.
    CommandId,
    "cmd_"
);

macro_rules! slug_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                check_slug(s).map(|()| Self(s.to_owned())).map_err(|why| IdError {
                    kind: stringify!($name),
                    value: s.chars().take(64).collect(),
                    why,
                })
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> String {
                stringify!($name).to_owned()
            }
            fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
                schemars::schema::SchemaObject {
                    instance_type: Some(schemars::schema::InstanceType::String.into()),
                    string: Some(Box::new(schemars::schema::StringValidation {
                        pattern: Some(SLUG_PATTERN.to_owned()),
                        max_length: Some(63),
                        ..Default::default()
                    })),
                    ..Default::default()
                }
                .into()
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .pattern(Some(SLUG_PATTERN))
                    .max_length(Some(63))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

/// The pattern every operator-chosen name matches.
pub const SLUG_PATTERN: &str = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$";

fn check_slug(s: &str) -> Result<(), &'static str> {
    let ok_len = (1..=63).contains(&s.len());
    let ok_chars = s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_ends = !s.starts_with('-') && !s.ends_with('-');
    if ok_len && ok_chars && ok_ends {
        Ok(())
    } else {
        Err("must be 1-63 lowercase letters, digits or '-', not starting or ending with '-'")
    }
}

slug_id!(
    /// A tenant's id, e.g. `root`.
    TenantId
);
slug_id!(
    /// A pool's id.
    PoolId
);
slug_id!(
    /// A site's id (one boot domain).
    SiteId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_round_trip_and_reject_garbage() {
        let id = NodeId::generate();
        let text = id.to_string();
        assert!(text.starts_with("node_") && text.len() == 31, "{text}");
        assert_eq!(text.parse::<NodeId>(), Ok(id));
        for bad in [
            "",
            "node_",
            "node_xyz",
            "wf_01jzzzzzzzzzzzzzzzzzzzzzzz",
            "node_01k!zzzzzzzzzzzzzzzzzzzz",
            // Uppercase, a first digit above 7, and a letter Crockford
            // leaves out: the published pattern refuses them too.
            "node_01KZZZZZZZZZZZZZZZZZZZZZZZ",
            "node_81kzzzzzzzzzzzzzzzzzzzzz",
            "node_01kzzzzzzzzzzzzzzzzzzzzi",
        ] {
            assert!(bad.parse::<NodeId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn slugs_are_subject_safe() {
        for good in ["root", "a", "tenant-b", "0"] {
            assert!(good.parse::<TenantId>().is_ok(), "{good}");
        }
        for bad in [
            "",
            "Root",
            "a.b",
            "a>",
            "a*",
            "-a",
            "a-",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(bad.parse::<TenantId>().is_err(), "{bad}");
        }
    }
}
