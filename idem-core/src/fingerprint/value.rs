//! RFC 8785 (JSON Canonicalization Scheme) serialisation of a `serde_json::Value`.
//!
//! * Object members are sorted by the UTF-16 code units of their names.
//! * Numbers are written as ECMAScript's `Number.prototype.toString` writes the
//!   IEEE 754 double they denote: `1.0` → `1`, `1e21` → `1e+21`, `1e-7` →
//!   `1e-7`, `-0` → `0`.
//! * Strings use the minimal escaping of RFC 8785 §3.2.2.2: `\"`, `\\`, the
//!   short escapes `\b \t \n \f \r`, `\u00xx` (lowercase hex) for the other
//!   control characters, every other character as itself.
//!
//! # Numbers beyond `f64` precision
//!
//! RFC 8785 defines JSON numbers as IEEE 754 doubles, and so does this
//! function: an integer whose magnitude is above 2^53 is rounded to the
//! nearest double, exactly as a JavaScript client would read it
//! (`18446744073709551615` → `18446744073709552000`). Two such integers that
//! differ only beyond double precision therefore canonicalise alike. The
//! request *fingerprint* still tells them apart: it hashes integers that
//! serde_json holds exactly (`i64`/`u64`) by their exact digits (see
//! [`fingerprint`](crate::adapter::fingerprint)). Integers up to 2^53 in magnitude are
//! written exactly.

use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

/// The RFC 8785 canonical form of `value`.
///
/// # Examples
///
/// ```
/// use idem_core::adapter::canonical_json;
/// use serde_json::json;
///
/// let v = json!({"b": 1.0, "a": [1e21, 1e-7, "\u{1f600}"], "c": -0.0});
/// assert_eq!(canonical_json(&v), r#"{"a":[1e+21,1e-7,"😀"],"b":1,"c":0}"#);
/// ```
#[must_use]
pub fn canonical_json(value: &Value) -> String {
    let bytes = canonical_bytes(value);
    // Only whole UTF-8 strings and ASCII are ever written, so this never
    // takes the lossy path; checking costs one fast pass.
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`canonical_json`] as bytes (what the fingerprint hashes), built in a byte
/// buffer: pushing bytes skips the char-boundary and UTF-8 bookkeeping of
/// `String`.
pub(crate) fn canonical_bytes(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut ints = Ints {
        exact: false,
        wrote_exact: false,
    };
    write_value(value, &mut out, &mut ints);
    out
}

/// The bytes the fingerprint hashes: [`canonical_bytes`], except that an
/// integer serde_json holds exactly (`i64`/`u64`) beyond 2^53 in magnitude is
/// written as its exact decimal digits instead of the nearest double. The
/// flag says whether any such integer was written; when it is `false` the
/// bytes are exactly [`canonical_bytes`].
pub(crate) fn fingerprint_bytes(value: &Value) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(256);
    let mut ints = Ints {
        exact: true,
        wrote_exact: false,
    };
    write_value(value, &mut out, &mut ints);
    (out, ints.wrote_exact)
}

/// How integers beyond 2^53 are written.
pub(crate) struct Ints {
    /// Exact digits (fingerprints) instead of the nearest double (RFC 8785).
    exact: bool,
    /// Set once an integer beyond 2^53 was written as exact digits.
    wrote_exact: bool,
}

pub(crate) fn write_value(value: &Value, out: &mut Vec<u8>, ints: &mut Ints) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out, ints),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            let mut first = true;
            for item in items {
                if !first {
                    out.push(b',');
                }
                first = false;
                write_value(item, out, ints);
            }
            out.push(b']');
        }
        Value::Object(map) => write_object(map, out, ints),
    }
}

fn write_object(map: &Map<String, Value>, out: &mut Vec<u8>, ints: &mut Ints) {
    out.push(b'{');
    // serde_json's default map is a BTreeMap (UTF-8 byte order), which agrees
    // with UTF-16 order unless a name holds characters at or above U+E000.
    // Write the members in the order given while checking it; on the first
    // name out of UTF-16 order, undo and write them sorted (always the path
    // with serde_json's `preserve_order` feature).
    let start = out.len();
    let mut prev: Option<&str> = None;
    let mut in_order = true;
    for (name, value) in map {
        if let Some(p) = prev {
            if utf16_cmp(p, name) != Ordering::Less {
                in_order = false;
                break;
            }
            out.push(b',');
        }
        prev = Some(name);
        write_string(name, out);
        out.push(b':');
        write_value(value, out, ints);
    }
    if !in_order {
        out.truncate(start);
        let mut entries: Vec<(&String, &Value)> = map.iter().collect();
        entries.sort_unstable_by(|a, b| utf16_cmp(a.0, b.0));
        let mut first = true;
        for (name, value) in entries {
            if !first {
                out.push(b',');
            }
            first = false;
            write_string(name, out);
            out.push(b':');
            write_value(value, out, ints);
        }
    }
    out.push(b'}');
}

/// Compares two strings by their UTF-16 code units without re-encoding them.
///
/// UTF-8 byte order is code point order, and UTF-16 order agrees with code
/// point order except between a supplementary character (4-byte UTF-8, lead
/// byte `0xF0..=0xF4`, a surrogate pair `0xD800..` in UTF-16) and a character
/// in `U+E000..=U+FFFF` (lead byte `0xEE` or `0xEF`). So the first differing
/// byte decides, with that one pair of lead-byte ranges swapped. A differing
/// continuation byte sits under equal lead bytes, where both orders agree.
pub(crate) fn utf16_cmp(a: &str, b: &str) -> Ordering {
    utf16_cmp_bytes(a.as_bytes(), b.as_bytes())
}

/// [`utf16_cmp`] on the UTF-8 bytes of two strings.
pub(crate) fn utf16_cmp_bytes(ab: &[u8], bb: &[u8]) -> Ordering {
    let Some((&x, &y)) = ab.iter().zip(bb).find(|(x, y)| x != y) else {
        return ab.len().cmp(&bb.len());
    };
    let high_bmp = |v: u8| (0xEE..=0xEF).contains(&v);
    if x >= 0xF0 && high_bmp(y) {
        Ordering::Less
    } else if high_bmp(x) && y >= 0xF0 {
        Ordering::Greater
    } else {
        x.cmp(&y)
    }
}

/// Largest magnitude below which every integer is exactly a double.
const EXACT_INT: u64 = 1 << 53;

fn write_number(n: &Number, out: &mut Vec<u8>, ints: &mut Ints) {
    if let Some(u) = n.as_u64() {
        if u <= EXACT_INT || ints.exact {
            ints.wrote_exact |= u > EXACT_INT;
            out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
            return;
        }
        #[allow(clippy::cast_precision_loss)] // documented: RFC 8785 numbers are doubles
        write_f64(u as f64, out);
    } else if let Some(i) = n.as_i64() {
        if i.unsigned_abs() <= EXACT_INT || ints.exact {
            ints.wrote_exact |= i.unsigned_abs() > EXACT_INT;
            out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
            return;
        }
        #[allow(clippy::cast_precision_loss)]
        write_f64(i as f64, out);
    } else if let Some(f) = n.as_f64() {
        write_f64(f, out);
    }
}

/// Writes a finite double as ECMAScript's `Number::toString` does.
pub(crate) fn write_f64(f: f64, out: &mut Vec<u8>) {
    if f == 0.0 || !f.is_finite() {
        // -0 is written as 0; JSON values never hold NaN or infinities.
        out.push(b'0');
        return;
    }
    if f < 0.0 {
        out.push(b'-');
    }
    let a = f.abs();
    #[allow(clippy::cast_precision_loss)] // 2^53 is exact
    let exact_limit = EXACT_INT as f64;
    if a.fract() == 0.0 && a <= exact_limit {
        // An integer every double spells exactly: ECMAScript writes its digits.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        // integral, 0 < a <= 2^53
        out.extend_from_slice(itoa::Buffer::new().format(a as u64).as_bytes());
        return;
    }
    let mut buf = ryu::Buffer::new();
    let text = buf.format_finite(a);
    if a.fract() != 0.0 && !text.contains(['e', 'E']) {
        // A non-integer ryu writes in plain decimal (decimal point position
        // -5 < n <= 16): the same shortest digits in the same layout as
        // ECMAScript (which uses plain decimal for -6 < n <= 21).
        out.extend_from_slice(text.as_bytes());
        return;
    }
    // Split ryu's output into significant digits and a decimal exponent:
    // value = 0.DIGITS × 10^point.
    let (mantissa, exp) = match text.find(['e', 'E']) {
        Some(pos) => (&text[..pos], text[pos + 1..].parse::<i32>().unwrap_or(0)),
        None => (text, 0),
    };
    let mut digits = [0u8; 32];
    let mut len = 0usize;
    let mut point: i32 = 0;
    let mut seen_point = false;
    let mut leading = true;
    for &b in mantissa.as_bytes() {
        match b {
            b'.' => seen_point = true,
            b'0'..=b'9' => {
                if leading && b == b'0' {
                    if seen_point {
                        point -= 1;
                    }
                    continue;
                }
                leading = false;
                if len < digits.len() {
                    digits[len] = b;
                    len += 1;
                }
                if !seen_point {
                    point += 1;
                }
            }
            _ => {}
        }
    }
    while len > 1 && digits[len - 1] == b'0' {
        len -= 1;
    }
    let digits = &digits[..len];
    let k = i32::try_from(len).unwrap_or(i32::MAX);
    let n = point + exp;
    let push_digits = |out: &mut Vec<u8>, d: &[u8]| out.extend_from_slice(d);
    if k <= n && n <= 21 {
        push_digits(out, digits);
        for _ in 0..(n - k) {
            out.push(b'0');
        }
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(usize::try_from(n).unwrap_or(0));
        push_digits(out, int);
        out.push(b'.');
        push_digits(out, frac);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        for _ in 0..(-n) {
            out.push(b'0');
        }
        push_digits(out, digits);
    } else {
        let e = n - 1;
        push_digits(out, &digits[..1]);
        if k > 1 {
            out.push(b'.');
            push_digits(out, &digits[1..]);
        }
        out.push(b'e');
        out.push(if e < 0 { b'-' } else { b'+' });
        out.extend_from_slice(itoa::Buffer::new().format(e.unsigned_abs()).as_bytes());
    }
}

/// What each byte becomes inside a string: `0` for itself, otherwise what
/// follows its backslash: the letter of its short escape, or `u` for `\u00xx`.
static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[b'\t' as usize] = b't';
    t[b'\n' as usize] = b'n';
    t[0x0C] = b'f';
    t[b'\r' as usize] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// A mask with the high bit set in every byte of `w` (little-endian) that is
/// a control character, `"` or `\`. The lowest set bit is exact (the classic
/// has-zero-byte / has-less-than tests can only misflag bytes above a true
/// hit, through the borrow), which is all the caller uses.
const fn escape_mask(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let control = w.wrapping_sub(ONES * 0x20) & !w;
    let q = w ^ (ONES * 0x22);
    let quote = q.wrapping_sub(ONES) & !q;
    let bs = w ^ (ONES * 0x5C);
    let backslash = bs.wrapping_sub(ONES) & !bs;
    (control | quote | backslash) & HIGH
}

pub(crate) fn write_string(s: &str, out: &mut Vec<u8>) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run_start = 0;
    let mut i = 0;
    // 8 bytes at a time while 8 remain; most strings need no escape at all.
    while let Some(chunk) = bytes.get(i..i + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let mask = escape_mask(u64::from_le_bytes(w));
        if mask == 0 {
            i += 8;
            continue;
        }
        // The first byte to escape (every such byte is ASCII).
        let j = i + (mask.trailing_zeros() / 8) as usize;
        out.extend_from_slice(&bytes[run_start..j]);
        write_escape(bytes[j], out);
        run_start = j + 1;
        i = j + 1;
    }
    // The last 0 to 7 bytes, one at a time.
    for (j, &b) in bytes.iter().enumerate().skip(i) {
        if ESCAPE[usize::from(b)] != 0 {
            out.extend_from_slice(&bytes[run_start..j]);
            write_escape(b, out);
            run_start = j + 1;
        }
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
}

#[cold]
fn write_escape(b: u8, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let esc = ESCAPE[usize::from(b)];
    out.push(b'\\');
    if esc == b'u' {
        out.extend_from_slice(b"u00");
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 0xF)]);
    } else {
        out.push(esc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn num(f: f64) -> String {
        let mut s = Vec::new();
        write_f64(f, &mut s);
        String::from_utf8(s).unwrap()
    }

    #[test]
    fn rfc8785_number_examples() {
        // RFC 8785 Appendix B (IEEE 754 bit patterns → canonical text).
        let cases: &[(u64, &str)] = &[
            (0x0000_0000_0000_0000, "0"),
            (0x8000_0000_0000_0000, "0"),
            (0x0000_0000_0000_0001, "5e-324"),
            (0x8000_0000_0000_0001, "-5e-324"),
            (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
            (0xffef_ffff_ffff_ffff, "-1.7976931348623157e+308"),
            (0x4340_0000_0000_0000, "9007199254740992"),
            (0xc340_0000_0000_0000, "-9007199254740992"),
            (0x4430_0000_0000_0000, "295147905179352830000"),
            (0x44b5_2d02_c7e1_4af5, "9.999999999999997e+22"),
            (0x44b5_2d02_c7e1_4af6, "1e+23"),
            (0x44b5_2d02_c7e1_4af7, "1.0000000000000001e+23"),
            (0x444b_1ae4_d6e2_ef4e, "999999999999999700000"),
            (0x444b_1ae4_d6e2_ef4f, "999999999999999900000"),
            (0x444b_1ae4_d6e2_ef50, "1e+21"),
            (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
            (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
            (0x41b3_de43_5555_5553, "333333333.3333332"),
            (0x41b3_de43_5555_5554, "333333333.33333325"),
            (0x41b3_de43_5555_5555, "333333333.3333333"),
            (0x41b3_de43_5555_5556, "333333333.3333334"),
            (0x41b3_de43_5555_5557, "333333333.33333343"),
            (0xbecb_f647_612f_3696, "-0.0000033333333333333333"),
            (0x4314_3ff3_c1cb_0959, "1424953923781206.2"),
        ];
        for &(bits, expected) in cases {
            assert_eq!(num(f64::from_bits(bits)), expected, "bits {bits:#x}");
        }
    }

    #[test]
    fn rfc8785_sorting_example() {
        // RFC 8785 §3.2.3: names sorted by UTF-16 code units.
        let v: Value = serde_json::from_str(
            r#"{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
                "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control",
                "\u00f6": "Latin Small Letter O With Diaeresis"}"#,
        )
        .unwrap();
        let out = canonical_json(&v);
        let order: Vec<&str> = [
            "Carriage Return",
            "One",
            "Control",
            "Latin Small Letter O With Diaeresis",
            "Euro Sign",
            "Emoji: Grinning Face",
            "Hebrew Letter Dalet With Dagesh",
        ]
        .to_vec();
        let mut last = 0;
        for name in order {
            let pos = out.find(name).unwrap();
            assert!(pos > last, "{name} out of order in {out}");
            last = pos;
        }
    }

    #[test]
    fn rfc8785_main_example() {
        // RFC 8785 §3.2.2 input and §3.2.4 expected output.
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        let v: Value = serde_json::from_str(input).unwrap();
        assert_eq!(
            canonical_json(&v),
            "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\"string\":\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"
        );
    }

    #[test]
    fn integers_and_spellings() {
        assert_eq!(canonical_json(&json!(1.0)), "1");
        assert_eq!(canonical_json(&json!(-0.0)), "0");
        assert_eq!(canonical_json(&json!(100)), "100");
        assert_eq!(canonical_json(&json!(-42)), "-42");
        assert_eq!(canonical_json(&json!(1e21)), "1e+21");
        assert_eq!(canonical_json(&json!(1e20)), "100000000000000000000");
        assert_eq!(canonical_json(&json!(1e-7)), "1e-7");
        assert_eq!(canonical_json(&json!(0.1)), "0.1");
        assert_eq!(canonical_json(&json!(123.456)), "123.456");
        assert_eq!(canonical_json(&json!(u64::MAX)), "18446744073709552000");
        assert_eq!(canonical_json(&json!(i64::MIN)), "-9223372036854776000");
        assert_eq!(
            canonical_json(&json!(9_007_199_254_740_993_u64)),
            "9007199254740992"
        );
        assert_eq!(
            canonical_json(&json!(9_007_199_254_740_992_u64)),
            "9007199254740992"
        );
    }

    #[test]
    fn strings_escape_minimally() {
        assert_eq!(
            canonical_json(&json!("a\u{7f}\u{2028}\u{1}\u{1f}é")),
            "\"a\u{7f}\u{2028}\\u0001\\u001fé\""
        );
    }

    #[test]
    fn matches_preserve_order_maps_by_sorting() {
        // An object whose names need the slow path: U+FB33 sorts after an emoji in UTF-16.
        let v = json!({"\u{fb33}": 1, "\u{1f600}": 2, "a": 3});
        assert_eq!(canonical_json(&v), "{\"a\":3,\"😀\":2,\"דּ\":1}");
    }
}
