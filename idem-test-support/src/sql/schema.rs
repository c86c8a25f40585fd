//! The table as the migration builds it: byte-exact identities, values only
//! through bind parameters, bodies of any bytes, and corrupted rows as typed
//! errors.

use idem_core::clock::{Clock, ManualClock};
use idem_core::store::{Store, StoreError};
use idem_core::{Error, Idem, IdempotencyKey, Outcome, Policy, RecordId, Scope};

use super::{
    CorruptDialect, Counter, Dialect, Out, SqlFixture, engine, request, scope, with_fixture,
};

/// Owners, operations and keys full of quotes, comment markers, wildcards
/// and backslashes are data: stored as sent, replayed, never confused with
/// a LIKE-ish neighbour; NUL and a 256-character key are refused before any
/// SQL; the widest scope and key fit the primary key.
pub async fn hostile_values_go_through_bind_parameters_only<D: Dialect>(d: D) {
    let fx = d.open(4).await;
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(fx.store(), &clock);
        let owner = "o'; DROP TABLE idem_records; -- `x`";
        let operation = "POST /\"x\"; SELECT pg_sleep(10); SELECT SLEEP(10); \\";
        let scope = Scope::new(owner, operation).expect("scope");
        let long_key: String = (0..255)
            .map(|i| ['\'', ';', '"', '\\', 'a', '%', '_', '`', ' '][i % 9])
            .collect();
        let long_key = format!("k{}z", &long_key[2..]);
        assert_eq!(long_key.len(), 255);
        let first = idem
            .execute(&scope, long_key.as_str(), &request(), |_| async {
                Out::Success("one".into())
            })
            .await
            .expect("hostile values are data");
        assert!(!first.is_replay());
        let again = idem
            .execute(&scope, long_key.as_str(), &request(), |_| async {
                Out::Success("two".into())
            })
            .await
            .expect("replay");
        assert_eq!(again.into_result(), Ok("one".to_owned()));
        let [o, op, k] = d.stored_identity(&fx).await;
        assert_eq!(o, owner.as_bytes());
        assert_eq!(op, operation.as_bytes());
        assert_eq!(k, long_key.as_bytes());
        // A LIKE-ish neighbour owner never sees it.
        let other = Scope::new("o'; DROP TABLE idem_records; -- `%`", operation).expect("scope");
        let mine = idem
            .execute(&other, long_key.as_str(), &request(), |_| async {
                Out::Success("other".into())
            })
            .await
            .expect("other owner");
        assert!(!mine.is_replay());
        assert!(
            Scope::new("own\0er", "op").is_err(),
            "NUL is refused before any SQL"
        );
        let too_long = "k".repeat(256);
        let err = idem
            .execute(&scope, too_long.as_str(), &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect_err("256 characters");
        assert_eq!(err.http_status(), 400);
        // The longest parts a scope accepts fit the primary key.
        let widest = Scope::new("o".repeat(1024), "p".repeat(1024)).expect("scope");
        idem.execute(&widest, "k".repeat(255).as_str(), &request(), |_| async {
            Out::Success("wide".into())
        })
        .await
        .expect("1024 + 1024 + 255 bytes fit the key");
        assert_eq!(d.count_records(&fx).await, 3);
    })
    .await;
}

/// Keys, owners and operations compare byte for byte: case and trailing
/// spaces make other records (a `_bin` collation with `PAD SPACE`, as
/// MariaDB's `utf8mb4_bin`, would merge `a` and `a `).
pub async fn identities_are_byte_exact<D: Dialect>(d: D) {
    let fx = d.open(4).await;
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(fx.store(), &clock);
        let owner = format!("acct-{}", IdempotencyKey::random());
        let pairs: [(String, &str, &str); 6] = [
            (owner.clone(), "POST /orders", "order-A"),
            (owner.clone(), "POST /orders", "order-a"),
            (format!("{owner} "), "POST /orders", "order-A"),
            (owner.clone(), "POST /orders ", "order-A"),
            (owner.clone(), "post /orders", "order-A"),
            (owner.to_uppercase(), "POST /orders", "order-A"),
        ];
        for (i, (o, op, k)) in pairs.iter().enumerate() {
            let scope = Scope::new(o.clone(), *op).expect("scope");
            let r = idem
                .execute(&scope, *k, &request(), |_| async move {
                    Out::Success(format!("r{i}"))
                })
                .await
                .expect("execute");
            assert!(
                !r.is_replay(),
                "{i}: {o:?} {op:?} {k:?} is a record of its own"
            );
        }
        for (i, (o, op, k)) in pairs.iter().enumerate() {
            let scope = Scope::new(o.clone(), *op).expect("scope");
            let r = idem
                .execute(&scope, *k, &request(), |_| async {
                    Out::Success("again".into())
                })
                .await
                .expect("replay");
            assert!(r.is_replay());
            assert_eq!(r.into_result(), Ok(format!("r{i}")), "{o:?} {op:?} {k:?}");
        }
        assert_eq!(d.count_records(&fx).await, 6);
        d.check_identity_columns(&fx).await;
    })
    .await;
}

/// A body of every byte value, and a large one (3 MiB, under a policy
/// that stores up to 8 MiB), come back byte for byte.
pub async fn binary_bodies_round_trip<D: Dialect>(d: D) {
    let fx = d.open(2).await;
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        let policy = Policy::builder()
            .max_response_bytes(8 << 20)
            .build()
            .expect("policy");
        let idem = Idem::new(fx.store().clone())
            .with_clock(clock.clone())
            .with_policy(policy);
        let scope = scope();
        let all: Vec<u8> = (0..=255u8).cycle().take(3 * 1024 * 1024).collect();
        for (k, body) in [
            ("all-bytes", (0..=255u8).collect::<Vec<u8>>()),
            ("3mib", all),
        ] {
            let b = body.clone();
            idem.execute(&scope, k, &request(), move |_| async move {
                Outcome::<Vec<u8>, String>::Success(b)
            })
            .await
            .expect("execute");
            let again = idem
                .execute(&scope, k, &request(), |_| async {
                    Outcome::<Vec<u8>, String>::Success(Vec::new())
                })
                .await
                .expect("replay");
            assert!(again.is_replay());
            assert_eq!(again.into_result(), Ok(body), "{k}");
        }
    })
    .await;
}

/// A row corrupted by hand (its check constraints dropped) is a typed
/// `Corrupt` store error on a fetch and a 500 on a call, never a panic, and
/// the work does not run over it.
pub async fn corrupted_rows_are_typed_errors_not_panics<D: CorruptDialect>(d: D) {
    let fx = d.open(2).await;
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(fx.store(), &clock);
        let scope = scope();
        let corruptions = d.corruptions();
        for (k, _) in &corruptions {
            idem.execute(&scope, *k, &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect("call");
        }
        d.drop_checks(&fx).await;
        for (k, set) in corruptions {
            d.corrupt(&fx, set, k).await;
            let id = RecordId::new(scope.clone(), IdempotencyKey::parse(k).expect("key"));
            let fetched = fx.store().fetch(&id, clock.now()).await;
            assert!(
                matches!(fetched, Err(StoreError::Corrupt { .. })),
                "{k}: {fetched:?}"
            );
            let runs = Counter::default();
            let r = runs.clone();
            let err = idem
                .execute(&scope, k, &request(), move |_| async move {
                    r.hit();
                    Out::Success("no".into())
                })
                .await
                .expect_err("corrupt");
            assert!(matches!(err, Error::CorruptRecord { .. }), "{k}: {err:?}");
            assert_eq!(err.http_status(), 500);
            assert_eq!(
                runs.get(),
                0,
                "{k}: the work does not run over a corrupted record"
            );
        }
    })
    .await;
}

/// Every call of `store`, a store over a table of another layout that was
/// never migrated (so `migrate` did not check it), is refused with the
/// typed layout error ([`StoreError::Backend`] around
/// `idem_sql::LayoutError`): the claim, the read, the operator's counts.
///
/// # Panics
///
/// When a call goes through, or fails otherwise (that is the test failing).
pub async fn assert_calls_refused_on_another_layout<S>(store: &S)
where
    S: idem_core::store::AdminStore,
{
    let refused = |what: &str, e: Result<(), StoreError>| match e {
        Err(StoreError::Backend { source, .. })
            if source.downcast_ref::<idem_sql::LayoutError>().is_some() => {}
        other => panic!("{what}: expected the layout error, got {other:?}"),
    };
    let now = ManualClock::starting_now().now();
    let id = RecordId::new(scope(), IdempotencyKey::random());
    refused(
        "claim",
        store.claim(&super::claim_request(&id, now)).await.map(drop),
    );
    refused("fetch", store.fetch(&id, now).await.map(drop));
    refused("counts", store.count_states(now).await.map(drop));
}
