//! How the members of a fabric see one another's writes.

use std::fmt;
use std::str::FromStr;

/// Whether a fabric's caches are kept coherent by the hardware or by the software.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Coherence {
    /// Caches are coherent (one host, or CXL 3.0 back-invalidate): atomics on shared lines
    /// work as on one machine.
    #[default]
    Hardware,
    /// Caches are not coherent: every shared line has one writer, who flushes it before
    /// publishing; readers invalidate before reading.
    Software,
}

impl FromStr for Coherence {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hardware" => Ok(Coherence::Hardware),
            "software" => Ok(Coherence::Software),
            _ => Err(format!("unknown coherence {s:?}: use hardware or software")),
        }
    }
}

impl fmt::Display for Coherence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Coherence::Hardware => "hardware",
            Coherence::Software => "software",
        })
    }
}
