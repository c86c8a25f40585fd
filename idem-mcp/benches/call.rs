//! What `IdempotentTools` adds to one `tools/call`: an rmcp client and
//! server on an in-process connection, a tool that answers at once, called
//! without a key (the tool alone), with a fresh key (claim and completion)
//! and with a key already answered (a replay), on `MemoryStore`.
//!
//! ```text
//! cargo bench -p idem-mcp --bench call
//! ```

use criterion::{Criterion, criterion_group, criterion_main};
use idem_core::{Idem, IdempotencyKey, MemoryStore};
use idem_mcp::rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, RequestMetaObject,
    ServerCapabilities, ServerConfig,
};
use idem_mcp::rmcp::service::{RequestContext, RunningService};
use idem_mcp::rmcp::{RoleClient, RoleServer, ServerHandler, ServiceExt};
use idem_mcp::{IdempotentTools, ToolOutcome};
use serde_json::json;

#[derive(Clone)]
struct Echo(IdempotentTools<MemoryStore>);

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.0
            .call(request, &context, |call| async move {
                let args = serde_json::Value::Object(call.into_arguments());
                ToolOutcome::from(CallToolResult::structured(args))
            })
            .await
            .map(Into::into)
    }
}

fn keyed(key: Option<&str>) -> CallToolRequestParams {
    let args = json!({ "amount": 5, "currency": "EUR", "note": "x".repeat(200) });
    let serde_json::Value::Object(args) = args else {
        return CallToolRequestParams::new("create_order");
    };
    let mut r = CallToolRequestParams::new("create_order").with_arguments(args);
    if let Some(k) = key {
        let mut meta = RequestMetaObject::default();
        meta.0.0.insert("idempotencyKey".to_owned(), k.into());
        r.meta = Some(meta);
    }
    r
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let client: RunningService<RoleClient, ()> = rt.block_on(async {
        let server = Echo(IdempotentTools::with_owner(
            Idem::new(MemoryStore::new()),
            "bench",
        ));
        let (a, b) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(running) = server.serve(a).await {
                let _ = running.waiting().await;
            }
        });
        ().serve(b).await.expect("connect")
    });
    let mut group = c.benchmark_group("tools_call");
    group.bench_function("no_key", |b| {
        b.iter(|| rt.block_on(client.call_tool(keyed(None))).expect("call"));
    });
    group.bench_function("fresh_key", |b| {
        b.iter(|| {
            let key = IdempotencyKey::random();
            rt.block_on(client.call_tool(keyed(Some(key.as_str()))))
                .expect("call")
        });
    });
    rt.block_on(client.call_tool(keyed(Some("replayed"))))
        .expect("call");
    group.bench_function("replay", |b| {
        b.iter(|| {
            rt.block_on(client.call_tool(keyed(Some("replayed"))))
                .expect("call")
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
