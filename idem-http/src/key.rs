//! Step 2 of a covered request: `Idempotency-Key` field parsing (draft-ietf-httpapi-idempotency-key-header
//! §2.1): an RFC 8941 sf-string, or (lenient) the bare value.

use std::fmt;

use idem_core::IdempotencyKey;
use idem_core::error::KeyError;

/// How strictly the key field is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeySyntax {
    /// The sf-string (`"k"`) and the bare value (`k`) are both accepted and
    /// name the same key (the default: most clients send bare keys).
    #[default]
    Lenient,
    /// Only the sf-string form of the draft.
    StructuredOnly,
}

/// Why a key field was refused (the `detail` of an `invalid_key` problem).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// More than one field line.
    Repeated,
    /// A list (`a, b`) or merged field lines.
    List,
    /// Not an sf-string (a bare value under `StructuredOnly`, a token, a number).
    NotAString,
    /// A backslash not followed by `"` or `\`.
    BadEscape,
    /// A quoted string without its closing quote.
    Unterminated,
    /// Bytes outside visible ASCII (obs-text, control characters).
    NonAscii,
    /// Empty after unquoting and trimming.
    Empty,
    /// Longer than 255 characters.
    TooLong,
    /// A character the key syntax does not allow.
    InvalidCharacter,
    /// Refused by the layer's [`key_validator`](crate::Builder::key_validator)
    /// (its reason is the problem's `detail`).
    RejectedByValidator,
}

impl KeyHeaderError {
    /// The stable reason (`repeated`, `list`, ...).
    #[must_use]
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Repeated => "repeated",
            Self::List => "list",
            Self::NotAString => "not_a_string",
            Self::BadEscape => "bad_escape",
            Self::Unterminated => "unterminated",
            Self::NonAscii => "non_ascii",
            Self::Empty => "empty",
            Self::TooLong => "too_long",
            Self::InvalidCharacter => "invalid_character",
            Self::RejectedByValidator => "rejected_by_validator",
        }
    }

    /// A sentence for the problem's `detail`.
    #[must_use]
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Repeated => "the Idempotency-Key field appears more than once",
            Self::List => "the Idempotency-Key field holds a list; send one key",
            Self::NotAString => "the Idempotency-Key field must be a string",
            Self::BadEscape => "the quoted key has an escape other than \\\" or \\\\",
            Self::Unterminated => "the quoted key has no closing quote",
            Self::NonAscii => "the key holds bytes outside printable ASCII",
            Self::Empty => "the key is empty",
            Self::TooLong => "the key is longer than 255 characters",
            Self::InvalidCharacter => "the key holds a character that is not allowed",
            Self::RejectedByValidator => "the key does not meet this API's key rules",
        }
    }
}

impl fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for KeyHeaderError {}

/// Parses the field lines of the key header into a key (step 2 of a
/// covered request): `lines` are the raw values of every field line with
/// that name, in order; none is "no key" (`Ok(None)`). The sf-string and,
/// when lenient, the bare value name the same key; a list, a repeated line
/// or a bare value under `StructuredOnly` is refused.
///
/// # Errors
///
/// [`KeyHeaderError`] for every form the draft and core refuse.
pub fn parse_key_header(
    lines: &[&[u8]],
    syntax: KeySyntax,
) -> Result<Option<IdempotencyKey>, KeyHeaderError> {
    let line = match lines {
        [] => return Ok(None),
        [one] => *one,
        _ => return Err(KeyHeaderError::Repeated),
    };
    let value = trim_ows(line);
    if value
        .iter()
        .any(|&b| b >= 0x80 || (b < 0x20 && b != b'\t') || b == 0x7f)
    {
        return Err(KeyHeaderError::NonAscii);
    }
    let key = if value.first() == Some(&b'"') {
        parse_quoted(value)?
    } else {
        if syntax == KeySyntax::StructuredOnly {
            return Err(KeyHeaderError::NotAString);
        }
        if value.contains(&b',') {
            return Err(KeyHeaderError::List);
        }
        if value.contains(&b'"') {
            return Err(KeyHeaderError::InvalidCharacter);
        }
        // Checked above: visible ASCII, SP and HTAB only.
        String::from_utf8_lossy(value).into_owned()
    };
    IdempotencyKey::parse(&key).map(Some).map_err(|e| match e {
        KeyError::Empty => KeyHeaderError::Empty,
        KeyError::TooLong { .. } => KeyHeaderError::TooLong,
        _ => KeyHeaderError::InvalidCharacter,
    })
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// The quoted form through `sfv` (RFC 8941 Item: a String with optional
/// parameters, which are parsed and ignored). When `sfv` refuses, a scan of
/// the bytes names the reason.
fn parse_quoted(value: &[u8]) -> Result<String, KeyHeaderError> {
    let parsed = sfv::Parser::new(value)
        .with_version(sfv::Version::Rfc8941)
        .parse_item::<sfv::Item>();
    match parsed {
        Ok(item) => match item.bare_item {
            sfv::BareItem::String(s) => Ok(s.as_str().to_owned()),
            _ => Err(KeyHeaderError::NotAString),
        },
        Err(_) => Err(quoted_failure(value)),
    }
}

/// Why a value starting with `"` is not an sf-string Item.
fn quoted_failure(value: &[u8]) -> KeyHeaderError {
    let mut i = 1;
    while i < value.len() {
        match value[i] {
            b'\\' => match value.get(i + 1) {
                Some(b'"' | b'\\') => i += 2,
                Some(_) => return KeyHeaderError::BadEscape,
                None => return KeyHeaderError::Unterminated,
            },
            b'"' => {
                let rest = &value[i + 1..];
                return if rest.contains(&b',') {
                    KeyHeaderError::List
                } else {
                    KeyHeaderError::InvalidCharacter
                };
            }
            0x20..=0x7e => i += 1,
            _ => return KeyHeaderError::InvalidCharacter,
        }
    }
    KeyHeaderError::Unterminated
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(v: &[u8]) -> Result<Option<String>, KeyHeaderError> {
        parse_key_header(&[v], KeySyntax::Lenient).map(|k| k.map(|k| k.as_str().to_owned()))
    }

    #[test]
    fn every_invalid_form_has_its_reason() {
        use KeyHeaderError::*;
        let cases: &[(&[u8], KeyHeaderError)] = &[
            (b"", Empty),
            (b"   ", Empty),
            (b"\"\"", Empty),
            (b"\"  \"", Empty),
            (b"\"a\\nb\"", BadEscape),
            (b"\"abc", Unterminated),
            (b"\"abc\\", Unterminated),
            (b"a, b", List),
            (b"\"a\", \"b\"", List),
            (b"ab\"c", InvalidCharacter),
            (b"\"a\"x", InvalidCharacter),
            (b"caf\xc3\xa9", NonAscii),
            (b"a\x01b", NonAscii),
            (b"a\x7fb", NonAscii),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse(input),
                Err(*want),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        assert_eq!(
            parse_key_header(&[b"a", b"b"], KeySyntax::Lenient),
            Err(Repeated)
        );
        assert_eq!(parse_key_header(&[], KeySyntax::Lenient), Ok(None));
        let long = "k".repeat(255);
        assert_eq!(parse(long.as_bytes()), Ok(Some(long.clone())));
        assert_eq!(parse(format!("{long}k").as_bytes()), Err(TooLong));
        assert_eq!(parse(format!("\"{long}k\"").as_bytes()), Err(TooLong));
    }

    #[test]
    fn quoted_and_bare_name_one_key() {
        let quoted = parse_key_header(&[br#""ab\"c""#], KeySyntax::Lenient);
        assert_eq!(quoted.unwrap().unwrap().as_str(), "ab\"c");
        let bare = parse_key_header(&[b"order-7"], KeySyntax::Lenient);
        assert_eq!(bare.unwrap().unwrap().as_str(), "order-7");
        assert_eq!(
            parse_key_header(&[b"k"], KeySyntax::StructuredOnly),
            Err(KeyHeaderError::NotAString)
        );
    }

    #[test]
    fn parameters_are_parsed_and_ignored() {
        assert_eq!(parse(b"\"k\";a=1;b"), Ok(Some("k".to_owned())));
        assert_eq!(parse(b" \t\"k\" "), Ok(Some("k".to_owned())));
        assert_eq!(parse(b"\"k\";"), Err(KeyHeaderError::InvalidCharacter));
    }

    fn sf_string(key: &str) -> String {
        let mut out = String::from("\"");
        for c in key.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }

    proptest! {
        #[test]
        fn quoted_round_trip_and_bare_equivalence(key in "[ -~]{1,255}") {
            let trimmed = key.trim_matches([' ', '\t']);
            prop_assume!(!trimmed.is_empty());
            let quoted = parse(sf_string(&key).as_bytes());
            prop_assert_eq!(quoted.clone(), Ok(Some(trimmed.to_owned())));
            if !key.contains([',', '"']) {
                prop_assert_eq!(parse(key.as_bytes()), quoted);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(lines in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..3)) {
            let refs: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
            let _ = parse_key_header(&refs, KeySyntax::Lenient);
            let _ = parse_key_header(&refs, KeySyntax::StructuredOnly);
        }
    }
}
