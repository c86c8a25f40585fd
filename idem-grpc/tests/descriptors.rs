//! `unary_methods_of`: the layer covers exactly the unary methods of the
//! services an encoded `FileDescriptorSet` describes (one file with a
//! package, one without), over a real tonic server and client; streaming
//! methods and the methods it does not describe pass untouched. And the
//! builder's errors for a set that does not decode or covers nothing.

#![allow(missing_docs, clippy::unwrap_used, unreachable_pub, dead_code)]

#[path = "suite/app.rs"]
mod app;

use std::sync::Arc;

use app::{App, BARE, BY_FIELD, CREATE, Client, Meta, OPEN, Options, TestBuilder, req, with};
use idem_core::{Idem, IdempotencyKey, MemoryStore};
use idem_grpc::{FixedOwner, GrpcConfigError, GrpcIdempotencyLayer};
use prost::Message;
use prost_types::{
    FileDescriptorProto, FileDescriptorSet, MethodDescriptorProto, ServiceDescriptorProto,
};
use tonic::metadata::MetadataMap;

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

/// The test server's schema, as tonic-build would write it: `Svc` in
/// package `idem.test.v1` with `Create` (unary) and `Watch` (server
/// streaming), and `Bare` without a package with `Create` (unary). `Open`
/// and `CreateByField` are served but not described.
fn descriptors() -> Vec<u8> {
    FileDescriptorSet {
        file: vec![
            file(
                "idem/test/v1/svc.proto",
                Some("idem.test.v1"),
                service("Svc", vec![method("Create", false), method("Watch", true)]),
            ),
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
