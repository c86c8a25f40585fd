//! The decoded, canonical fingerprint
//! ([`canonical_fingerprint`](crate::GrpcIdempotencyLayerBuilder::canonical_fingerprint)):
//! a request message decoded by its method's input descriptor and written
//! as protobuf's JSON mapping, which the engine fingerprints (RFC 8785), so
//! that two encodings of one message are one request.

use std::collections::HashMap;

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, SerializeOptions};
use prost_types::FileDescriptorSet;

use crate::descriptor::{DescriptorSetError, method_path};
use crate::layer::GrpcConfigError;

/// The input message type of every unary method a descriptor set
/// describes, by full method path.
pub(crate) type Inputs = HashMap<String, MessageDescriptor>;

/// Decodes an encoded `FileDescriptorSet`, resolves its types and maps its
/// unary methods to their input types.
///
/// # Errors
///
/// [`GrpcConfigError::DescriptorSet`] for bytes that do not decode or a set
/// whose types do not resolve (a method's input type missing),
/// [`GrpcConfigError::MethodPath`] for a service or method without a usable
/// name, [`GrpcConfigError::NoUnaryMethod`] when no method is unary.
pub(crate) fn inputs(descriptor_set: &[u8]) -> Result<Inputs, GrpcConfigError> {
    let set = FileDescriptorSet::decode(descriptor_set)
        .map_err(|e| GrpcConfigError::DescriptorSet(DescriptorSetError::decode(e)))?;
    let pool = DescriptorPool::from_file_descriptor_set(set)
        .map_err(|e| GrpcConfigError::DescriptorSet(DescriptorSetError::resolve(&e)))?;
    let mut out = Inputs::new();
    for service in pool.services() {
        for method in service.methods() {
            if method.is_client_streaming() || method.is_server_streaming() {
                continue;
            }
            let path = method_path(service.package_name(), service.name(), method.name())?;
            out.insert(path, method.input());
        }
    }
    if out.is_empty() {
        return Err(GrpcConfigError::NoUnaryMethod);
    }
    Ok(out)
}

/// What is fingerprinted under the canonical option: the input type's full
/// name and the message in protobuf's JSON mapping. Its members differ from
/// the bytes envelope's, so the two forms never match each other.
#[derive(serde::Serialize)]
pub(crate) struct Canonical<'a> {
    v: u8,
    message_type: &'a str,
    message: serde_json::Value,
}

/// Why a request message has no canonical form.
pub(crate) enum NotCanonical {
    /// The bytes do not decode as the input type: the request is refused.
    Undecodable(prost::DecodeError),
    /// The message decodes but has no JSON form with these descriptors (a
    /// `google.protobuf.Any` whose type the set does not hold): the bytes
    /// as sent are fingerprinted instead.
    NoJson,
}

/// The canonical form of `message`, an encoded `input`.
///
/// The JSON options, fixed (a change would turn every retry across it
/// into a mismatch): 64-bit integers as strings (exact, and the same digits
/// whatever their encoding), fields equal to their default left out (an
/// explicit `0` and an absent field are one message), enums by number (a
/// value renamed in the schema keeps its fingerprint), fields by their
/// `.proto` name (not a `json_name` option). Unknown fields (numbers the
/// descriptor does not name) are dropped, as the JSON mapping does: the
/// handler, built on the same schema, does not read them either. Map
/// entries and repeated fields keep protobuf's meaning (a map is an object,
/// its order irrelevant; a list keeps its order).
pub(crate) fn canonical<'a>(
    input: &'a MessageDescriptor,
    message: &[u8],
) -> Result<Canonical<'a>, NotCanonical> {
    let decoded =
        DynamicMessage::decode(input.clone(), message).map_err(NotCanonical::Undecodable)?;
    let options = SerializeOptions::new()
        .stringify_64_bit_integers(true)
        .skip_default_fields(true)
        .use_enum_numbers(true)
        .use_proto_field_name(true);
    let json = decoded
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|_| NotCanonical::NoJson)?;
    Ok(Canonical {
        v: 1,
        message_type: input.full_name(),
        message: json,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use prost_types::field_descriptor_proto::{Label, Type};
    use prost_types::{
        DescriptorProto, FieldDescriptorProto, FileDescriptorProto, MethodDescriptorProto,
        ServiceDescriptorProto,
    };

    use super::*;

    fn field(name: &str, number: i32, ty: Type) -> FieldDescriptorProto {
        FieldDescriptorProto {
            name: Some(name.to_owned()),
            number: Some(number),
            label: Some(Label::Optional as i32),
            r#type: Some(ty as i32),
            ..FieldDescriptorProto::default()
        }
    }

    fn set(input_type: &str) -> Vec<u8> {
        FileDescriptorSet {
            file: vec![FileDescriptorProto {
                name: Some("p.proto".to_owned()),
                package: Some("p".to_owned()),
                syntax: Some("proto3".to_owned()),
                message_type: vec![DescriptorProto {
                    name: Some("Req".to_owned()),
                    field: vec![
                        field("name", 1, Type::String),
                        field("amount", 2, Type::Int64),
                    ],
                    ..DescriptorProto::default()
                }],
                service: vec![ServiceDescriptorProto {
                    name: Some("S".to_owned()),
                    method: vec![MethodDescriptorProto {
                        name: Some("Create".to_owned()),
                        input_type: Some(input_type.to_owned()),
                        output_type: Some(".p.Req".to_owned()),
                        ..MethodDescriptorProto::default()
                    }],
                    ..ServiceDescriptorProto::default()
                }],
                ..FileDescriptorProto::default()
            }],
        }
        .encode_to_vec()
    }

    fn json(bytes: &[u8]) -> serde_json::Value {
        let inputs = inputs(&set(".p.Req")).unwrap();
        let Ok(c) = canonical(&inputs["/p.S/Create"], bytes) else {
            panic!("not canonical");
        };
        assert_eq!(c.message_type, "p.Req");
        c.message
    }

    #[test]
    fn order_defaults_and_unknown_fields_do_not_count() {
        // name = "a", amount = 7.
        let plain = json(b"\x0a\x01a\x10\x07");
        assert_eq!(plain, serde_json::json!({"name": "a", "amount": "7"}));
        // amount first, an explicit empty name before "a" (last one wins),
        // an unknown field 9.
        assert_eq!(json(b"\x10\x07\x0a\x00\x0a\x01a\x48\x01"), plain);
        // An explicit default is no field.
        assert_eq!(json(b"\x10\x00"), serde_json::json!({}));
    }

    #[test]
    fn bytes_that_are_not_the_message_do_not_decode() {
        let inputs = inputs(&set(".p.Req")).unwrap();
        // A length-delimited field longer than the bytes.
        assert!(matches!(
            canonical(&inputs["/p.S/Create"], b"\x0a\x05a"),
            Err(NotCanonical::Undecodable(_))
        ));
    }

    #[test]
    fn an_input_type_the_set_does_not_hold_is_a_build_error() {
        let err = inputs(&set(".p.Missing")).unwrap_err();
        assert!(matches!(err, GrpcConfigError::DescriptorSet(_)), "{err:?}");
        assert!(matches!(
            inputs(&[0x0f]),
            Err(GrpcConfigError::DescriptorSet(_))
        ));
        assert_eq!(inputs(&[]).unwrap_err(), GrpcConfigError::NoUnaryMethod);
    }
}
