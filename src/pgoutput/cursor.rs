//! A checked reader over one pgoutput message.
//!
//! Every read checks the remaining length first and reports what it was
//! reading, so a short or corrupt message becomes a [`DecodeError`] naming the
//! field instead of a panic. Byte strings are handed out as [`Bytes`] slices of
//! the input, so tuple values are never copied.

use bytes::Bytes;

use super::DecodeError;
use crate::lsn::Lsn;

/// Reads big-endian protocol fields front to back from a shared buffer.
pub(crate) struct Cursor {
    /// The unread rest of the message; reads split off its front.
    buf: Bytes,
}

impl Cursor {
    /// Starts at the beginning of `buf` (a cheap reference-counted clone).
    pub(crate) fn new(buf: &Bytes) -> Self {
        Cursor { buf: buf.clone() }
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Fails with `TrailingBytes` unless the message was consumed exactly.
    pub(crate) fn finish(&self, tag: u8) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            remaining => Err(DecodeError::TrailingBytes {
                tag: char::from(tag),
                remaining,
            }),
        }
    }

    /// The next `n` bytes as a zero-copy slice of the input.
    pub(crate) fn bytes(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        let available = self.buf.len();
        if n > available {
            return Err(DecodeError::Truncated {
                what,
                needed: n,
                available,
            });
        }
        // Cannot panic: `n <= len` was checked above.
        Ok(self.buf.split_to(n))
    }

    /// The next `N` bytes, for fixed-width integers.
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let available = self.buf.len();
        let taken = self.bytes(N, what)?;
        <[u8; N]>::try_from(taken.as_ref()).map_err(|_| DecodeError::Truncated {
            what,
            needed: N,
            available,
        })
    }

    /// An Int8 / Byte1.
    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        self.array::<1>(what).map(u8::from_be_bytes)
    }

    /// A signed Int16.
    pub(crate) fn i16(&mut self, what: &'static str) -> Result<i16, DecodeError> {
        self.array(what).map(i16::from_be_bytes)
    }

    /// A signed Int32.
    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        self.array(what).map(i32::from_be_bytes)
    }

    /// An Int32 that is unsigned by meaning (OIDs, xids).
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.array(what).map(u32::from_be_bytes)
    }

    /// A signed Int64 (timestamps).
    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        self.array(what).map(i64::from_be_bytes)
    }

    /// An `XLogRecPtr`, sent as a 64-bit integer.
    pub(crate) fn lsn(&mut self, what: &'static str) -> Result<Lsn, DecodeError> {
        self.array(what).map(|raw| Lsn(u64::from_be_bytes(raw)))
    }

    /// An Int16 count; negative is an error, never a wrapped cast.
    pub(crate) fn count_i16(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let value = self.i16(what)?;
        usize::try_from(value).map_err(|_| DecodeError::NegativeLength {
            what,
            value: i32::from(value),
        })
    }

    /// An Int32 length or count; negative is an error, never a wrapped cast.
    pub(crate) fn len_i32(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let value = self.i32(what)?;
        usize::try_from(value).map_err(|_| DecodeError::NegativeLength { what, value })
    }

    /// A NUL-terminated UTF-8 string; the NUL is consumed, not returned.
    pub(crate) fn cstr(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let end = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::MissingNul { what })?;
        let raw = self.bytes(end, what)?;
        self.u8(what)?; // the NUL found above
        std::str::from_utf8(&raw)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8 { what })
    }
}
