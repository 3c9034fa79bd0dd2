//! RFC 3339 UTC timestamps with millisecond precision (`2025-01-31T14:05:09.123Z`), the format of
//! every timestamp in the ledger, state and lock files. Use as `#[serde(with = "crate::protocol::time::rfc3339")]`.

/// Serde helpers for `DateTime<Utc>` fields (and [`rfc3339::option`] for optional ones).
pub mod rfc3339 {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `at` as `2025-01-31T14:05:09.123Z`.
    pub fn serialize<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    /// Reads any RFC 3339 timestamp, converted to UTC.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|at| at.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }

    /// The same for `Option<DateTime<Utc>>` (`null` when absent).
    pub mod option {
        use super::*;

        /// Writes `Some(at)` like [`super::serialize`], `None` as `null`.
        pub fn serialize<S: Serializer>(
            at: &Option<DateTime<Utc>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match at {
                Some(at) => super::serialize(at, s),
                None => s.serialize_none(),
            }
        }

        /// Reads `null` as `None`, else like [`super::deserialize`].
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|text| {
                    DateTime::parse_from_rfc3339(&text)
                        .map(|at| at.with_timezone(&Utc))
                        .map_err(serde::de::Error::custom)
                })
                .transpose()
        }
    }
}
