//! The fingerprint's canonical bytes written straight from `Serialize`,
//! without building a `serde_json::Value` first.
//!
//! [`write`] produces exactly the bytes of
//! `fingerprint_bytes(&serde_json::to_value(request)?)`: RFC 8785 canonical
//! JSON (members sorted by the UTF-16 code units of their names, ECMAScript
//! numbers, minimal escapes), integers beyond 2^53 held exactly as their
//! digits. It also does the checks the `Value` path did before it: no
//! non-finite float, no nesting deeper than [`MAX_DEPTH`].
//!
//! Where serde_json's `to_value` would decide something this serializer
//! cannot reproduce for certain (a map key that is not a string, an `i128`
//! beyond 64 bits, serde_json's `arbitrary_precision` number or `RawValue`
//! tokens, an `f32` under `arbitrary_precision`), it gives up with
//! [`CanonError::Fallback`] and the caller takes the `Value` path: same bytes,
//! same errors, only slower.
//!
//! Object members are written in the order given, each one's span noted;
//! an object whose names are not already in strictly increasing UTF-16 order
//! (a derived struct, a `HashMap`) is rewritten sorted when it ends. Two
//! members with the same name keep the last one, as `to_value` does (a map
//! insertion replaces): a `Serialize` type that writes a name twice is
//! fingerprinted as before. (A [`RawJson`](crate::RawJson) body naming a
//! member twice is refused by its own parse.)

use std::cmp::Ordering;
use std::fmt;
use std::sync::OnceLock;

use serde::ser::{self, Serialize};

use crate::fingerprint::check::MAX_DEPTH;
use crate::fingerprint::value::{utf16_cmp_bytes, write_f64, write_string};

/// Largest magnitude below which every integer is exactly a double.
const EXACT_INT: u64 = 1 << 53;

/// Struct names serde_json gives special meaning in `to_value`
/// (`arbitrary_precision` numbers, `raw_value` raw values).
const SERDE_JSON_NUMBER_TOKEN: &str = "$serde_json::private::Number";
const SERDE_JSON_RAW_TOKEN: &str = "$serde_json::private::RawValue";

/// Why [`write`] stopped.
#[derive(Debug)]
pub(crate) enum CanonError {
    /// A NaN or infinite float.
    NonFinite,
    /// Nesting deeper than [`MAX_DEPTH`].
    TooDeep,
    /// Something only `serde_json::to_value` decides: take the `Value` path.
    Fallback,
    /// The value's own `Serialize` failed.
    Custom(String),
}

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NonFinite => f.write_str("a float is NaN or infinite"),
            Self::TooDeep => write!(f, "nests deeper than {MAX_DEPTH} arrays and objects"),
            Self::Fallback => f.write_str("needs serde_json's own conversion"),
            Self::Custom(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for CanonError {}

impl ser::Error for CanonError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self::Custom(msg.to_string())
    }
}

/// Buffers reused from call to call (per thread), so a fingerprint
/// allocates nothing once they have grown.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// The canonical bytes.
    pub(crate) out: Vec<u8>,
    /// The raw (unescaped) names of the members of the open objects that
    /// needed an escape (the others are read back from `out`).
    names: Vec<u8>,
    /// The members of the open objects.
    members: Vec<Member>,
}

impl Scratch {
    /// Buffers larger than this are not kept between calls.
    const KEEP: usize = 64 * 1024;

    fn clear(&mut self) {
        self.out.clear();
        self.names.clear();
        self.members.clear();
    }

    /// Drops buffers a large request grew, so a thread does not keep them.
    pub(crate) fn trim(&mut self) {
        if self.out.capacity() > Self::KEEP {
            self.out = Vec::new();
        }
        if self.names.capacity() > Self::KEEP {
            self.names = Vec::new();
        }
        if self.members.capacity() > Self::KEEP / std::mem::size_of::<Member>() {
            self.members = Vec::new();
        }
    }
}

/// One member of an open object: where its raw name is, its
/// `"name":value` span in `out`.
#[derive(Debug, Clone, Copy)]
struct Member {
    name: Name,
    span: (usize, usize),
}

/// Where a member's raw (unescaped) name is: between its quotes in `out`
/// when writing it needed no escape (the usual case, no copy), else in
/// `names`. (Positions in `out` stay valid: an object rewrites only its own
/// content, which comes after its own name.)
#[derive(Debug, Clone, Copy)]
enum Name {
    Out(usize, usize),
    Names(usize, usize),
}

impl Name {
    fn bytes<'a>(self, out: &'a [u8], names: &'a [u8]) -> &'a [u8] {
        match self {
            Self::Out(a, b) => &out[a..b],
            Self::Names(a, b) => &names[a..b],
        }
    }
}

/// Writes the fingerprint's canonical bytes of `value` into `scratch.out`;
/// returns whether an integer beyond 2^53 was written as exact digits.
pub(crate) fn write<T: Serialize + ?Sized>(
    value: &T,
    scratch: &mut Scratch,
) -> Result<bool, CanonError> {
    scratch.clear();
    let mut ser = Canon {
        scratch,
        depth: 0,
        wrote_exact: false,
    };
    value.serialize(&mut ser)?;
    Ok(ser.wrote_exact)
}

/// Whether serde_json turns an `f32` into a `Value` by its shortest decimal
/// (`arbitrary_precision`) rather than by widening it to `f64`: then `f32`
/// values take the `Value` path. Asked once per process.
fn f32_by_decimal() -> bool {
    static BY_DECIMAL: OnceLock<bool> = OnceLock::new();
    *BY_DECIMAL.get_or_init(|| {
        serde_json::to_value(0.1_f32)
            .ok()
            .and_then(|v| v.as_f64())
            .is_none_or(|f| f.to_bits() != f64::from(0.1_f32).to_bits())
    })
}

struct Canon<'s> {
    scratch: &'s mut Scratch,
    depth: usize,
    wrote_exact: bool,
}

type Res = Result<(), CanonError>;

impl Canon<'_> {
    fn enter(&mut self, containers: usize) -> Res {
        self.depth += containers;
        if self.depth > MAX_DEPTH {
            return Err(CanonError::TooDeep);
        }
        Ok(())
    }

    fn leave(&mut self, containers: usize) {
        self.depth -= containers;
    }

    fn out(&mut self) -> &mut Vec<u8> {
        &mut self.scratch.out
    }

    fn write_u64(&mut self, v: u64) {
        self.wrote_exact |= v > EXACT_INT;
        self.scratch
            .out
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }

    fn write_i64(&mut self, v: i64) {
        self.wrote_exact |= v.unsigned_abs() > EXACT_INT;
        self.scratch
            .out
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }

    /// Opens an object: `{`, and where its members start.
    fn open_object(&mut self) -> Result<Object, CanonError> {
        self.enter(1)?;
        self.scratch.out.push(b'{');
        Ok(Object {
            members: self.scratch.members.len(),
            names: self.scratch.names.len(),
            content: self.scratch.out.len(),
            next_start: 0,
            next_name: Name::Out(0, 0),
        })
    }

    /// Starts the next member of `obj`: the separator, then the name given
    /// by `key` (escaped in `out`, raw in `names`), then `:`.
    fn member_name<K: Serialize + ?Sized>(&mut self, obj: &mut Object, key: &K) -> Res {
        if self.scratch.members.len() > obj.members {
            self.scratch.out.push(b',');
        }
        obj.next_start = self.scratch.out.len();
        obj.next_name = key.serialize(KeySer {
            scratch: &mut *self.scratch,
        })?;
        self.scratch.out.push(b':');
        Ok(())
    }

    fn member_value<V: Serialize + ?Sized>(&mut self, obj: &Object, value: &V) -> Res {
        value.serialize(&mut *self)?;
        let end = self.scratch.out.len();
        self.scratch.members.push(Member {
            name: obj.next_name,
            span: (obj.next_start, end),
        });
        Ok(())
    }

    /// Closes an object: sorts its members if they were not written in
    /// order (keeping the last of equal names), then `}`.
    fn close_object(&mut self, obj: &Object) {
        let s = &mut *self.scratch;
        let members = &s.members[obj.members..];
        let (out, names) = (&s.out, &s.names);
        let name = |m: &Member| m.name.bytes(out, names);
        let in_order = members
            .windows(2)
            .all(|w| utf16_cmp_bytes(name(&w[0]), name(&w[1])) == Ordering::Less);
        if !in_order {
            let mut order: Vec<Member> = members.to_vec();
            // Stable: among equal names the last written stays last.
            order.sort_by(|a, b| utf16_cmp_bytes(name(a), name(b)));
            // A member followed by one of the same name was replaced by it.
            let kept: Vec<(usize, usize)> = order
                .iter()
                .enumerate()
                .filter(|&(i, m)| order.get(i + 1).is_none_or(|next| name(next) != name(m)))
                .map(|(_, m)| (m.span.0 - obj.content, m.span.1 - obj.content))
                .collect();
            let content = s.out[obj.content..].to_vec();
            s.out.truncate(obj.content);
            for (i, &(start, end)) in kept.iter().enumerate() {
                if i > 0 {
                    s.out.push(b',');
                }
                s.out.extend_from_slice(&content[start..end]);
            }
        }
        s.members.truncate(obj.members);
        s.names.truncate(obj.names);
        s.out.push(b'}');
        self.leave(1);
    }

    /// `{"variant":` for the enum forms serde_json wraps in an object.
    fn open_variant(&mut self, variant: &str) -> Res {
        self.enter(1)?;
        self.scratch.out.push(b'{');
        write_string(variant, &mut self.scratch.out);
        self.scratch.out.push(b':');
        Ok(())
    }

    fn close_variant(&mut self) {
        self.scratch.out.push(b'}');
        self.leave(1);
    }

    fn open_array(&mut self) -> Result<Array, CanonError> {
        self.enter(1)?;
        self.scratch.out.push(b'[');
        Ok(Array { first: true })
    }

    fn close_array(&mut self) {
        self.scratch.out.push(b']');
        self.leave(1);
    }

    fn element<V: Serialize + ?Sized>(&mut self, arr: &mut Array, value: &V) -> Res {
        if !arr.first {
            self.scratch.out.push(b',');
        }
        arr.first = false;
        value.serialize(&mut *self)
    }
}

/// An open object's bookkeeping.
struct Object {
    /// Index of its first member in `members`.
    members: usize,
    /// Start of its names in `names`.
    names: usize,
    /// Where its content starts in `out` (after `{`).
    content: usize,
    /// The member being written: where it starts, its raw name.
    next_start: usize,
    next_name: Name,
}

struct Array {
    first: bool,
}

/// The compound serializers: the writer and what is open.
struct Compound<'a, 's, S> {
    ser: &'a mut Canon<'s>,
    state: S,
    /// Whether it sits inside a `{"variant": ...}` wrapper to close.
    variant: bool,
}

impl<'s> Canon<'s> {
    /// Opens an array or an object (`open`), inside a `{"variant": ...}`
    /// wrapper first when `variant` names one.
    fn compound<'a, S>(
        &'a mut self,
        variant: Option<&str>,
        open: fn(&mut Self) -> Result<S, CanonError>,
    ) -> Result<Compound<'a, 's, S>, CanonError> {
        if let Some(name) = variant {
            self.open_variant(name)?;
        }
        let state = open(self)?;
        Ok(Compound {
            ser: self,
            state,
            variant: variant.is_some(),
        })
    }
}

/// The integer methods that widen to the 64-bit integer of their sign,
/// which is all JSON writes.
macro_rules! widen {
    ($write:ident: $($method:ident($ty:ty)),*) => {$(
        fn $method(self, v: $ty) -> Res {
            self.$write(v.into());
            Ok(())
        }
    )*};
}

impl<'a, 's> ser::Serializer for &'a mut Canon<'s> {
    type Ok = ();
    type Error = CanonError;
    type SerializeSeq = Compound<'a, 's, Array>;
    type SerializeTuple = Compound<'a, 's, Array>;
    type SerializeTupleStruct = Compound<'a, 's, Array>;
    type SerializeTupleVariant = Compound<'a, 's, Array>;
    type SerializeMap = Compound<'a, 's, Object>;
    type SerializeStruct = Compound<'a, 's, Object>;
    type SerializeStructVariant = Compound<'a, 's, Object>;

    fn serialize_bool(self, v: bool) -> Res {
        self.out()
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    widen!(write_i64: serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64));
    fn serialize_i128(self, v: i128) -> Res {
        if let Ok(u) = u64::try_from(v) {
            self.write_u64(u);
        } else if let Ok(i) = i64::try_from(v) {
            self.write_i64(i);
        } else {
            return Err(CanonError::Fallback);
        }
        Ok(())
    }
    widen!(write_u64: serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64));
    fn serialize_u128(self, v: u128) -> Res {
        let u = u64::try_from(v).map_err(|_| CanonError::Fallback)?;
        self.write_u64(u);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Res {
        if !v.is_finite() {
            return Err(CanonError::NonFinite);
        }
        if f32_by_decimal() {
            return Err(CanonError::Fallback);
        }
        write_f64(f64::from(v), self.out());
        Ok(())
    }
    fn serialize_f64(self, v: f64) -> Res {
        if !v.is_finite() {
            return Err(CanonError::NonFinite);
        }
        write_f64(v, self.out());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Res {
        write_string(v.encode_utf8(&mut [0; 4]), self.out());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Res {
        write_string(v, self.out());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Res {
        // serde_json: an array of numbers.
        let mut arr = self.open_array()?;
        for &b in v {
            if !arr.first {
                self.out().push(b',');
            }
            arr.first = false;
            self.write_u64(b.into());
        }
        self.close_array();
        Ok(())
    }
    fn serialize_none(self) -> Res {
        self.out().extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Res {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Res {
        self.out().extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Res {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Res {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Res {
        // RawJson included: its content parses to a `Value`, serialized here
        // at the current depth.
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Res {
        self.open_variant(variant)?;
        value.serialize(&mut *self)?;
        self.close_variant();
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, CanonError> {
        self.compound(None, Canon::open_array)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, CanonError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, CanonError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, CanonError> {
        self.compound(Some(variant), Canon::open_array)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, CanonError> {
        self.compound(None, Canon::open_object)
    }
    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, CanonError> {
        if name == SERDE_JSON_NUMBER_TOKEN || name == SERDE_JSON_RAW_TOKEN {
            return Err(CanonError::Fallback);
        }
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, CanonError> {
        self.compound(Some(variant), Canon::open_object)
    }
}

impl Compound<'_, '_, Array> {
    fn end_array(self) -> Res {
        self.ser.close_array();
        if self.variant {
            self.ser.close_variant();
        }
        Ok(())
    }
}

impl Compound<'_, '_, Object> {
    fn end_object(self) -> Res {
        self.ser.close_object(&self.state);
        if self.variant {
            self.ser.close_variant();
        }
        Ok(())
    }
}

/// The array-like compounds: each part is one element.
macro_rules! array_compound {
    ($($trait:ident::$method:ident),*) => {$(
        impl ser::$trait for Compound<'_, '_, Array> {
            type Ok = ();
            type Error = CanonError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Res {
                self.ser.element(&mut self.state, value)
            }
            fn end(self) -> Res {
                self.end_array()
            }
        }
    )*};
}

array_compound!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for Compound<'_, '_, Object> {
    type Ok = ();
    type Error = CanonError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Res {
        self.ser.member_name(&mut self.state, key)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Res {
        self.ser.member_value(&self.state, value)
    }
    fn end(self) -> Res {
        self.end_object()
    }
}

/// The struct-like compounds: each field is a member, named by the field.
macro_rules! struct_compound {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Compound<'_, '_, Object> {
            type Ok = ();
            type Error = CanonError;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Res {
                self.ser.member_name(&mut self.state, key)?;
                self.ser.member_value(&self.state, value)
            }
            fn end(self) -> Res {
                self.end_object()
            }
        }
    )*};
}

struct_compound!(SerializeStruct, SerializeStructVariant);

/// A member name: a string (or a char, or a unit variant's name), written
/// escaped to `out` and raw to `names`. Any other key (a number, a bool)
/// is turned into a name by serde_json's own rules: [`CanonError::Fallback`].
struct KeySer<'a> {
    scratch: &'a mut Scratch,
}

impl KeySer<'_> {
    fn name(self, name: &str) -> KeyRes {
        let out = &mut self.scratch.out;
        let start = out.len();
        write_string(name, out);
        if out.len() == start + name.len() + 2 {
            // Written as itself: read it back from `out`.
            return Ok(Name::Out(start + 1, out.len() - 1));
        }
        let names = &mut self.scratch.names;
        let at = names.len();
        names.extend_from_slice(name.as_bytes());
        Ok(Name::Names(at, names.len()))
    }
}

type KeyRes = Result<Name, CanonError>;

fn fallback<T>() -> Result<T, CanonError> {
    Err(CanonError::Fallback)
}

impl ser::Serializer for KeySer<'_> {
    type Ok = Name;
    type Error = CanonError;
    type SerializeSeq = ser::Impossible<Name, CanonError>;
    type SerializeTuple = ser::Impossible<Name, CanonError>;
    type SerializeTupleStruct = ser::Impossible<Name, CanonError>;
    type SerializeTupleVariant = ser::Impossible<Name, CanonError>;
    type SerializeMap = ser::Impossible<Name, CanonError>;
    type SerializeStruct = ser::Impossible<Name, CanonError>;
    type SerializeStructVariant = ser::Impossible<Name, CanonError>;

    fn serialize_str(self, v: &str) -> KeyRes {
        self.name(v)
    }
    fn serialize_char(self, v: char) -> KeyRes {
        self.name(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> KeyRes {
        self.name(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> KeyRes {
        value.serialize(self)
    }
    answer!(self => KeyRes = fallback();
        serialize_bool(bool), serialize_f32(f32), serialize_f64(f64), serialize_bytes(&[u8]),
        serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64),
        serialize_i128(i128), serialize_u8(u8), serialize_u16(u16), serialize_u32(u32),
        serialize_u64(u64), serialize_u128(u128), serialize_none(), serialize_unit(),
        serialize_unit_struct(&'static str),
    );
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> KeyRes {
        fallback()
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> KeyRes {
        fallback()
    }
    answer!(self => Result<ser::Impossible<Name, CanonError>, CanonError> = fallback();
        serialize_seq(Option<usize>), serialize_tuple(usize),
        serialize_tuple_struct(&'static str, usize), serialize_map(Option<usize>),
        serialize_struct(&'static str, usize),
        serialize_tuple_variant(&'static str, u32, &'static str, usize),
        serialize_struct_variant(&'static str, u32, &'static str, usize),
    );
}

#[cfg(test)]
mod tests {
    //! The direct path against the `Value` path (the definition, and what
    //! every stored fingerprint was made with) on requests of every shape.

    use std::collections::{BTreeMap, HashMap};

    use serde::ser::{SerializeMap, Serializer};
    use serde_json::{Value, json};

    use crate::adapter::fingerprint;
    use crate::error::RequestError;
    use crate::fingerprint::check::nested;
    use crate::fingerprint::fingerprint_via_value;
    use crate::{FieldFilter, RawJson};

    /// Same fingerprint, or the same kind of error, both ways.
    fn same<R: Serialize + ?Sized + fmt::Debug>(request: &R) {
        let direct = fingerprint("POST /x", request, &FieldFilter::All);
        let via_value = fingerprint_via_value("POST /x", request, &FieldFilter::All);
        match (&direct, &via_value) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{request:?}"),
            (Err(a), Err(b)) => assert_eq!(
                std::mem::discriminant(a),
                std::mem::discriminant(b),
                "{request:?}: {a} / {b}"
            ),
            _ => panic!("{request:?}: {direct:?} / {via_value:?}"),
        }
    }

    use super::*;

    /// [`same`], and the direct path really ran (no fallback).
    fn same_direct<R: Serialize + ?Sized + fmt::Debug>(request: &R) {
        same(request);
        assert!(
            !matches!(
                write(request, &mut Scratch::default()),
                Err(CanonError::Fallback)
            ),
            "{request:?} fell back"
        );
    }

    /// [`same`], through the fallback.
    fn same_fallback<R: Serialize + ?Sized + fmt::Debug>(request: &R) {
        same(request);
        assert!(
            matches!(
                write(request, &mut Scratch::default()),
                Err(CanonError::Fallback)
            ),
            "{request:?} did not fall back"
        );
    }

    #[derive(Debug, serde::Serialize)]
    struct Payment {
        zeta: u32,
        amount: u64,
        currency: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        tags: Vec<&'static str>,
        nested: Inner,
        #[serde(rename = "\u{fb33}")]
        hebrew: bool,
        #[serde(rename = "\u{1f600}")]
        emoji: bool,
        #[serde(rename = "\n")]
        newline: i8,
    }

    #[derive(Debug, serde::Serialize)]
    struct Inner {
        b: f64,
        a: f32,
        bytes: serde_bytes_like::Bytes,
        c: char,
        unit: (),
        tuple: (u8, i16, &'static str),
    }

    mod serde_bytes_like {
        /// Serialized with `serialize_bytes`.
        #[derive(Debug)]
        pub(super) struct Bytes(pub(super) Vec<u8>);
        impl serde::Serialize for Bytes {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0)
            }
        }
    }

    #[derive(Debug, serde::Serialize)]
    enum Kind {
        Unit,
        Newtype(i64),
        Tuple(u8, String),
        Struct { y: u8, x: Option<u8> },
    }

    #[derive(Debug, serde::Serialize)]
    struct Wrapper(Value);

    #[derive(Debug, serde::Serialize)]
    struct UnitStruct;

    #[derive(Debug, serde::Serialize)]
    struct Flat {
        b: u8,
        #[serde(flatten)]
        extra: BTreeMap<String, u8>,
    }

    /// A map that writes a name twice: `to_value` keeps the last.
    #[derive(Debug)]
    struct Twice(Vec<(&'static str, Value)>);
    impl Serialize for Twice {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(None)?;
            for (k, v) in &self.0 {
                m.serialize_entry(k, v)?;
            }
            m.end()
        }
    }

    /// A `Serialize` that fails.
    #[derive(Debug)]
    struct Fails;
    impl Serialize for Fails {
        fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(ser::Error::custom("no"))
        }
    }

    #[test]
    fn typed_requests_match_the_value_path() {
        let p = Payment {
            zeta: 7,
            amount: 9_007_199_254_740_993,
            currency: "eur",
            note: None,
            tags: vec!["b", "a", "\u{e000}", "\u{10000}"],
            nested: Inner {
                b: 1e21,
                a: 0.1,
                bytes: serde_bytes_like::Bytes(vec![0, 255, 7]),
                c: '\u{1f600}',
                unit: (),
                tuple: (1, -2, "t\"q"),
            },
            hebrew: true,
            emoji: false,
            newline: -3,
        };
        same_direct(&p);
        same_direct(&Payment {
            amount: 1,
            note: Some("n\u{0}\u{1f}\\".to_owned()),
            ..p
        });
        for k in [
            Kind::Unit,
            Kind::Newtype(i64::MIN),
            Kind::Tuple(3, "s".to_owned()),
            Kind::Struct { y: 1, x: None },
            Kind::Struct { y: 1, x: Some(2) },
        ] {
            same_direct(&k);
            same_direct(&vec![k]);
        }
        same_direct(&UnitStruct);
        same_direct(&Wrapper(json!({"z": 1, "a": [1.5, -0.0, 1e-7]})));
        same_direct(&Flat {
            b: 1,
            extra: [("a".to_owned(), 2), ("c".to_owned(), 3)].into(),
        });
        same_direct(&Flat {
            b: 1,
            extra: [("b".to_owned(), 2)].into(), // a name written twice
        });
        same_direct(&Twice(vec![
            ("b", json!(1)),
            ("a", json!(2)),
            ("b", json!(3)),
        ]));
        same_direct(&Twice(vec![("a", json!(1)), ("a", json!(2))]));
        same_direct(&Twice(vec![
            ("\u{fb33}", json!(1)),
            ("\u{1f600}", json!(2)),
            ("\u{fb33}", json!({"y": 1, "x": 2})),
        ]));
        let hm: HashMap<String, Vec<u64>> = (0..40)
            .map(|i| (format!("k{i}"), vec![i, u64::MAX - i]))
            .collect();
        same_direct(&hm);
        same_direct(&(1_u128, -1_i128, u128::from(u64::MAX), i128::from(i64::MIN)));
        same_direct(&"just a string");
        same_direct(&42_u8);
        same_direct(&-0.0_f64);
        same_direct(&Some(f32::MAX));
        same_direct(&[0.1_f32, 1.0e-10, 3.4e38]);
        same_direct(&json!({}));
        same_direct(&json!([]));
        same_direct(&Vec::<u8>::new());
        same_direct(&vec![json!(1), json!(u64::MAX)]);
    }

    #[test]
    fn fallbacks_match_the_value_path() {
        // Map keys that are not strings: serde_json's own spelling.
        let ints: BTreeMap<i32, u8> = [(-1, 1), (10, 2), (2, 3)].into();
        same_fallback(&ints);
        let bools: BTreeMap<bool, u8> = [(true, 1), (false, 2)].into();
        same_fallback(&bools);
        let units: BTreeMap<(), u8> = [((), 1)].into();
        same_fallback(&units);
        // Beyond 64 bits: serde_json refuses (without arbitrary_precision).
        same_fallback(&u128::MAX);
        same_fallback(&i128::MIN);
    }

    #[test]
    fn errors_match_the_value_path() {
        same(&f64::NAN);
        same(&vec![1.0, f64::INFINITY]);
        same(&Some(f32::NEG_INFINITY));
        same(&Fails);
        same(&vec![Fails]);
        same(&nested(MAX_DEPTH));
        same(&nested(MAX_DEPTH + 1));
        same(&Kind::Newtype(1));
        // RawJson: parsed, nested inside other values, refused when invalid.
        same(&RawJson(br#"{"b":2,"a":[1,{"d":1,"c":2}]}"#));
        same(&json!({"x": 1}));
        let raw = RawJson(br#"{"a":1,"a":2}"#);
        assert!(matches!(
            fingerprint("op", &raw, &FieldFilter::All),
            Err(RequestError::DuplicateMember)
        ));
        same(&raw);
        same(&RawJson(b"{nope"));
        same(&vec![RawJson(b"[1]"), RawJson(b"{\"z\":0,\"y\":[]}")]);
        let deep = "[".repeat(100) + &"]".repeat(100);
        let mut outer = json!(null);
        for _ in 0..30 {
            outer = json!([outer]);
        }
        // 30 levels around a RawJson of 100: fine alone, too deep together.
        struct Around<'a>(usize, RawJson<'a>);
        impl fmt::Debug for Around<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "Around({})", self.0)
            }
        }
        impl Serialize for Around<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if self.0 == 0 {
                    return self.1.serialize(s);
                }
                [Around(self.0 - 1, self.1)].serialize(s)
            }
        }
        let raw = RawJson(deep.as_bytes());
        same(&Around(27, raw));
        same(&Around(28, raw));
        assert!(fingerprint("op", &Around(27, raw), &FieldFilter::All).is_ok());
        assert!(matches!(
            fingerprint("op", &Around(28, raw), &FieldFilter::All),
            Err(RequestError::TooDeep)
        ));
    }

    #[test]
    fn reentrant_serialize_gets_its_own_buffers() {
        struct Inside;
        impl Serialize for Inside {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let fp = fingerprint("inner", &json!({"b": 1, "a": 2}), &FieldFilter::All)
                    .map_err(ser::Error::custom)?;
                s.serialize_str(&fp.to_hex())
            }
        }
        impl fmt::Debug for Inside {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("Inside")
            }
        }
        same(&json!({"z": [1, 2]}));
        same(&(Inside, json!({"y": 1, "x": 2})));
    }
}
