//! Which methods of a protobuf `FileDescriptorSet` are unary: the schema a
//! tower layer needs to cover "every unary method", since a request alone
//! does not say whether its method streams.

use std::collections::HashSet;

use prost::Message;
use prost_types::{FileDescriptorSet, MethodDescriptorProto};

use crate::layer::GrpcConfigError;

/// Why bytes given to
/// [`unary_methods_of`](crate::GrpcIdempotencyLayerBuilder::unary_methods_of)
/// or
/// [`canonical_fingerprint`](crate::GrpcIdempotencyLayerBuilder::canonical_fingerprint)
/// are not a usable `google.protobuf.FileDescriptorSet`: protobuf's
/// decoding error, or (`canonical_fingerprint`) why its types do not
/// resolve, as its message (the decoders' types are not part of this
/// crate's API).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DescriptorSetError(Cause);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Cause {
    /// The bytes do not decode.
    #[error("{0}")]
    Decode(prost::DecodeError),
    /// The set decodes but names a type it does not hold (or holds one
    /// twice): prost-reflect's words.
    #[error("{0}")]
    Resolve(String),
}

impl DescriptorSetError {
    pub(crate) fn decode(e: prost::DecodeError) -> Self {
        Self(Cause::Decode(e))
    }

    pub(crate) fn resolve(e: &prost_reflect::DescriptorError) -> Self {
        Self(Cause::Resolve(e.to_string()))
    }
}

/// The full paths of the methods a descriptor set describes, split by kind.
#[derive(Debug, Clone, Default)]
pub(crate) struct Described {
    /// Neither client- nor server-streaming.
    pub(crate) unary: HashSet<String>,
    /// Client-, server- or bidirectional streaming.
    pub(crate) streaming: HashSet<String>,
}

impl Described {
    /// Adds `other`'s methods to these.
    pub(crate) fn extend(&mut self, other: Self) {
        self.unary.extend(other.unary);
        self.streaming.extend(other.streaming);
    }
}

/// Decodes an encoded `FileDescriptorSet` and sorts its services' methods.
///
/// # Errors
///
/// [`GrpcConfigError::DescriptorSet`] for bytes that do not decode,
/// [`GrpcConfigError::MethodPath`] for a service or method without a usable
/// name, [`GrpcConfigError::NoUnaryMethod`] when no method is unary.
pub(crate) fn describe(descriptor_set: &[u8]) -> Result<Described, GrpcConfigError> {
    let set = FileDescriptorSet::decode(descriptor_set)
        .map_err(|e| GrpcConfigError::DescriptorSet(DescriptorSetError::decode(e)))?;
    let mut out = Described::default();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                let path = method_path(file.package(), service.name(), method.name())?;
                if is_unary(method) {
                    out.unary.insert(path);
                } else {
                    out.streaming.insert(path);
                }
            }
        }
    }
    if out.unary.is_empty() {
        return Err(GrpcConfigError::NoUnaryMethod);
    }
    Ok(out)
}

fn is_unary(method: &MethodDescriptorProto) -> bool {
    !method.client_streaming() && !method.server_streaming()
}

/// `/{package}.{service}/{method}`, or `/{service}/{method}` without a
/// package: the path gRPC sends a call to.
pub(crate) fn method_path(
    package: &str,
    service: &str,
    method: &str,
) -> Result<String, GrpcConfigError> {
    let path = if package.is_empty() {
        format!("/{service}/{method}")
    } else {
        format!("/{package}.{service}/{method}")
    };
    if service.is_empty() || !crate::layer::is_method_path(&path) {
        return Err(GrpcConfigError::MethodPath(path));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use prost_types::{FileDescriptorProto, ServiceDescriptorProto};

    use super::*;

    fn method(name: &str, client: bool, server: bool) -> MethodDescriptorProto {
        MethodDescriptorProto {
            name: Some(name.to_owned()),
            input_type: Some(".p.Req".to_owned()),
            output_type: Some(".p.Resp".to_owned()),
            client_streaming: Some(client),
            server_streaming: Some(server),
            ..MethodDescriptorProto::default()
        }
    }

    fn file(package: Option<&str>, service: &str, methods: Vec<MethodDescriptorProto>) -> Vec<u8> {
        FileDescriptorSet {
            file: vec![FileDescriptorProto {
                name: Some("f.proto".to_owned()),
                package: package.map(str::to_owned),
                service: vec![ServiceDescriptorProto {
                    name: Some(service.to_owned()),
                    method: methods,
                    ..ServiceDescriptorProto::default()
                }],
                ..FileDescriptorProto::default()
            }],
        }
        .encode_to_vec()
    }

    fn sorted(s: &HashSet<String>) -> Vec<&str> {
        let mut v: Vec<&str> = s.iter().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn paths_with_and_without_a_package() {
        assert_eq!(
            method_path("shop.v1", "Orders", "Create").unwrap(),
            "/shop.v1.Orders/Create"
        );
        assert_eq!(
            method_path("", "Orders", "Create").unwrap(),
            "/Orders/Create"
        );
    }

    #[test]
    fn a_nameless_service_or_method_is_a_method_path_error() {
        for (package, service, method, path) in [
            ("p", "", "Create", "/p./Create"),
            ("", "", "Create", "//Create"),
            ("p", "Orders", "", "/p.Orders/"),
            ("p", "Or/ders", "Create", "/p.Or/ders/Create"),
        ] {
            assert_eq!(
                method_path(package, service, method),
                Err(GrpcConfigError::MethodPath(path.to_owned()))
            );
        }
    }

    #[test]
    fn every_kind_of_streaming_is_set_apart() {
        let bytes = file(
            Some("shop.v1"),
            "Orders",
            vec![
                method("Create", false, false),
                method("Get", false, false),
                method("Watch", false, true),
                method("Upload", true, false),
                method("Chat", true, true),
            ],
        );
        let d = describe(&bytes).unwrap();
        assert_eq!(
            sorted(&d.unary),
            ["/shop.v1.Orders/Create", "/shop.v1.Orders/Get"]
        );
        assert_eq!(
            sorted(&d.streaming),
            [
                "/shop.v1.Orders/Chat",
                "/shop.v1.Orders/Upload",
                "/shop.v1.Orders/Watch"
            ]
        );
    }

    #[test]
    fn unset_streaming_flags_are_unary() {
        let mut m = method("Create", false, false);
        m.client_streaming = None;
        m.server_streaming = None;
        let d = describe(&file(None, "Orders", vec![m])).unwrap();
        assert_eq!(sorted(&d.unary), ["/Orders/Create"]);
    }

    #[test]
    fn bytes_that_do_not_decode_are_a_typed_error() {
        // A length-delimited field (file, tag 1) longer than the input.
        let err = describe(&[0x0a, 0x05, 0x01]).unwrap_err();
        let GrpcConfigError::DescriptorSet(source) = &err else {
            panic!("{err:?}");
        };
        assert!(!source.to_string().is_empty());
        assert!(std::error::Error::source(&err).is_some());
        // A wire type that does not exist (7).
        assert!(matches!(
            describe(&[0x0f]),
            Err(GrpcConfigError::DescriptorSet(_))
        ));
    }

    #[test]
    fn a_set_without_a_unary_method_is_an_error() {
        assert_eq!(describe(&[]).unwrap_err(), GrpcConfigError::NoUnaryMethod);
        let only_streaming = file(Some("p"), "S", vec![method("Watch", false, true)]);
        assert_eq!(
            describe(&only_streaming).unwrap_err(),
            GrpcConfigError::NoUnaryMethod
        );
    }
}
