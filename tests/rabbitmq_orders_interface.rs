//! The interface of `examples/rabbitmq_orders.rs`, checked from the outside:
//! the built binary consuming a queue of its own on the machine's RabbitMQ
//! (`IDEM_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`), its
//! printed lines (`acked <id> attempt <n> <how>`, `retry <id> after <ms>`,
//! `dead-letter <id> <reason>`, `stopped`), the topology it declares (the
//! dead-letter exchange and queue), its exit status, and the `ledger` and
//! `dead_letters` tables it keeps in its SQLite file. The queue, its
//! dead-letter exchange and queue are deleted at the end.
//!
//! The binary is the one `cargo test` builds next to this test, e.g.
//! `cargo test -p idem --features rabbitmq,sqlite` (no `--test` filter).

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use idem::consumer::rabbitmq::lapin::options::{
    BasicPublishOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use idem::consumer::rabbitmq::lapin::types::FieldTable;
use idem::consumer::rabbitmq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use support::queue_example::{Db, Orders, retry_ms};
use support::random_id;

/// The example's lease: a killed run's message is redelivered at once (the
/// connection closed), found in flight until the lease ends, then recovered.
const LEASE_MS: u64 = 6000;

fn url() -> String {
    std::env::var("IDEM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

fn start(env: &[(&str, String)]) -> Orders {
    Orders::start("rabbitmq_orders", "rabbitmq,sqlite", env)
}

async fn publish(channel: &Channel, queue: &str, id: Option<&str>, payload: &str) {
    let mut props = BasicProperties::default();
    if let Some(id) = id {
        props = props.with_message_id(id.into());
    }
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            payload.as_bytes(),
            props,
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Messages waiting in `queue` (passive declare), waited for (bounded) to
/// reach `want`.
async fn wait_count(channel: &Channel, queue: &str, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let q = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        if q.message_count() == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{queue}: {} messages, want {want}",
            q.message_count()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_orders_on_its_own_queue() {
    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot reach RabbitMQ at {}: {e} (this test never skips)",
                url()
            )
        });
    let channel = conn.create_channel().await.unwrap();
    let queue = format!("idemex.{}", random_id());
    let dead = format!("{queue}.dead");
    let result = tokio::spawn({
        let (channel, queue, dead) = (channel.clone(), queue.clone(), dead.clone());
        async move { the_interface(&channel, &queue, &dead).await }
    })
    .await;
    for q in [queue.as_str(), dead.as_str()] {
        let _ = channel
            .queue_delete(q.into(), QueueDeleteOptions::default())
            .await;
    }
    let dlx = format!("{queue}.dlx");
    let _ = channel
        .exchange_delete(dlx.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    let _ = conn.close(200, "done".into()).await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn the_interface(channel: &Channel, queue: &str, dead: &str) {
    let db = Db::new("rabbitmq-orders");
    let env = [
        ("IDEM_AMQP_URL", url()),
        ("IDEM_RABBITMQ_QUEUE", queue.to_owned()),
        ("IDEM_SQLITE_PATH", db.env()),
        ("IDEM_LEASE_MS", LEASE_MS.to_string()),
    ];
    let mut orders = start(&env);
    let first = orders
        .wait_for("`store:`", |l| l.starts_with("store: "))
        .await;
    assert!(first.starts_with("store: sqlite "), "{first}");
    let consuming = orders
        .wait_for("`consuming queue`", |l| l.starts_with("consuming queue"))
        .await;
    assert!(
        consuming.starts_with(&format!(
            "consuming queue {queue} (dead letters: {dead}) as "
        )),
        "{consuming}"
    );
    let n = random_id();
    let order = r#"{"type":"order","item":"book","qty":1}"#;

    // A fresh message runs once; the same message id again is a replay
    // (RabbitMQ does not drop it at publish, idem answers it).
    let fresh = format!("o-{n}");
    publish(channel, queue, Some(&fresh), order).await;
    orders
        .expect(&format!("acked {fresh} attempt 1 executed"))
        .await;
    publish(channel, queue, Some(&fresh), order).await;
    orders
        .expect(&format!("acked {fresh} attempt 1 replayed"))
        .await;
    assert_eq!(db.ledger(&fresh).await, [(1, 0)]);

    // Another payload under that id: dead-lettered to the queue the example
    // declared, and kept in the table.
    let other = r#"{"type":"order","item":"pen","qty":2}"#;
    publish(channel, queue, Some(&fresh), other).await;
    orders
        .expect(&format!("dead-letter {fresh} fingerprint_mismatch"))
        .await;
    wait_count(channel, dead, 1).await;
    assert_eq!(
        db.dead_letters(&fresh).await,
        [("fingerprint_mismatch".to_owned(), other.to_owned())]
    );

    // test.transient: two held nacks, then attempt 3 runs.
    let transient = format!("t-{n}");
    publish(
        channel,
        queue,
        Some(&transient),
        r#"{"type":"test.transient"}"#,
    )
    .await;
    for _ in 0..2 {
        let line = orders.next_about(&transient).await;
        assert!((1..=2000).contains(&retry_ms(&line, &transient)), "{line}");
    }
    assert_eq!(
        orders.next_about(&transient).await,
        format!("acked {transient} attempt 3 executed")
    );
    assert_eq!(db.ledger(&transient).await, [(3, 0)]);

    // test.permanent, twice: both dead-lettered, both kept, nothing ran.
    let permanent = format!("p-{n}");
    let payload = r#"{"type":"test.permanent"}"#;
    for _ in 0..2 {
        publish(channel, queue, Some(&permanent), payload).await;
        assert_eq!(
            orders.next_about(&permanent).await,
            format!("dead-letter {permanent} permanent_failure")
        );
    }
    wait_count(channel, dead, 3).await;
    let kept = ("permanent_failure".to_owned(), payload.to_owned());
    assert_eq!(db.dead_letters(&permanent).await, [kept.clone(), kept]);
    assert!(db.ledger(&permanent).await.is_empty());

    // SIGKILL during test.slow, after its ledger row and before the outcome:
    // RabbitMQ redelivers to the restarted process at once, idem holds it
    // (`retry`) until the dead run's lease ends, then one recovery finds the
    // row: one effect, one recovery.
    let slow = format!("s-{n}");
    publish(channel, queue, Some(&slow), r#"{"type":"test.slow"}"#).await;
    db.wait_for_ledger_row(&slow).await;
    let printed = orders.kill().await;
    assert!(!printed.iter().any(|l| l.contains(&slow)), "{printed:?}");
    let mut orders = start(&env);
    orders
        .wait_for("`consuming queue`", |l| l.starts_with("consuming queue"))
        .await;
    let recovered = format!("acked {slow} attempt 2 recovered");
    loop {
        let line = orders.next_about(&slow).await;
        if line == recovered {
            break;
        }
        assert!((1..=LEASE_MS).contains(&retry_ms(&line, &slow)), "{line}");
    }
    assert_eq!(db.ledger(&slow).await, [(1, 1)], "one effect, one recovery");

    // SIGTERM while a slow message is in hand: it finishes and is acked,
    // then `stopped`, exit 0.
    let last = format!("l-{n}");
    publish(channel, queue, Some(&last), r#"{"type":"test.slow"}"#).await;
    let status = orders.terminate_with_in_hand(&db, &last).await;
    assert!(status.success(), "{status}");
}
