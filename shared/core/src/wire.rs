//! Closed sets of wire names: [`wire_enum!`] declares an enum whose every
//! variant has one wire spelling, and derives from that single list its
//! `ALL`, `as_str`, `parse`, `Display`, serde, JSON Schema and OpenAPI
//! schema, so no two of them can disagree (a derive of `utoipa` once read
//! the macro's renames wrong and published `On` for `on`). An unknown name
//! is an error everywhere, never a default.

/// A wire name this code does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}; expected one of {expected}")]
pub struct UnknownWireName {
    pub what: &'static str,
    pub value: String,
    pub expected: String,
}

/// Declares a closed wire enum; see the module documentation.
#[macro_export]
macro_rules! wire_enum {
    (
        $(#[doc = $doc:literal])*
        $vis:vis enum $name:ident $what:literal {
            $($(#[doc = $vdoc:literal])* $variant:ident = $wire:literal),+ $(,)?
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $($(#[doc = $vdoc])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$($wire),+].len()] = [$($name::$variant),+];

            /// The wire name.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $wire),+ }
            }

            /// Parses the wire name; an unknown one is `None`.
            pub fn parse(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s)
            }

            /// Parses the wire name; an unknown one is an error naming
            /// what was expected.
            pub fn parse_or_err(s: &str) -> Result<Self, $crate::wire::UnknownWireName> {
                Self::parse(s).ok_or_else(|| $crate::wire::UnknownWireName {
                    what: $what,
                    value: s.chars().take(64).collect(),
                    expected: [$($wire),+].join(", "),
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::wire::UnknownWireName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse_or_err(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = $crate::wire::UnknownWireName;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::parse_or_err(&s)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::parse_or_err(&s).map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> String {
                stringify!($name).to_owned()
            }
            fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
                let description = [$($doc),*].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
                schemars::schema::SchemaObject {
                    instance_type: Some(schemars::schema::InstanceType::String.into()),
                    enum_values: Some(vec![$($wire.into()),+]),
                    metadata: Some(Box::new(schemars::schema::Metadata {
                        description: (!description.is_empty()).then_some(description),
                        ..Default::default()
                    })),
                    ..Default::default()
                }
                .into()
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                let description = [$($doc),*].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
                utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some([$($wire),+]))
                    .description((!description.is_empty()).then_some(description))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

#[cfg(test)]
mod tests {
    crate::wire_enum! {
        /// A test enum.
        pub enum Color "color" {
            /// Red.
            Red = "red",
            DarkBlue = "dark-blue",
        }
    }

    #[test]
    fn one_list_of_names_serves_every_form() {
        assert_eq!(Color::ALL, [Color::Red, Color::DarkBlue]);
        assert_eq!(Color::DarkBlue.as_str(), "dark-blue");
        assert_eq!(Color::DarkBlue.to_string(), "dark-blue");
        assert_eq!("red".parse::<Color>(), Ok(Color::Red));
        let e = "Red".parse::<Color>().expect_err("case matters");
        assert_eq!(
            e.to_string(),
            r#"unknown color "Red"; expected one of red, dark-blue"#
        );
        assert_eq!(
            serde_json::to_value(Color::DarkBlue).expect("json"),
            serde_json::json!("dark-blue")
        );
        assert!(serde_json::from_value::<Color>(serde_json::json!("DarkBlue")).is_err());
        let schema = serde_json::to_value(schemars::schema_for!(Color)).expect("schema");
        assert_eq!(schema["enum"], serde_json::json!(["red", "dark-blue"]));
        assert_eq!(schema["description"], "A test enum.");
        let openapi =
            serde_json::to_value(<Color as utoipa::PartialSchema>::schema()).expect("oas");
        assert_eq!(openapi["enum"], serde_json::json!(["red", "dark-blue"]));
        assert_eq!(openapi["type"], "string");
    }
}
