//! A checked reader over one pgoutput message: each read names its field, so a short or corrupt
//! message becomes a [`DecodeError`] saying what was being read, never a panic.

use bytes::{Buf, Bytes, TryGetError};

use super::DecodeError;
use crate::lsn::Lsn;

/// The unread rest of a message; fields are big-endian, byte strings zero-copy slices of it.
pub(crate) struct Cursor {
    buf: Bytes,
}

/// Maps `bytes`' short-read error to [`DecodeError::Truncated`] naming the field.
fn truncated(what: &'static str) -> impl FnOnce(TryGetError) -> DecodeError {
    move |e| DecodeError::Truncated {
        what,
        needed: e.requested,
        available: e.available,
    }
}

impl Cursor {
    pub(crate) fn new(buf: &Bytes) -> Self {
        Cursor { buf: buf.clone() }
    }

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

    /// The next `n` bytes, as a slice of the input.
    pub(crate) fn bytes(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated {
                what,
                needed: n,
                available: self.remaining(),
            });
        }
        Ok(self.buf.split_to(n))
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        self.buf.try_get_u8().map_err(truncated(what))
    }

    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        self.buf.try_get_i32().map_err(truncated(what))
    }

    /// An Int32 that is unsigned by meaning (OIDs, xids).
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.buf.try_get_u32().map_err(truncated(what))
    }

    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        self.buf.try_get_i64().map_err(truncated(what))
    }

    pub(crate) fn lsn(&mut self, what: &'static str) -> Result<Lsn, DecodeError> {
        self.buf.try_get_u64().map(Lsn).map_err(truncated(what))
    }

    /// An Int16 count; negative is an error, never a wrapped cast.
    pub(crate) fn count_i16(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let value = self.buf.try_get_i16().map_err(truncated(what))?;
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
        // `end` indexes the NUL, so neither the split nor the slice can panic.
        let raw = self.buf.split_to(end + 1);
        std::str::from_utf8(&raw[..end])
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8 { what })
    }
}
