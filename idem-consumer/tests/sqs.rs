//! The Lambda + SQS adapter, called directly with the events AWS documents
//! (the standard-queue example of the Lambda developer guide, "Using Lambda
//! with Amazon SQS"), on SQLite.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use idem_consumer::sqs::{SqsConsumer, SqsKey};
use idem_consumer::{Consumer, DeadLetterReason};
use idem_core::{Attempt, Failure, Idem};
use idem_sqlite::SqliteStore;
use serde_json::{Value, json};

const FIRST: &str = "059f36b4-87a3-44ab-83d2-661975830a7d";
const SECOND: &str = "2e1424d4-f796-459a-8184-9c92662be6da";

/// The standard-queue example event of the AWS Lambda docs.
fn documented_event() -> Value {
    json!({
        "Records": [
            {
                "messageId": FIRST,
                "receiptHandle": "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a...",
                "body": "Test message.",
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1545082649183",
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": "1545082649185"
                },
                "messageAttributes": {},
                "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-2:123456789012:my-queue",
                "awsRegion": "us-east-2"
            },
            {
                "messageId": SECOND,
                "receiptHandle": "AQEBzWwaftRI0KuVm4tP+/7q1rGgNqicHq...",
                "body": "Test message.",
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1545082650636",
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": "1545082650649"
                },
                "messageAttributes": {},
                "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-2:123456789012:my-queue",
                "awsRegion": "us-east-2"
            }
        ]
    })
}

fn event(v: Value) -> SqsEvent {
    serde_json::from_value(v).expect("a valid SqsEvent")
}

/// The ids a response lists for redelivery, in order.
fn listed(response: &SqsBatchResponse) -> Vec<&str> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect()
}

async fn sqs() -> SqsConsumer<SqliteStore> {
    let store = SqliteStore::memory().await.expect("sqlite");
    let consumer = Consumer::builder(Idem::new(store))
        .owner("billing-service")
        .operation("charge-on-order-created")
        .retry_backoff(Duration::from_secs(1), Duration::from_secs(60))
        .build()
        .expect("consumer");
    SqsConsumer::new(consumer)
}

/// Work that counts its runs per message id and fails transiently for the
/// ids in `transient`.
#[derive(Clone, Default)]
struct Work {
    runs: Arc<Mutex<Vec<String>>>,
    transient: Arc<Mutex<Vec<String>>>,
}

impl Work {
    fn call(
        &self,
    ) -> impl Fn(Attempt, SqsMessage) -> std::future::Ready<Result<String, Failure<String>>>
    + Send
    + Sync
    + use<> {
        let this = self.clone();
        move |_, record| {
            let id = record.message_id.unwrap_or_default();
            this.runs.lock().expect("lock").push(id.clone());
            if this.transient.lock().expect("lock").contains(&id) {
                return std::future::ready(Err(Failure::transient("downstream 503".to_owned())));
            }
            std::future::ready(Ok(format!("done {id}")))
        }
    }
    /// `event` through `sqs` with this work.
    async fn batch(&self, sqs: &SqsConsumer<SqliteStore>, event: Value) -> SqsBatchResponse {
        sqs.process_batch::<String, String, _, _, _>(self::event(event), self.call())
            .await
    }
    fn runs(&self) -> Vec<String> {
        self.runs.lock().expect("lock").clone()
    }
    fn fail(&self, id: &str, on: bool) {
        let mut t = self.transient.lock().expect("lock");
        t.retain(|x| x != id);
        if on {
            t.push(id.to_owned());
        }
    }
}

/// The second record transient: exactly its id is listed; the same event
/// again replays the first and runs the second (now succeeding).
#[tokio::test]
async fn second_record_transient_is_listed_exactly_then_redelivered() {
    let sqs = sqs().await;
    let work = Work::default();
    work.fail(SECOND, true);
    let response = work.batch(&sqs, documented_event()).await;
    assert_eq!(
        serde_json::to_string(&response).expect("json"),
        format!(r#"{{"batchItemFailures":[{{"itemIdentifier":"{SECOND}"}}]}}"#)
    );
    work.fail(SECOND, false);
    let response = work.batch(&sqs, documented_event()).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(work.runs(), [FIRST, SECOND, SECOND]);
}

/// C16: the first record twice in one batch (another receipt handle): one
/// run, nothing listed; and a copy of a transient record is listed once.
#[tokio::test]
async fn same_message_id_twice_in_a_batch_runs_once_and_is_listed_at_most_once() {
    let sqs = sqs().await;
    let work = Work::default();
    let mut v = documented_event();
    let mut copy = v["Records"][0].clone();
    copy["receiptHandle"] = json!("AQEBanotherReceiptHandle...");
    v["Records"]
        .as_array_mut()
        .expect("records")
        .insert(1, copy.clone());
    let response = work.batch(&sqs, v.clone()).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(work.runs(), [FIRST, SECOND]);

    let sqs = self::sqs().await;
    let work = Work::default();
    work.fail(FIRST, true);
    let response = work.batch(&sqs, v).await;
    assert_eq!(listed(&response), [FIRST]);
    assert_eq!(work.runs(), [FIRST, SECOND]);
}

/// C17: a FIFO queue: after the first retry, no later record runs, and it
/// and every later record are listed, in order.
#[tokio::test]
async fn fifo_stops_at_the_first_retry_and_lists_the_rest() {
    let sqs = sqs().await;
    let work = Work::default();
    let mut v = documented_event();
    let third = "8f5c2a4e-0000-4000-8000-000000000003";
    let mut extra = v["Records"][1].clone();
    extra["messageId"] = json!(third);
    v["Records"].as_array_mut().expect("records").push(extra);
    for (n, r) in v["Records"]
        .as_array_mut()
        .expect("records")
        .iter_mut()
        .enumerate()
    {
        r["eventSourceARN"] = json!("arn:aws:sqs:us-east-2:123456789012:my-queue.fifo");
        r["attributes"]["MessageGroupId"] = json!("group-1");
        r["attributes"]["SequenceNumber"] = json!(format!("1866996917768580{n:04}"));
        r["attributes"]["MessageDeduplicationId"] = json!(format!("dedup-{n}"));
    }
    work.fail(SECOND, true);
    let response = work.batch(&sqs, v).await;
    assert_eq!(listed(&response), [SECOND, third]);
    assert_eq!(work.runs(), [FIRST, SECOND]);
}

/// C10 on SQS: a body naming a JSON member twice is dead-lettered through
/// the hook and not listed; when the hook fails, it is listed. The work
/// never runs.
#[tokio::test]
async fn invalid_body_goes_to_the_hook_or_is_listed_when_the_hook_fails() {
    let mut v = documented_event();
    v["Records"][0]["body"] = json!(r#"{"amount":1,"amount":1000}"#);
    let v = json!({"Records": [v["Records"][0].clone()]});
    for hook_fails in [false, true] {
        let called = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&called);
        let sqs = sqs().await.dead_letter(move |record, reason| {
            let c = Arc::clone(&c);
            async move {
                assert_eq!(reason, DeadLetterReason::InvalidMessage);
                assert_eq!(record.message_id.as_deref(), Some(FIRST));
                c.fetch_add(1, Ordering::SeqCst);
                if hook_fails {
                    Err("DLQ unreachable".into())
                } else {
                    Ok(())
                }
            }
        });
        let work = Work::default();
        let response = work.batch(&sqs, v.clone()).await;
        let ids = listed(&response);
        let expected: &[&str] = if hook_fails { &[FIRST] } else { &[] };
        assert_eq!(ids, expected, "hook fails: {hook_fails}");
        assert_eq!(called.load(Ordering::SeqCst), 1);
        assert!(work.runs().is_empty());
    }
}

/// Keyed on the producer's id (a body pointer): two `SendMessage`s of the
/// same event (two messageIds) run the work once.
#[tokio::test]
async fn producer_keys_dedup_across_message_ids() {
    let sqs = sqs()
        .await
        .key_from(SqsKey::BodyPointer("/event_id".to_owned()));
    let work = Work::default();
    let mut v = documented_event();
    for r in v["Records"].as_array_mut().expect("records") {
        r["body"] = json!(r#"{"event_id":"evt_42","amount":1000}"#);
    }
    let response = work.batch(&sqs, v).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(work.runs(), [FIRST]);
}
