//! Log sequence numbers, printed and parsed the way Postgres does (`16/B374D848`).

use std::fmt;
use std::str::FromStr;

/// A position in the Postgres write-ahead log, ordered like the WAL itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// No position (Postgres' `InvalidXLogRecPtr`).
    pub const ZERO: Lsn = Lsn(0);

    /// The raw 64-bit value.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// An LSN string that is not `HI/LO` in hexadecimal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hexadecimal halves like 16/B374D848")]
pub struct ParseLsnError(String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.trim().split_once('/').ok_or_else(err)?;
        let half = |h: &str| u32::from_str_radix(h, 16).map(u64::from).map_err(|_| err());
        Ok(Lsn((half(hi)? << 32) | half(lo)?))
    }
}

impl From<pgwire_replication::Lsn> for Lsn {
    fn from(value: pgwire_replication::Lsn) -> Self {
        Lsn(value.as_u64())
    }
}

impl From<Lsn> for pgwire_replication::Lsn {
    fn from(value: Lsn) -> Self {
        pgwire_replication::Lsn::from_u64(value.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_postgres_text() {
        for text in ["0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "0/1"] {
            let lsn: Lsn = text.parse().unwrap();
            assert_eq!(lsn.to_string(), text);
        }
        assert_eq!("16/B374D848".parse::<Lsn>().unwrap(), Lsn(0x16_B374_D848));
    }

    #[test]
    fn rejects_malformed_text() {
        for text in ["", "16", "16/", "/1", "G/1", "1/2/3", "100000000/0"] {
            assert!(text.parse::<Lsn>().is_err(), "{text} should not parse");
        }
    }
}
