//! The one storage layout a build reads and writes, and the check that
//! refuses a table written by another.

/// The mark of the storage layout this build reads and writes, frozen for
/// 0.1: each dialect's migration leaves it on the table (a table comment, or
/// the text of the `CREATE TABLE`), and `migrate` reads it back before
/// touching an existing table.
pub const LAYOUT: &str = "idem layout 1";

/// A table that exists but was not written in [`LAYOUT`]: a build of idem
/// before 0.1, a later layout, or a table of something else. It is never
/// read, migrated over or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError {
    /// The table, as the store names it.
    pub table: String,
    /// The mark found on it, if any.
    pub found: Option<String>,
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let found = match &self.found {
            Some(mark) => format!("its mark is {mark:?}"),
            None => "it has no layout mark (a build of idem before 0.1, or a table of \
                     something else)"
                .to_owned(),
        };
        write!(
            f,
            "the table {} was not written in {LAYOUT:?}: {found}. This build reads and \
             writes {LAYOUT:?} only and never reads another: point the store at a new \
             table (`with_table_name`), or drop this one once its keys have expired",
            self.table
        )
    }
}

impl std::error::Error for LayoutError {}

/// Accepts an existing table whose layout mark (read from `found`: its
/// comment, or the text that created it) is [`LAYOUT`].
///
/// # Errors
///
/// [`LayoutError`] for any other table, with the mark it carries if any
/// (`idem layout N`).
pub fn check_layout(table: &str, found: Option<&str>) -> Result<(), LayoutError> {
    let mark = found.and_then(mark_in);
    if mark == Some(LAYOUT) {
        return Ok(());
    }
    Err(LayoutError {
        table: table.to_owned(),
        found: mark.map(str::to_owned),
    })
}

/// The layout mark in `text`: `idem layout` and the word after it.
fn mark_in(text: &str) -> Option<&str> {
    const WORDS: &str = "idem layout ";
    let start = text.find(WORDS)?;
    let rest = &text[start + WORDS.len()..];
    let end = rest
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(rest.len());
    Some(&text[start..start + WORDS.len() + end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_mark_of_this_layout_is_accepted() {
        assert_eq!(check_layout("t", Some(LAYOUT)), Ok(()));
        assert_eq!(
            check_layout("t", Some("CREATE TABLE t ( -- idem layout 1\n a int)")),
            Ok(())
        );
        let none = check_layout("t", None).unwrap_err();
        assert_eq!(none.found, None);
        assert!(none.to_string().contains("before 0.1"), "{none}");
        let empty = check_layout("t", Some("")).unwrap_err();
        assert_eq!(empty.found, None, "an empty comment is no mark");
        let text = check_layout("t", Some("CREATE TABLE t (a int)")).unwrap_err();
        assert_eq!(text.found, None, "a text without the words is no mark");
        let other = check_layout("t", Some("idem layout 2")).unwrap_err();
        assert_eq!(other.found.as_deref(), Some("idem layout 2"));
        let longer = check_layout("t", Some("( -- idem layout 12\n")).unwrap_err();
        assert_eq!(longer.found.as_deref(), Some("idem layout 12"), "not 1");
        assert!(other.to_string().contains("with_table_name"), "{other}");
    }
}
