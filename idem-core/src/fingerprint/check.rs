//! A validating pass over a `Serialize` value: proof, before anything is
//! stored or hashed, that its JSON can be read back.
//!
//! serde_json writes a non-finite float (NaN, ±infinity) as `null`, and
//! writes nesting of any depth, but its parser refuses nesting of
//! [`MAX_DEPTH`] + 1 containers (its recursion limit). A value with either
//! would be stored as bytes that never decode back, or fingerprinted as if
//! it were another request. [`check`] walks the value through serde once,
//! allocating nothing, and refuses both; it stops at the first container
//! past the limit, so a hostile value cannot exhaust the stack here.

use std::fmt;

use serde::ser::{self, Serialize};

use crate::util::BoxDynError;

/// The deepest nesting of arrays and objects accepted anywhere: requests of
/// every form, and stored responses. serde_json's parser refuses one more
/// (its recursion limit is 128 with the top container counted as the first
/// step), so this is the deepest JSON that can be read back.
pub(crate) const MAX_DEPTH: usize = 127;

/// The newtype name [`RawJson`](crate::RawJson) serializes under, so this
/// pass can skip its content: it is parsed JSON already (no non-finite
/// number can be in it), and its parse checks its own depth.
pub(crate) const RAW_JSON_TOKEN: &str = "$idem::RawJson";

/// Why a value has no JSON that reads back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CheckError {
    /// A NaN or infinite float: JSON has no such number.
    #[error("a float is NaN or infinite, which JSON cannot hold")]
    NonFinite,
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("nests deeper than {MAX_DEPTH} arrays and objects")]
    TooDeep,
    /// The value's own `Serialize` failed.
    #[error("{0}")]
    Custom(String),
}

impl ser::Error for CheckError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self::Custom(msg.to_string())
    }
}

/// Walks `value` as serde_json would write it; refuses non-finite floats and
/// nesting deeper than [`MAX_DEPTH`].
pub(crate) fn check<T: Serialize + ?Sized>(value: &T) -> Result<(), CheckError> {
    value.serialize(&mut Checker { depth: 0 })
}

/// `serde_json::to_vec`, but only for values whose bytes decode back:
/// [`check`] first (one allocation-free walk), then the write.
///
/// # Errors
///
/// A non-finite float, nesting deeper than [`MAX_DEPTH`], or any error of
/// the value's `Serialize` or of serde_json (e.g. a map with non-string keys).
pub(crate) fn to_vec_checked<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, BoxDynError> {
    check(value)?;
    Ok(serde_json::to_vec(value)?)
}

struct Checker {
    depth: usize,
}

impl Checker {
    fn enter(&mut self, containers: usize) -> Result<&mut Self, CheckError> {
        self.depth += containers;
        if self.depth > MAX_DEPTH {
            return Err(CheckError::TooDeep);
        }
        Ok(self)
    }

    fn leave(&mut self, containers: usize) {
        self.depth -= containers;
    }

    fn float(v: f64) -> Result<(), CheckError> {
        if v.is_finite() {
            Ok(())
        } else {
            Err(CheckError::NonFinite)
        }
    }
}

type Res = Result<(), CheckError>;

impl ser::Serializer for &mut Checker {
    type Ok = ();
    type Error = CheckError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    answer!(self => Res = Ok(());
        serialize_bool(bool), serialize_char(char), serialize_str(&str),
        serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64),
        serialize_i128(i128), serialize_u8(u8), serialize_u16(u16), serialize_u32(u32),
        serialize_u64(u64), serialize_u128(u128), serialize_none(), serialize_unit(),
        serialize_unit_struct(&'static str), serialize_unit_variant(&'static str, u32, &'static str),
    );
    fn serialize_f32(self, v: f32) -> Res {
        Checker::float(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Res {
        Checker::float(v)
    }
    fn serialize_bytes(self, _: &[u8]) -> Res {
        // serde_json writes bytes as an array of numbers.
        self.enter(1)?.leave(1);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Res {
        value.serialize(self)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, value: &T) -> Res {
        if name == RAW_JSON_TOKEN {
            return Ok(());
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Res {
        // `{"Variant": value}`
        let this = self.enter(1)?;
        value.serialize(&mut *this)?;
        this.leave(1);
        Ok(())
    }
    answer!(self => Result<Self, CheckError> = self.enter(1);
        serialize_seq(Option<usize>), serialize_tuple(usize),
        serialize_tuple_struct(&'static str, usize), serialize_map(Option<usize>),
        serialize_struct(&'static str, usize),
    );
    // `{"Variant": [...]}` and `{"Variant": {...}}`
    answer!(self => Result<Self, CheckError> = self.enter(2);
        serialize_tuple_variant(&'static str, u32, &'static str, usize),
        serialize_struct_variant(&'static str, u32, &'static str, usize),
    );
}

/// The compound serializers: each part is checked as a value, and `end`
/// leaves the containers its `serialize_*` entered (two for a variant:
/// `{"Variant": [...]}`).
macro_rules! compound {
    ($($trait:ident { $method:ident($($name:ty,)?) leave $containers:literal })*) => {$(
        impl ser::$trait for &mut Checker {
            type Ok = ();
            type Error = CheckError;
            fn $method<T: Serialize + ?Sized>(&mut self, $(_: $name,)? value: &T) -> Res {
                value.serialize(&mut **self)
            }
            fn end(self) -> Res {
                self.leave($containers);
                Ok(())
            }
        }
    )*};
}

compound! {
    SerializeSeq { serialize_element() leave 1 }
    SerializeTuple { serialize_element() leave 1 }
    SerializeTupleStruct { serialize_field() leave 1 }
    SerializeTupleVariant { serialize_field() leave 2 }
    SerializeStruct { serialize_field(&'static str,) leave 1 }
    SerializeStructVariant { serialize_field(&'static str,) leave 2 }
}

impl ser::SerializeMap for &mut Checker {
    type Ok = ();
    type Error = CheckError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Res {
        key.serialize(&mut **self)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Res {
        value.serialize(&mut **self)
    }
    fn end(self) -> Res {
        self.leave(1);
        Ok(())
    }
}

/// `1` inside `depth` arrays: a request exactly as deep as a test needs.
#[cfg(test)]
pub(super) fn nested(depth: usize) -> serde_json::Value {
    let mut v = serde_json::json!(1);
    for _ in 0..depth {
        v = serde_json::json!([v]);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_limit_is_what_serde_json_reads_back() {
        let ok = serde_json::to_vec(&nested(MAX_DEPTH)).unwrap();
        assert!(serde_json::from_slice::<Value>(&ok).is_ok());
        let too_deep = serde_json::to_vec(&nested(MAX_DEPTH + 1)).unwrap();
        assert!(serde_json::from_slice::<Value>(&too_deep).is_err());
        assert!(to_vec_checked(&nested(MAX_DEPTH)).is_ok());
        assert_eq!(check(&nested(MAX_DEPTH + 1)), Err(CheckError::TooDeep));
        assert_eq!(check(&nested(500)), Err(CheckError::TooDeep));
    }

    #[test]
    fn non_finite_floats_are_refused_wherever_they_sit() {
        #[derive(serde::Serialize)]
        enum E {
            V { x: f32 },
        }
        assert_eq!(check(&f64::NAN), Err(CheckError::NonFinite));
        assert_eq!(check(&vec![1.0, f64::INFINITY]), Err(CheckError::NonFinite));
        assert_eq!(check(&Some(f64::NEG_INFINITY)), Err(CheckError::NonFinite));
        assert_eq!(check(&E::V { x: f32::NAN }), Err(CheckError::NonFinite));
        assert!(check(&E::V { x: 1.5 }).is_ok());
        assert!(check(&(1.0_f64, f64::MAX, -0.0_f64)).is_ok());
    }

    #[test]
    fn variants_count_their_wrapping_object() {
        #[derive(serde::Serialize)]
        enum E {
            N(Value),
            T(u8, Value),
        }
        // `{"N": [[...]]}` is one level deeper than the value inside.
        assert!(check(&E::N(nested(MAX_DEPTH - 1))).is_ok());
        assert_eq!(check(&E::N(nested(MAX_DEPTH))), Err(CheckError::TooDeep));
        assert!(check(&E::T(1, nested(MAX_DEPTH - 2))).is_ok());
        assert_eq!(
            check(&E::T(1, nested(MAX_DEPTH - 1))),
            Err(CheckError::TooDeep)
        );
        let bytes = to_vec_checked(&E::N(nested(MAX_DEPTH - 1))).unwrap();
        assert!(serde_json::from_slice::<Value>(&bytes).is_ok());
    }
}
