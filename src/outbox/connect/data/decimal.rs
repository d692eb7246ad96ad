//! PURE: Java's `BigDecimal` as Connect's `Decimal` holds it: reading Postgres' text, the
//! unscaled integer's bytes, and Java's texts of it.

use num_bigint::{BigInt, Sign};

/// A `java.math.BigDecimal`: an unscaled integer and the number of digits after the point.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Decimal {
    /// The digits, as an integer.
    pub unscaled: BigInt,
    /// How many of them are after the point.
    pub scale: i32,
}

impl Decimal {
    /// Reads plain decimal notation (`-123.4500`, as Postgres prints a `numeric`), keeping
    /// trailing zeros in the scale as `new BigDecimal(text)` does; `None` for anything else
    /// (`NaN`, `Infinity`, exponents).
    pub fn parse(text: &str) -> Option<Decimal> {
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if int.is_empty() || !all_digits(int) || !all_digits(frac) || digits.ends_with('.') {
            return None;
        }
        let magnitude = BigInt::parse_bytes(format!("{int}{frac}").as_bytes(), 10)?;
        Some(Decimal {
            unscaled: if negative { -magnitude } else { magnitude },
            scale: i32::try_from(frac.len()).ok()?,
        })
    }

    /// `setScale(scale)` when it adds digits (Debezium only ever widens a column's scale).
    pub fn widened(&self, scale: i32) -> Decimal {
        if scale <= self.scale {
            return self.clone();
        }
        let factor = BigInt::from(10u8).pow(scale.abs_diff(self.scale));
        Decimal {
            unscaled: &self.unscaled * factor,
            scale,
        }
    }

    /// `BigInteger.toByteArray()` of the unscaled value: two's complement, big-endian, shortest.
    pub fn unscaled_bytes(&self) -> Vec<u8> {
        self.unscaled.to_signed_bytes_be()
    }

    /// `BigDecimal.toString()`: plain unless the exponent is below -6 or the scale negative.
    pub fn to_java_string(&self) -> String {
        let digits = self.unscaled.magnitude().to_string();
        let sign = if self.unscaled.sign() == Sign::Minus {
            "-"
        } else {
            ""
        };
        let adjusted = i64::from(-self.scale) + digits.len() as i64 - 1;
        if self.scale >= 0 && adjusted >= -6 {
            return format!("{sign}{}", plain(&digits, self.scale));
        }
        let (first, rest) = digits.split_at(1);
        let point = if rest.is_empty() { "" } else { "." };
        let exponent_sign = if adjusted >= 0 { "+" } else { "" };
        format!("{sign}{first}{point}{rest}E{exponent_sign}{adjusted}")
    }

    /// `BigDecimal.toPlainString()`.
    pub fn to_plain_string(&self) -> String {
        let digits = self.unscaled.magnitude().to_string();
        let sign = if self.unscaled.sign() == Sign::Minus {
            "-"
        } else {
            ""
        };
        if self.scale < 0 {
            let zeros = "0".repeat(self.scale.unsigned_abs() as usize);
            return format!("{sign}{digits}{zeros}");
        }
        format!("{sign}{}", plain(&digits, self.scale))
    }

    /// `BigDecimal.doubleValue()`: the nearest double.
    pub fn to_f64(&self) -> f64 {
        self.to_java_string().parse().unwrap_or(f64::NAN)
    }
}

/// `digits` with a point `scale` places from the right (`scale` at least 0).
fn plain(digits: &str, scale: i32) -> String {
    let scale = scale.unsigned_abs() as usize;
    if scale == 0 {
        return digits.to_owned();
    }
    if digits.len() > scale {
        let (int, frac) = digits.split_at(digits.len() - scale);
        return format!("{int}.{frac}");
    }
    format!("0.{}{digits}", "0".repeat(scale - digits.len()))
}
