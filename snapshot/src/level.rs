//! The GPU/NPU probing level, one type for everything that names it: `gpu.level` of the
//! daemon's configuration, `ethand level` and the API's `set_level`, the node status and the
//! tree snapshots. Its JSON (and TOML) form is the lower-case name: "system", "calls",
//! "process", "op".
use serde::{Deserialize, Serialize};

/// How much ethand probes GPU/NPU runtime libraries; switchable live with `ethand level`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum GpuLevel {
    /// Device metrics only (NVML, DCMI): no uprobes.
    System,
    /// Per process: memory, copies, syncs and collectives (counts, bytes, sync and collective
    /// time), every probed call but kernel launches. A launch-bound training step makes
    /// hundreds of launches, and each probed one costs a uprobe trap (2-7 µs measured on H200
    /// VMs): 5-15 % of the step. The default.
    Calls,
    /// As `calls`, plus kernel launches (and graph launches) counted.
    Process,
    /// As `process`, plus host time of every probed call.
    Op,
}

/// A name that is not a level (`ethand level`, the API's `set_level`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownLevel(pub String);

impl std::fmt::Display for UnknownLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown level {:?}: expected system, calls, process or op",
            self.0
        )
    }
}

impl std::error::Error for UnknownLevel {}

impl GpuLevel {
    pub const ALL: [Self; 4] = [Self::System, Self::Calls, Self::Process, Self::Op];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Calls => "calls",
            Self::Process => "process",
            Self::Op => "op",
        }
    }

    /// Kernel launches are probed (and counted) at this level.
    pub fn counts_launches(self) -> bool {
        matches!(self, Self::Process | Self::Op)
    }
}

impl std::fmt::Display for GpuLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for GpuLevel {
    type Err = UnknownLevel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| UnknownLevel(s.to_string()))
    }
}

/// `#[serde(with = "level::named")]`: a level that names itself in the refusal of an unknown
/// one ("unknown level \"max\": ..."), where a request names it (the API's `set_level`).
pub mod named {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::GpuLevel;

    pub fn serialize<S: Serializer>(level: &GpuLevel, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(level.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<GpuLevel, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "level::or_empty")]`: the node status's level, "" before the first
/// collection round (a status written before any level was in force).
pub mod or_empty {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::GpuLevel;

    pub fn serialize<S: Serializer>(level: &Option<GpuLevel>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(level.map_or("", GpuLevel::as_str))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<GpuLevel>, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        if name.is_empty() {
            return Ok(None);
        }
        GpuLevel::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(&name)).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_json_and_the_display() {
        for l in GpuLevel::ALL {
            let json = serde_json::to_string(&l).unwrap();
            assert_eq!(json, format!("\"{l}\""));
            assert_eq!(serde_json::from_str::<GpuLevel>(&json).unwrap(), l);
            assert_eq!(l.as_str().parse::<GpuLevel>(), Ok(l));
        }
        assert_eq!(
            "max".parse::<GpuLevel>().unwrap_err().to_string(),
            "unknown level \"max\": expected system, calls, process or op"
        );
        assert!(serde_json::from_str::<GpuLevel>("\"Calls\"").is_err());
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Status {
        #[serde(with = "or_empty")]
        level: Option<GpuLevel>,
    }

    #[derive(Debug, Deserialize)]
    struct Request {
        #[serde(with = "named")]
        #[allow(dead_code)]
        level: GpuLevel,
    }

    #[test]
    fn the_status_level_is_empty_before_any_and_a_request_names_an_unknown_one() {
        for (level, json) in [
            (None, r#"{"level":""}"#),
            (Some(GpuLevel::Op), r#"{"level":"op"}"#),
        ] {
            assert_eq!(serde_json::to_string(&Status { level }).unwrap(), json);
            assert_eq!(
                serde_json::from_str::<Status>(json).unwrap(),
                Status { level }
            );
        }
        assert!(serde_json::from_str::<Status>(r#"{"level":"max"}"#).is_err());
        let e = serde_json::from_str::<Request>(r#"{"level":"max"}"#).unwrap_err();
        assert!(e.to_string().starts_with("unknown level \"max\""), "{e}");
        let e = serde_json::from_str::<Request>(r#"{"level":5}"#).unwrap_err();
        assert!(e.to_string().starts_with("invalid type"), "{e}");
    }
}
