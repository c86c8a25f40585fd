//! Identifier validation: the table (and schema) names the SQL stores
//! splice into their statements.

/// Checks that `name` is a plain SQL identifier, `[A-Za-z_][A-Za-z0-9_]*`
/// of at most `max` bytes: no quote, no `;`, nothing that needs escaping,
/// so that it can be spliced into a statement. A dialect adds its own
/// reserved prefixes on top.
///
/// # Errors
///
/// Why the name is refused, for the store's `InvalidIdentifier` error.
pub fn check_identifier(name: &str, max: usize) -> Result<(), &'static str> {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Err("it is empty");
    };
    if name.len() > max {
        return Err("it is too long");
    }
    if !(first.is_ascii_alphabetic() || first == '_') {
        return Err("it must start with an ASCII letter or '_'");
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("only ASCII letters, digits and '_' are allowed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked() {
        for ok in [
            "idem_records",
            "_t",
            "T1",
            "sqlite",
            "a".repeat(40).as_str(),
        ] {
            assert_eq!(check_identifier(ok, 40), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "x\"; DROP TABLE y; --",
            "x`; DROP TABLE y; --",
            "t'",
            "t;",
            "é",
            "a\0",
            "a".repeat(41).as_str(),
        ] {
            assert!(check_identifier(bad, 40).is_err(), "{bad:?}");
        }
    }
}
