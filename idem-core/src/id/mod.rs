//! Identity: the key a client sends, the scope it is valid in, and the
//! record id the two make.

pub(crate) mod key;
pub(crate) mod scope;
