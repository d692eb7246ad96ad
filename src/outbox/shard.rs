//! PURE: which of K relays owns an event, so K slots split one outbox and each key stays whole.
//!
//! An event belongs to shard `(hashtextextended(k, 0) & i64::MAX) % K`, where `k` is the text of
//! its key, else of its id, else the empty string. Postgres evaluates that expression as each
//! shard's publication row filter ([`Shard::row_filter`]), so a walsender sends a shard only its
//! rows; [`Shard::owns`] computes the same in the relay for what Postgres cannot filter (logical
//! decoding messages, `backfill`'s rows). `hashtextextended` is PostgreSQL's hash of text (Bob
//! Jenkins' lookup3, `hash_bytes_extended`), the one hash partitioning stores tuples by, which is
//! why it does not change between major versions: a key never moves between shards on an
//! upgrade. It reads 4-byte words in the server's byte order; the relay checks at start-up that
//! the server agrees with [`hash_text`] (every little-endian server does).

use std::fmt;
use std::str::FromStr;

use super::Mapped;

/// Most shards: each is a slot and a walsender decoding all of the WAL.
pub const MAX_SHARDS: u32 = 256;

/// The `hashtextextended` seed of the row filter.
const SEED: u64 = 0;

/// Relay `index` of `count` (`--shard I/K`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shard {
    /// This relay's share, `0..count`.
    pub index: u32,
    /// How many relays split the outbox, at least 2.
    pub count: u32,
}

impl FromStr for Shard {
    type Err = String;

    /// `I/K` with `0 <= I < K`, `2 <= K <= 256`.
    fn from_str(raw: &str) -> Result<Self, String> {
        let expected = "expected I/K, the shard index I (from 0) of K shards, e.g. 0/4";
        let (index, count) = raw.trim().split_once('/').ok_or(expected)?;
        let number = |n: &str| n.trim().parse::<u32>().map_err(|_| expected.to_owned());
        let (index, count) = (number(index)?, number(count)?);
        if !(2..=MAX_SHARDS).contains(&count) {
            return Err(format!(
                "K must be 2 to {MAX_SHARDS} (one relay needs no --shard)"
            ));
        }
        if index >= count {
            return Err(format!(
                "the index must be below K: shards are 0 to {}",
                count - 1
            ));
        }
        Ok(Shard { index, count })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// The shard's slot or publication name: `base` with `_shard_I_of_K`, so K relays (and, while
    /// resharding, the K' next ones) have their own names on one database.
    pub fn name(&self, base: &str) -> String {
        format!("{base}_shard_{}_of_{}", self.index, self.count)
    }

    /// The shard a slot or publication name stands for, by [`Shard::name`]'s convention:
    /// `Some(None)` for `base` itself (one relay, no shards), `Some(Some(shard))` for
    /// `base_shard_I_of_K`, `None` for another name.
    pub fn of_name(base: &str, name: &str) -> Option<Option<Shard>> {
        let suffix = name.strip_prefix(base)?;
        if suffix.is_empty() {
            return Some(None);
        }
        let (index, count) = suffix.strip_prefix("_shard_")?.split_once("_of_")?;
        // Digits only: `from_str` would take spaces and signs, which a name never has.
        let digits = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
        if !(digits(index) && digits(count)) {
            return None;
        }
        let shard: Shard = format!("{index}/{count}").parse().ok()?;
        // The name it would be given: no leading zeros.
        (shard.name(base) == name).then_some(Some(shard))
    }

    /// The shard an event belongs to, from its key's text (else its id's; `None` or empty
    /// for NULL), as the row filter computes it.
    pub fn of(key: Option<&[u8]>, id: Option<&[u8]>, count: u32) -> u32 {
        let text = key.or(id).unwrap_or_default();
        let positive = hash_text(text) & i64::MAX;
        // `count` is at most MAX_SHARDS, so the remainder fits.
        u32::try_from(positive % i64::from(count.max(1))).unwrap_or(0)
    }

    /// Whether this shard relays the event with this key and id.
    pub fn owns(&self, key: Option<&[u8]>, id: Option<&[u8]>) -> bool {
        Shard::of(key, id, self.count) == self.index
    }

    /// Whether this shard relays a mapped event (one that does not map, by what could be read
    /// of its key and id, so exactly one shard stops on it or dead-letters it).
    pub fn owns_event(&self, mapped: &Mapped) -> bool {
        let (key, id) = match mapped {
            Ok(Some(record)) => (&record.key, &record.id),
            // Dropped by a transform: only rows are, which the publication shards already.
            Ok(None) => return true,
            Err((_, parts)) => (&parts.key, &parts.id),
        };
        self.owns(key.as_deref(), Some(id))
    }

    /// The publication row filter selecting this shard's rows, given SQL expressions for the
    /// text of the key and id columns (as pgoutput sends them; see `source::sql`).
    pub fn row_filter(&self, key_text: &str, id_text: &str) -> String {
        format!(
            "(hashtextextended(COALESCE({key_text}, {id_text}, ''), {SEED}) & {}) % {} = {}",
            i64::MAX,
            self.count,
            self.index
        )
    }
}

/// Whether a row filter as Postgres prints it (`pg_get_expr`) is `expected` as
/// [`Shard::row_filter`] wrote it: equal but for the parentheses, quotes, spacing and
/// `::bigint`/`::text` casts that Postgres adds.
pub fn same_filter(found: &str, expected: &str) -> bool {
    canonical(found) == canonical(expected)
}

/// A row filter without what Postgres adds when it prints one.
fn canonical(expr: &str) -> String {
    let expr = expr.replace("::bigint", "").replace("::text", "");
    expr.chars()
        .filter(|c| !c.is_whitespace() && !matches!(c, '(' | ')' | '"' | '\''))
        .collect()
}

/// What a shard's row filter ([`Shard::row_filter`]) says, read back from its text as
/// Postgres prints it: which shard it selects, and what it hashes how. Two fleets' filters
/// that differ in `hashed` split the rows differently, whatever their K.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterParts {
    /// The hash function, its arguments (the key and id columns' text) and its seed, without
    /// what Postgres adds when it prints them.
    pub hashed: String,
    /// The shard it selects.
    pub shard: Shard,
}

impl FilterParts {
    /// The parts of a shard's row filter; `None` for a filter of another shape.
    pub fn parse(filter: &str) -> Option<FilterParts> {
        let text = canonical(filter);
        let (left, index) = text.rsplit_once('=')?;
        let (hashed, count) = left.rsplit_once('%')?;
        let mask = format!("&{}", i64::MAX);
        let hashed = hashed.strip_suffix(&mask)?;
        if !hashed.starts_with("hashtextextendedCOALESCE") {
            return None;
        }
        let shard: Shard = format!("{index}/{count}").parse().ok()?;
        Some(FilterParts {
            hashed: hashed.to_owned(),
            shard,
        })
    }
}

/// PostgreSQL's `hashtextextended(text, 0)` of a deterministic collation on a little-endian
/// server: `hash_bytes_extended` (src/common/hashfn.c) of the text's bytes.
pub fn hash_text(bytes: &[u8]) -> i64 {
    hash_bytes_extended(bytes, SEED) as i64
}

/// lookup3's `mix`: six rounds of `x -= z; x ^= rot(z, r); z += y`, the roles rotating.
fn mix(s: &mut [u32; 3]) {
    for (round, r) in [4, 6, 8, 16, 19, 4].into_iter().enumerate() {
        let (x, y, z) = [(0, 1, 2), (1, 2, 0), (2, 0, 1)][round % 3];
        s[x] = s[x].wrapping_sub(s[z]) ^ s[z].rotate_left(r);
        s[z] = s[z].wrapping_add(s[y]);
    }
}

/// lookup3's `final`: seven rounds of `x ^= y; x -= rot(y, r)`, the roles rotating.
fn finish(s: &mut [u32; 3]) {
    for (round, r) in [14, 11, 25, 16, 4, 14, 24].into_iter().enumerate() {
        let (x, y) = [(2, 1), (0, 2), (1, 0)][round % 3];
        s[x] = (s[x] ^ s[y]).wrapping_sub(s[y].rotate_left(r));
    }
}

/// lookup3 as PostgreSQL has it: 12-byte blocks as three little-endian words, the tail's
/// bytes added into `a`, `b` and the upper three bytes of `c`, the result `b << 32 | c`.
fn hash_bytes_extended(key: &[u8], seed: u64) -> u64 {
    // Postgres takes the length as a 32-bit int; a key is far shorter.
    let init = 0x9e37_79b9_u32
        .wrapping_add(key.len() as u32)
        .wrapping_add(3_923_095);
    let mut s = [init; 3];
    if seed != 0 {
        s[0] = s[0].wrapping_add((seed >> 32) as u32);
        s[1] = s[1].wrapping_add(seed as u32);
        mix(&mut s);
    }
    let word = |bytes: &[u8]| {
        (bytes.iter().enumerate()).fold(0u32, |w, (i, &byte)| w | u32::from(byte) << (8 * i))
    };
    let mut blocks = key.chunks_exact(12);
    for block in &mut blocks {
        for (v, bytes) in s.iter_mut().zip(block.chunks(4)) {
            *v = v.wrapping_add(word(bytes));
        }
        mix(&mut s);
    }
    // The tail's words; the lowest byte of `c` is left for the length.
    for (i, bytes) in blocks.remainder().chunks(4).enumerate() {
        s[i] = s[i].wrapping_add(word(bytes) << if i == 2 { 8 } else { 0 });
    }
    finish(&mut s);
    (u64::from(s[1]) << 32) | u64::from(s[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_text_as_postgres_does() {
        // SELECT s, hashtextextended(s, 0), hashtextextended(s, 42) on PostgreSQL 15 (x86-64).
        for (text, seed0, seed42) in [
            ("", -6939563903564495251, 6158832220375811857),
            ("a", 3591986179850072241, 6942402718208252407),
            ("ab", 2833316173711343549, 1055583026507242713),
            ("abc", -6747756470228489321, 4423357919252764502),
            ("abcd", -1038429303365892052, 8078444844130423812),
            ("abcde", 3076356108696143428, 3866110239706809221),
            ("order-0001", 2560410280428643330, 2465053344581294387),
            ("12345678901", 4122666949334920506, 2723721802463669414),
            ("123456789012", -3387667963766823555, 2683011517470214667),
            ("1234567890123", 2373490033053362784, -8672436648456901618),
            ("Grüße, 世界 🚀", 4117201878950564838, 6584728263242398311),
            (
                "10000000-0000-4000-8000-000000000001",
                -7732474638673440045,
                -6232578455239793174,
            ),
        ] {
            assert_eq!(hash_text(text.as_bytes()), seed0, "{text:?}");
            let extended = hash_bytes_extended(text.as_bytes(), 42) as i64;
            assert_eq!(extended, seed42, "{text:?} with seed 42");
        }
    }

    #[test]
    fn the_key_decides_else_the_id_else_the_empty_string() {
        let owner = |key: Option<&str>, id: Option<&str>| {
            Shard::of(key.map(str::as_bytes), id.map(str::as_bytes), 4)
        };
        assert_eq!(
            owner(Some("order-0001"), Some("x")),
            owner(Some("order-0001"), None)
        );
        assert_eq!(owner(None, Some("abc")), owner(Some("abc"), Some("zzz")));
        assert_eq!(owner(None, None), owner(Some(""), Some("abc")));
        // i64::MIN & i64::MAX is 0: no negative remainder, no abs() overflow.
        let abc = (-6747756470228489321i64 & i64::MAX) % 4;
        assert_eq!(i64::from(owner(Some("abc"), None)), abc);
        let shard = Shard { index: 1, count: 4 };
        let owned = (0..4000).filter(|n| shard.owns(Some(format!("k{n}").as_bytes()), None));
        let share = owned.count();
        assert!(
            (800..1200).contains(&share),
            "shard 1 of 4 owns {share} of 4000 keys"
        );
    }

    #[test]
    fn parses_i_of_k_and_names_the_shards_objects() {
        let shard: Shard = "1/4".parse().unwrap();
        assert_eq!(shard, Shard { index: 1, count: 4 });
        assert_eq!(shard.to_string(), "1/4");
        assert_eq!(shard.name("outbox_relay"), "outbox_relay_shard_1_of_4");
        for bad in ["4/4", "0/1", "1", "a/4", "-1/4", "0/257", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        assert!("255/256".parse::<Shard>().is_ok());
    }

    #[test]
    fn names_say_which_shard_of_which_fleet() {
        let base = "outbox_relay";
        let shard = |index, count| Some(Some(Shard { index, count }));
        // (name, the shard it stands for)
        let table = [
            ("outbox_relay", Some(None)),
            ("outbox_relay_shard_0_of_2", shard(0, 2)),
            ("outbox_relay_shard_3_of_4", shard(3, 4)),
            ("outbox_relay_shard_255_of_256", shard(255, 256)),
            // Another name, or not one the relay gives.
            ("outbox_relay_demo", None),
            ("outbox_relay2_shard_0_of_2", None),
            ("other_shard_0_of_2", None),
            ("outbox_relay_shard_2_of_2", None),
            ("outbox_relay_shard_0_of_1", None),
            ("outbox_relay_shard_01_of_2", None),
            ("outbox_relay_shard_+1_of_2", None),
            ("outbox_relay_shard_0_of_2_x", None),
            ("outbox_relay_shard__of_2", None),
            ("outbox_relay_shard_0_of_2_shard_1_of_2", None),
        ];
        for (name, expected) in table {
            assert_eq!(Shard::of_name(base, name), expected, "{name}");
        }
    }

    #[test]
    fn a_filter_says_its_shard_and_what_it_hashes() {
        let printed = |key: &str, count: u32, index: u32| {
            format!(
                "(((hashtextextended(COALESCE({key}, textin(uuid_out(id)), ''::text), \
                 (0)::bigint) & '9223372036854775807'::bigint) % ({count})::bigint) = {index})"
            )
        };
        let ours = FilterParts::parse(&printed("aggregate_id", 2, 1)).unwrap();
        assert_eq!(ours.shard, Shard { index: 1, count: 2 });
        // As the relay writes it, the same.
        let written =
            Shard { index: 0, count: 4 }.row_filter("\"aggregate_id\"", "textin(uuid_out(\"id\"))");
        let parsed = FilterParts::parse(&written).unwrap();
        assert_eq!(parsed.hashed, ours.hashed);
        assert_eq!(parsed.shard, Shard { index: 0, count: 4 });
        // Another key column hashes otherwise.
        let other = FilterParts::parse(&printed("customer_id", 2, 0)).unwrap();
        assert_ne!(other.hashed, ours.hashed);
        // Other seeds and other shapes.
        let seeded = printed("aggregate_id", 2, 1).replace("(0)::bigint", "(7)::bigint");
        assert_ne!(FilterParts::parse(&seeded).unwrap().hashed, ours.hashed);
        for other in [
            "(event_type = 'x'::text)",
            "(hashtext(aggregate_id) % 2) = 1",
            "",
        ] {
            assert_eq!(FilterParts::parse(other), None, "{other}");
        }
        assert_eq!(FilterParts::parse(&printed("k", 2, 2)), None);
    }

    #[test]
    fn row_filters_compare_as_postgres_prints_them() {
        let shard = Shard { index: 1, count: 4 };
        let filter = shard.row_filter("\"aggregate_id\"", "textin(uuid_out(\"id\"))");
        assert_eq!(
            filter,
            "(hashtextextended(COALESCE(\"aggregate_id\", textin(uuid_out(\"id\")), ''), 0) \
             & 9223372036854775807) % 4 = 1"
        );
        let printed = "(((hashtextextended(COALESCE(aggregate_id, textin(uuid_out(id)), \
                       ''::text), (0)::bigint) & '9223372036854775807'::bigint) % (4)::bigint) = 1)";
        assert!(same_filter(printed, &filter));
        assert!(!same_filter(&printed.replace("= 1", "= 2"), &filter));
        assert!(!same_filter(&printed.replace("% (4)", "% (2)"), &filter));
        let other_key = shard.row_filter("\"customer\"", "textin(uuid_out(\"id\"))");
        assert!(!same_filter(printed, &other_key));
    }
}
