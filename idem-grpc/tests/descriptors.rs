//! `unary_methods_of`: the layer covers exactly the unary methods of the
//! services an encoded `FileDescriptorSet` describes (one file with a
//! package, one without), over a real tonic server and client; streaming
//! methods and the methods it does not describe pass untouched. And the
//! builder's errors for a set that does not decode or covers nothing.
//! `canonical_fingerprint`: two encodings of one request are one request,
//! a message that does not decode is refused before its handler.

#![allow(missing_docs, clippy::unwrap_used, unreachable_pub, dead_code)]

#[path = "suite/app.rs"]
mod app;

use std::sync::Arc;

use app::{App, BARE, BY_FIELD, CREATE, Client, Meta, OPEN, Options, TestBuilder, req, with};
use idem_core::{Idem, IdempotencyKey, MemoryStore};
use idem_grpc::{FixedOwner, GrpcConfigError, GrpcIdempotencyLayer};
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet,
    MethodDescriptorProto, ServiceDescriptorProto,
};
use tonic::metadata::MetadataMap;
use tonic_types::StatusExt;

fn method(name: &str, server_streaming: bool) -> MethodDescriptorProto {
    MethodDescriptorProto {
        name: Some(name.to_owned()),
        input_type: Some(".idem.test.v1.Req".to_owned()),
        output_type: Some(".idem.test.v1.Resp".to_owned()),
        client_streaming: Some(false),
        server_streaming: Some(server_streaming),
        ..MethodDescriptorProto::default()
    }
}

fn file(name: &str, package: Option<&str>, service: ServiceDescriptorProto) -> FileDescriptorProto {
    FileDescriptorProto {
        name: Some(name.to_owned()),
        package: package.map(str::to_owned),
        service: vec![service],
        ..FileDescriptorProto::default()
    }
}

fn service(name: &str, methods: Vec<MethodDescriptorProto>) -> ServiceDescriptorProto {
    ServiceDescriptorProto {
        name: Some(name.to_owned()),
        method: methods,
        ..ServiceDescriptorProto::default()
    }
}

/// `Svc` in package `idem.test.v1`: `Create` (unary) and `Watch` (server
/// streaming), no message types.
fn svc_file() -> FileDescriptorProto {
    file(
        "idem/test/v1/svc.proto",
        Some("idem.test.v1"),
        service("Svc", vec![method("Create", false), method("Watch", true)]),
    )
}

/// The test server's schema, as tonic-build would write it: `Svc` in
/// package `idem.test.v1` with `Create` (unary) and `Watch` (server
/// streaming), and `Bare` without a package with `Create` (unary). `Open`
/// and `CreateByField` are served but not described.
fn descriptors() -> Vec<u8> {
    FileDescriptorSet {
        file: vec![
            svc_file(),
            file(
                "bare.proto",
                None,
                service("Bare", vec![method("Create", false)]),
            ),
        ],
    }
    .encode_to_vec()
}

fn key() -> String {
    IdempotencyKey::random().as_str().to_owned()
}

fn replayed(m: &MetadataMap) -> bool {
    m.get("idempotent-replayed").is_some()
}

async fn start(
    cover: impl FnOnce(TestBuilder<MemoryStore>) -> TestBuilder<MemoryStore>,
) -> App<MemoryStore> {
    App::covering(Arc::new(MemoryStore::new()), Options::default(), cover).await
}

/// Calls `path` twice with one key: the first runs, the second is its
/// replay (same message, marked), one execution more in all.
async fn assert_covered(app: &App<MemoryStore>, c: &Client, path: &'static str) {
    let before = app.counts.executions();
    let m = with("a1", &key());
    let first = c.call(path, req(100), &m).await.expect("first");
    assert!(
        !replayed(first.metadata()),
        "{path}: a first call is no replay"
    );
    let again = c.call(path, req(100), &m).await.expect("again");
    assert!(replayed(again.metadata()), "{path}: the retry is a replay");
    assert_eq!(again.get_ref(), first.get_ref(), "{path}");
    assert_eq!(app.counts.executions(), before + 1, "{path} ran once");
}

/// Calls `Watch` twice with one key: both run, all three messages each,
/// no marker anywhere.
async fn assert_watch_passes(app: &App<MemoryStore>, c: &Client) {
    let before = app.counts.executions();
    let m = with("a1", &key());
    for _ in 0..2 {
        let (initial, items, trailers) = c.watch_with(req(5), &m).await.expect("stream");
        assert_eq!(items.len(), 3);
        assert_eq!(items[2].id, "w3");
        assert!(!replayed(&initial) && !replayed(&trailers));
    }
    assert_eq!(app.counts.executions(), before + 2, "Watch ran each time");
}

/// Calls `path` twice with one key: both run, no marker.
async fn assert_passes(app: &App<MemoryStore>, c: &Client, path: &'static str) {
    let before = app.counts.executions();
    let m = with("a1", &key());
    for _ in 0..2 {
        let r = c.call(path, req(100), &m).await.expect("runs");
        assert!(!replayed(r.metadata()), "{path}");
    }
    assert_eq!(app.counts.executions(), before + 2, "{path} ran each time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_described_unary_methods_are_covered_and_streaming_passes() {
    let set = descriptors();
    let app = start(|b| b.unary_methods_of(&set)).await;
    let c = app.client().await;
    assert_covered(&app, &c, CREATE).await;
    assert_covered(&app, &c, BARE).await;
    assert_watch_passes(&app, &c).await;
    // Served but not described: untouched, even with a malformed key.
    let bad = Meta {
        account: Some("a1".to_owned()),
        keys: vec![b"a, b".to_vec()],
        timeout: None,
    };
    let r = c.call(OPEN, req(100), &bad).await.expect("open");
    assert!(!replayed(r.metadata()));
    assert_passes(&app, &c, OPEN).await;
    assert_eq!(app.counts.executions(), 1 + 1 + 2 + 1 + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_described_method_without_a_key_is_refused() {
    let set = descriptors();
    let app = start(|b| b.unary_methods_of(&set)).await;
    let c = app.client().await;
    let no_key = Meta {
        account: Some("a1".to_owned()),
        ..Meta::default()
    };
    let s = c.call(BARE, req(100), &no_key).await.expect_err("refused");
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert_eq!(app.counts.executions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_methods_add_to_the_described_ones() {
    let set = descriptors();
    let app = start(|b| {
        b.method(BY_FIELD)
            .key_field(BY_FIELD, 5)
            .unary_methods_of(&set)
    })
    .await;
    let c = app.client().await;
    assert_covered(&app, &c, CREATE).await;
    assert_covered(&app, &c, BARE).await;
    // CreateByField: its key in field 5, covered by `method`.
    let mut r = req(100);
    r.request_id = key();
    let account = Meta {
        account: Some("a1".to_owned()),
        ..Meta::default()
    };
    let first = c.call(BY_FIELD, r.clone(), &account).await.expect("first");
    let again = c.call(BY_FIELD, r, &account).await.expect("again");
    assert!(!replayed(first.metadata()) && replayed(again.metadata()));
    assert_watch_passes(&app, &c).await;
    assert_eq!(app.counts.executions(), 1 + 1 + 1 + 2);
}

/// With `all_unary_except`, in either order, the set's streaming methods
/// join the exceptions: `Watch` called with a key (one message, so it
/// would be taken for a unary call) runs each time; `Open`, not described,
/// stays covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_all_unary_except_the_described_streaming_methods_pass() {
    let set = descriptors();
    for before in [true, false] {
        let app = start(|b| {
            if before {
                b.unary_methods_of(&set).all_unary_except([OPEN])
            } else {
                b.all_unary_except([OPEN]).unary_methods_of(&set)
            }
        })
        .await;
        let c = app.client().await;
        assert_watch_passes(&app, &c).await;
        assert_passes(&app, &c, OPEN).await;
        assert_covered(&app, &c, CREATE).await;
    }
    // Without the set, a keyed `Watch` is covered (the control).
    let app = start(|b| b.all_unary_except([OPEN])).await;
    let c = app.client().await;
    let m = with("a1", &key());
    let _ = c.watch_with(req(5), &m).await.expect("first");
    let _ = c.watch_with(req(5), &m).await;
    assert_eq!(app.counts.executions(), 1, "covered: the retry did not run");
}

fn builder() -> idem_grpc::GrpcIdempotencyLayerBuilder<MemoryStore, FixedOwner> {
    GrpcIdempotencyLayer::builder(Idem::new(MemoryStore::new())).owner(FixedOwner::new("a1"))
}

#[test]
fn bytes_that_do_not_decode_are_refused_by_build() {
    // A field (`file`, length-delimited) longer than the bytes.
    let err = builder()
        .method(CREATE)
        .unary_methods_of(&[0x0a, 0x05, 0x01])
        .build()
        .unwrap_err();
    assert!(matches!(err, GrpcConfigError::DescriptorSet(_)), "{err:?}");
    assert_eq!(err.to_string(), "not an encoded protobuf FileDescriptorSet");
    let source = std::error::Error::source(&err).expect("the decoder's reason");
    assert!(source.to_string().contains("decode"), "{source}");
    // The first failure is kept, whatever comes after it.
    let err = builder()
        .unary_methods_of(b"\xff\xff")
        .unary_methods_of(&descriptors())
        .build()
        .unwrap_err();
    assert!(matches!(err, GrpcConfigError::DescriptorSet(_)), "{err:?}");
}

#[test]
fn a_set_without_a_unary_method_is_refused_by_build() {
    let streaming_only = FileDescriptorSet {
        file: vec![file(
            "w.proto",
            Some("p"),
            service("S", vec![method("Watch", true)]),
        )],
    }
    .encode_to_vec();
    for bytes in [streaming_only, Vec::new()] {
        // Even when `method` covers something: the set is a misconfiguration.
        let err = builder()
            .method(CREATE)
            .unary_methods_of(&bytes)
            .build()
            .unwrap_err();
        assert_eq!(err, GrpcConfigError::NoUnaryMethod);
    }
}

#[test]
fn a_described_set_is_enough_to_build() {
    assert!(builder().unary_methods_of(&descriptors()).build().is_ok());
    assert_eq!(
        builder().build().unwrap_err(),
        GrpcConfigError::NothingCovered
    );
}

// `canonical_fingerprint`: the message decoded by its input type.

fn field(name: &str, number: i32, ty: Type) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.to_owned()),
        number: Some(number),
        label: Some(Label::Optional as i32),
        r#type: Some(ty as i32),
        ..FieldDescriptorProto::default()
    }
}

fn message(name: &str, fields: Vec<FieldDescriptorProto>) -> DescriptorProto {
    DescriptorProto {
        name: Some(name.to_owned()),
        field: fields,
        ..DescriptorProto::default()
    }
}

/// The test server's schema with its message types (`app::Req`,
/// `app::Resp`): what a canonical fingerprint decodes by.
fn typed_descriptors() -> Vec<u8> {
    let mut svc = svc_file();
    svc.syntax = Some("proto3".to_owned());
    svc.message_type = vec![
        message(
            "Req",
            vec![
                field("account", 1, Type::String),
                field("amount", 2, Type::Int64),
                field("note", 4, Type::String),
                field("request_id", 5, Type::String),
            ],
        ),
        message(
            "Resp",
            vec![
                field("id", 1, Type::String),
                field("amount", 2, Type::Int64),
                field("execution", 3, Type::Int64),
            ],
        ),
    ];
    FileDescriptorSet { file: vec![svc] }.encode_to_vec()
}

/// A request message sent byte for byte as given, to write one message
/// otherwise than prost does.
#[derive(Debug, Clone, Default, PartialEq)]
struct Raw(Vec<u8>);

impl Message for Raw {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// `req(amount)` as prost writes it: `account` (1), then `amount` (2).
fn as_prost_writes(amount: i64) -> Vec<u8> {
    req(amount).encode_to_vec()
}

/// The same message written another way: `amount` first, then `account`,
/// an explicit empty `note` (4, its default) and a field the schema does
/// not know (9).
fn reencoded(amount: i64) -> Vec<u8> {
    use prost::encoding::{int64, string, uint32};
    let mut buf = Vec::new();
    int64::encode(2, &amount, &mut buf);
    string::encode(1, &"acc".to_owned(), &mut buf);
    string::encode(4, &String::new(), &mut buf);
    uint32::encode(9, &1, &mut buf);
    assert_ne!(buf, as_prost_writes(amount));
    buf
}

async fn call_raw(
    app: &App<MemoryStore>,
    bytes: Vec<u8>,
    meta: &Meta,
) -> Result<tonic::Response<app::Resp>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(app.channel().await);
    grpc.ready().await.expect("ready");
    let (metadata, extensions, _) = Client::request(req(0), meta).into_parts();
    grpc.unary(
        tonic::Request::from_parts(metadata, extensions, Raw(bytes)),
        http::uri::PathAndQuery::from_static(CREATE),
        tonic_prost::ProstCodec::<Raw, app::Resp>::default(),
    )
    .await
}

fn assert_refused(s: &tonic::Status, code: tonic::Code, reason: &str) {
    assert_eq!(s.code(), code, "{s:?}");
    let info = s
        .get_error_details()
        .error_info()
        .cloned()
        .expect("ErrorInfo");
    assert_eq!(info.reason, reason, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_encodings_of_one_request_replay_under_the_canonical_fingerprint() {
    let set = typed_descriptors();
    let app = start(|b| b.method(CREATE).canonical_fingerprint(&set)).await;
    let m = with("a1", &key());
    let first = call_raw(&app, as_prost_writes(100), &m)
        .await
        .expect("first");
    assert!(!replayed(first.metadata()));
    let again = call_raw(&app, reencoded(100), &m).await.expect("again");
    assert!(replayed(again.metadata()), "the other encoding is a retry");
    assert_eq!(again.get_ref(), first.get_ref());
    // And the other way round, under another key.
    let m2 = with("a1", &key());
    let first = call_raw(&app, reencoded(100), &m2).await.expect("first");
    let again = call_raw(&app, as_prost_writes(100), &m2)
        .await
        .expect("again");
    assert!(replayed(again.metadata()));
    assert_eq!(again.get_ref(), first.get_ref());
    // A different request is still a mismatch, however it is written.
    for other in [as_prost_writes(200), reencoded(200)] {
        let s = call_raw(&app, other, &m).await.expect_err("mismatch");
        assert_refused(&s, tonic::Code::FailedPrecondition, "FINGERPRINT_MISMATCH");
    }
    assert_eq!(app.counts.executions(), 2, "one run per key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_another_encoding_is_a_mismatch() {
    let app = start(|b| b.method(CREATE)).await;
    let m = with("a1", &key());
    call_raw(&app, as_prost_writes(100), &m)
        .await
        .expect("first");
    for other in [reencoded(100), as_prost_writes(200), reencoded(200)] {
        let s = call_raw(&app, other, &m).await.expect_err("mismatch");
        assert_refused(&s, tonic::Code::FailedPrecondition, "FINGERPRINT_MISMATCH");
    }
    // The bytes as sent still replay.
    let again = call_raw(&app, as_prost_writes(100), &m)
        .await
        .expect("again");
    assert!(replayed(again.metadata()));
    assert_eq!(app.counts.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_do_not_decode_as_the_input_type_are_refused() {
    let set = typed_descriptors();
    let app = start(|b| b.method(CREATE).canonical_fingerprint(&set)).await;
    // `account` (1) said to be 5 bytes long, 1 sent; a wire type that does
    // not exist (7); `amount` (2, an int64) sent length-delimited.
    for bytes in [vec![0x0a, 0x05, 0x61], vec![0x0f], vec![0x12, 0x01, 0x00]] {
        let s = call_raw(&app, bytes.clone(), &with("a1", &key()))
            .await
            .expect_err("refused");
        assert_refused(&s, tonic::Code::InvalidArgument, "INVALID_REQUEST");
        assert!(s.message().contains("idem.test.v1.Req"), "{s:?}");
    }
    assert_eq!(app.counts.executions(), 0, "no handler ran");
    // The control: a message that decodes runs.
    call_raw(&app, as_prost_writes(100), &with("a1", &key()))
        .await
        .expect("runs");
    assert_eq!(app.counts.executions(), 1);
}

#[test]
fn a_set_the_canonical_fingerprint_cannot_use_is_refused_by_build() {
    let err = builder()
        .method(CREATE)
        .canonical_fingerprint(&[0x0a, 0x05, 0x01])
        .build()
        .unwrap_err();
    assert!(matches!(err, GrpcConfigError::DescriptorSet(_)), "{err:?}");
    // It decodes, but its methods' message types are not in it.
    let err = builder()
        .method(CREATE)
        .canonical_fingerprint(&descriptors())
        .build()
        .unwrap_err();
    assert!(matches!(err, GrpcConfigError::DescriptorSet(_)), "{err:?}");
    let source = std::error::Error::source(&err).expect("why").to_string();
    assert!(source.contains("idem.test.v1.Req"), "{source}");
    // No unary method: it would fingerprint nothing.
    let err = builder()
        .method(CREATE)
        .canonical_fingerprint(&[])
        .build()
        .unwrap_err();
    assert_eq!(err, GrpcConfigError::NoUnaryMethod);
    // It covers nothing by itself.
    assert_eq!(
        builder()
            .canonical_fingerprint(&typed_descriptors())
            .build()
            .unwrap_err(),
        GrpcConfigError::NothingCovered
    );
}
