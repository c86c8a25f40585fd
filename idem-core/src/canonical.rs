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
//! differ only beyond double precision therefore canonicalise (and
//! fingerprint) alike. Send identifiers of that size as strings. Integers up
//! to 2^53 in magnitude are written exactly.

use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

/// The RFC 8785 canonical form of `value`.
///
/// # Examples
///
/// ```
/// use idem_core::canonical_json;
/// use serde_json::json;
///
/// let v = json!({"b": 1.0, "a": [1e21, 1e-7, "\u{1f600}"], "c": -0.0});
/// assert_eq!(canonical_json(&v), r#"{"a":[1e+21,1e-7,"😀"],"b":1,"c":0}"#);
/// ```
#[must_use]
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write_value(value, &mut out);
    out
}

pub(crate) fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            let mut first = true;
            for item in items {
                if !first {
                    out.push(',');
                }
                first = false;
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(map, out),
    }
}

fn write_object(map: &Map<String, Value>, out: &mut String) {
    out.push('{');
    // serde_json's default map is a BTreeMap (UTF-8 byte order), which agrees
    // with UTF-16 order unless a name holds characters at or above U+E000.
    // Check the order we were given and sort only when it is wrong (always
    // the case with serde_json's `preserve_order` feature).
    let mut prev: Option<&str> = None;
    let sorted = map.keys().all(|k| {
        let ok = prev.is_none_or(|p| utf16_cmp(p, k) == Ordering::Less);
        prev = Some(k);
        ok
    });
    if sorted {
        write_members(map.iter(), out);
    } else {
        let mut entries: Vec<(&String, &Value)> = map.iter().collect();
        entries.sort_unstable_by(|a, b| utf16_cmp(a.0, b.0));
        write_members(entries.into_iter(), out);
    }
    out.push('}');
}

fn write_members<'a>(members: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut String) {
    let mut first = true;
    for (name, value) in members {
        if !first {
            out.push(',');
        }
        first = false;
        write_string(name, out);
        out.push(':');
        write_value(value, out);
    }
}

/// Compares two strings by their UTF-16 code units without re-encoding them.
pub(crate) fn utf16_cmp(a: &str, b: &str) -> Ordering {
    let (ab, bb) = (a.as_bytes(), b.as_bytes());
    let Some(i) = ab.iter().zip(bb).position(|(x, y)| x != y) else {
        return ab.len().cmp(&bb.len());
    };
    // Back up to the start of the character that differs (same in both).
    let mut start = i;
    while !a.is_char_boundary(start) {
        start -= 1;
    }
    let (Some(ca), Some(cb)) = (a[start..].chars().next(), b[start..].chars().next()) else {
        return ab.len().cmp(&bb.len());
    };
    let (ua, ub) = (first_utf16_unit(ca), first_utf16_unit(cb));
    // Equal first units means both are astral with the same high surrogate;
    // the low surrogates then order like the code points.
    ua.cmp(&ub).then((ca as u32).cmp(&(cb as u32)))
}

fn first_utf16_unit(c: char) -> u32 {
    let c = c as u32;
    if c < 0x1_0000 {
        c
    } else {
        0xD800 + ((c - 0x1_0000) >> 10)
    }
}

/// Largest magnitude below which every integer is exactly a double.
const EXACT_INT: u64 = 1 << 53;

fn write_number(n: &Number, out: &mut String) {
    if let Some(u) = n.as_u64() {
        if u <= EXACT_INT {
            out.push_str(itoa::Buffer::new().format(u));
            return;
        }
        #[allow(clippy::cast_precision_loss)] // documented: RFC 8785 numbers are doubles
        write_f64(u as f64, out);
    } else if let Some(i) = n.as_i64() {
        if i.unsigned_abs() <= EXACT_INT {
            out.push_str(itoa::Buffer::new().format(i));
            return;
        }
        #[allow(clippy::cast_precision_loss)]
        write_f64(i as f64, out);
    } else if let Some(f) = n.as_f64() {
        write_f64(f, out);
    }
}

/// Writes a finite double as ECMAScript's `Number::toString` does.
pub(crate) fn write_f64(f: f64, out: &mut String) {
    if f == 0.0 || !f.is_finite() {
        // -0 is written as 0; JSON values never hold NaN or infinities.
        out.push('0');
        return;
    }
    if f < 0.0 {
        out.push('-');
    }
    let mut buf = ryu::Buffer::new();
    let text = buf.format_finite(f.abs());
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
    let push_digits = |out: &mut String, d: &[u8]| {
        for &b in d {
            out.push(char::from(b));
        }
    };
    if k <= n && n <= 21 {
        push_digits(out, digits);
        for _ in 0..(n - k) {
            out.push('0');
        }
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(usize::try_from(n).unwrap_or(0));
        push_digits(out, int);
        out.push('.');
        push_digits(out, frac);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        for _ in 0..(-n) {
            out.push('0');
        }
        push_digits(out, digits);
    } else {
        let e = n - 1;
        push_digits(out, &digits[..1]);
        if k > 1 {
            out.push('.');
            push_digits(out, &digits[1..]);
        }
        out.push('e');
        out.push(if e < 0 { '-' } else { '+' });
        out.push_str(itoa::Buffer::new().format(e.unsigned_abs()));
    }
}

pub(crate) fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let bytes = s.as_bytes();
    let mut run_start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            0x0C => "\\f",
            b'\r' => "\\r",
            0x00..=0x1F => "",
            _ => continue,
        };
        // Every byte that needs escaping is ASCII, so `i` is a char boundary.
        out.push_str(&s[run_start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        } else {
            out.push_str(escape);
        }
        run_start = i + 1;
    }
    out.push_str(&s[run_start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn num(f: f64) -> String {
        let mut s = String::new();
        write_f64(f, &mut s);
        s
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
