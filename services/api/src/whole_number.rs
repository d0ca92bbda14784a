//! Integers in request bodies as JSON Schema reads them: `7442.0` is the
//! integer 7442 (a JSON number is an integer when its value is whole,
//! whatever its spelling), so a client whose JSON library writes whole
//! numbers with a fraction part is not refused. A fraction (`1.5`), a
//! negative number or one out of the field's range is still refused.

use serde::{Deserialize, Deserializer};

fn whole<E: serde::de::Error>(n: &serde_json::Number) -> Result<u64, E> {
    if let Some(v) = n.as_u64() {
        return Ok(v);
    }
    match n.as_f64() {
        // 2^64 is exactly representable; anything below it that is whole
        // converts without loss.
        Some(f) if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) => {
            Ok(f as u64)
        }
        _ => Err(E::custom(format!(
            "invalid value: {n}, expected a whole number of 0 or more"
        ))),
    }
}

fn narrow<T: TryFrom<u64>, E: serde::de::Error>(v: u64) -> Result<T, E> {
    T::try_from(v).map_err(|_| E::custom(format!("invalid value: {v} is out of range")))
}

/// `deserialize_with` for a required unsigned integer field.
pub fn required<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let n = serde_json::Number::deserialize(d)?;
    narrow(whole(&n)?)
}

/// `deserialize_with` for an optional unsigned integer field (with
/// `#[serde(default)]`); `null` is absent.
pub fn optional<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    match Option::<serde_json::Number>::deserialize(d)? {
        None => Ok(None),
        Some(n) => Ok(Some(narrow(whole(&n)?)?)),
    }
}

/// Rewrites every whole number in `v` spelt with a fraction part
/// (`16.0`) as the integer it is, so a type from another crate reads it
/// as JSON Schema does; a fraction (`1.5`) is left for that type to refuse.
pub fn canonical(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Number(n) if n.as_u64().is_none() && n.as_i64().is_none() => {
            if let Ok(w) = whole::<serde_json::Error>(n) {
                *n = w.into();
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(canonical),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(canonical),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct Req {
        #[serde(deserialize_with = "super::required")]
        version: u32,
        #[serde(default, deserialize_with = "super::optional")]
        ttl: Option<u64>,
    }

    fn parse(json: &str) -> Result<Req, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn whole_numbers_in_any_spelling_are_integers() {
        let r = parse(r#"{"version": 21779.0, "ttl": 1e3}"#).expect("whole");
        assert_eq!((r.version, r.ttl), (21779, Some(1000)));
        let r = parse(r#"{"version": 7}"#).expect("plain");
        assert_eq!((r.version, r.ttl), (7, None));
        assert_eq!(
            parse(r#"{"version": 7, "ttl": null}"#).expect("null").ttl,
            None
        );
    }

    #[test]
    fn canonical_rewrites_whole_floats_only() {
        let mut v = serde_json::json!({"a": 16.0, "b": [2.0, 1.5, -3.0], "c": {"d": 7}});
        super::canonical(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": 16, "b": [2, 1.5, -3.0], "c": {"d": 7}})
        );
        assert!(v["a"].is_u64() && v["b"][0].is_u64() && v["b"][1].is_f64());
    }

    #[test]
    fn fractions_negatives_and_out_of_range_are_refused() {
        for bad in [
            r#"{"version": 1.5}"#,
            r#"{"version": -1}"#,
            r#"{"version": 1, "ttl": -3}"#,
            r#"{"version": 4294967296}"#,
            r#"{"version": 1e300}"#,
            r#"{"version": "7"}"#,
            r#"{"version": null}"#,
            r#"{"version": 1, "ttl": 1.25}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
