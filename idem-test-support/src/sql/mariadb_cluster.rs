//! A throwaway MariaDB primary and replica, owned by one test.
//!
//! Two [`Throwaway`] servers on free loopback ports, each in a directory of
//! its own: the primary writes a binary log, the replica follows it by GTID
//! (`CHANGE MASTER TO … master_use_gtid = slave_pos`) through a [`Proxy`]
//! (the replica's `master_port` is the proxy's), so the test can stall the
//! replication link. Asynchronous, or semi-synchronous: the primary's
//! `rpl_semi_sync_master_enabled` with a wait point and a timeout, the
//! replica's `rpl_semi_sync_slave_enabled`. Both servers are SIGKILLed by pid
//! and their directories removed on drop, and by their watchdogs if the test
//! process dies first.

use std::time::{Duration, Instant};

use idem_mysql::sqlx::{self, MySqlPool, Row};

use super::mariadb::Throwaway;
use super::proxy::{Protocol, Proxy};

/// How the primary replicates its commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// MariaDB's default: a commit returns once it is committed on the
    /// primary; the replica gets it when it gets it.
    Asynchronous,
    /// `rpl_semi_sync_master_enabled = ON` on the primary and
    /// `rpl_semi_sync_slave_enabled = ON` on the replica: a commit waits
    /// until the replica says the transaction is in its relay log, or until
    /// `timeout` passes (then the primary goes on asynchronously).
    SemiSync {
        /// `rpl_semi_sync_master_wait_point`: `AFTER_SYNC` or `AFTER_COMMIT`.
        wait_point: &'static str,
        /// `rpl_semi_sync_master_timeout` (milliseconds on the server).
        timeout: Duration,
    },
}

/// The primary, its replica and the replica's replication link.
#[derive(Debug)]
pub struct Cluster {
    /// The primary (binary log on, server id 1).
    pub primary: Throwaway,
    /// Its replica (server id 2, `read_only`), until promoted.
    pub replica: Throwaway,
    /// The replica's replication connection goes through this.
    pub link: Proxy,
}

/// `sql` (one statement, any kind) over the text protocol: `CHANGE MASTER`,
/// `START SLAVE` and friends are not all preparable.
async fn run(pool: &MySqlPool, sql: String) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A global status variable of `pool`'s server, as text.
async fn status(pool: &MySqlPool, name: &str) -> String {
    sqlx::query_scalar(
        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("status {name}: {e}"))
}

impl Cluster {
    /// Starts both servers, points the replica at the primary through the
    /// link and waits until it has applied everything (and, semi-synchronous,
    /// until the primary counts it as its semi-synchronous replica).
    ///
    /// # Panics
    ///
    /// When a server does not start or replication does not (the test
    /// failing).
    pub async fn start(mode: Mode) -> Self {
        let mut primary = vec!["--log-bin=mysql-bin".to_owned(), "--server-id=1".into()];
        let mut replica = vec![
            "--server-id=2".to_owned(),
            "--read-only=ON".into(),
            "--skip-slave-start".into(),
        ];
        if let Mode::SemiSync {
            wait_point,
            timeout,
        } = mode
        {
            // Enabled once the replica is there (below): with no replica a
            // commit would wait the whole timeout.
            primary.push(format!("--rpl-semi-sync-master-wait-point={wait_point}"));
            primary.push(format!(
                "--rpl-semi-sync-master-timeout={}",
                timeout.as_millis()
            ));
            replica.push("--rpl-semi-sync-slave-enabled=ON".into());
        }
        let (primary, replica) = tokio::join!(
            Throwaway::start_with(primary),
            Throwaway::start_with(replica)
        );
        let link = Proxy::start(primary.addr(), Protocol::MySql).await;
        let cluster = Self {
            primary,
            replica,
            link,
        };
        let semi_sync = matches!(mode, Mode::SemiSync { .. });
        if semi_sync {
            let admin = cluster.primary.admin().await;
            run(
                &admin,
                "SET GLOBAL rpl_semi_sync_master_enabled = ON".into(),
            )
            .await;
            admin.close().await;
        }
        let admin = cluster.replica.admin().await;
        run(
            &admin,
            format!(
                "CHANGE MASTER TO master_host = '127.0.0.1', master_port = {}, \
                 master_user = 'root', master_use_gtid = slave_pos, master_connect_retry = 1",
                cluster.link.addr.port()
            ),
        )
        .await;
        run(&admin, "START SLAVE".into()).await;
        admin.close().await;
        if semi_sync {
            let admin = cluster.primary.admin().await;
            let deadline = Instant::now() + Duration::from_secs(30);
            while status(&admin, "RPL_SEMI_SYNC_MASTER_CLIENTS").await != "1" {
                assert!(
                    Instant::now() < deadline,
                    "the replica never connected semi-synchronously; see {}",
                    cluster.replica.error_log().display()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            admin.close().await;
        }
        cluster.wait_replicated().await;
        cluster
    }

    /// Waits until the replica has applied everything in the primary's
    /// binary log so far (`MASTER_GTID_WAIT`, 30 s at most).
    ///
    /// # Panics
    ///
    /// When it has not by then.
    pub async fn wait_replicated(&self) {
        let primary = self.primary.admin().await;
        let pos: String = sqlx::query_scalar("SELECT @@gtid_binlog_pos")
            .fetch_one(&primary)
            .await
            .expect("gtid_binlog_pos");
        primary.close().await;
        self.replica_applies(&pos).await;
    }

    async fn replica_applies(&self, pos: &str) {
        let replica = self.replica.admin().await;
        let waited: i64 = sqlx::query_scalar("SELECT MASTER_GTID_WAIT(?, 30)")
            .bind(pos)
            .fetch_one(&replica)
            .await
            .expect("MASTER_GTID_WAIT");
        assert_eq!(
            waited,
            0,
            "the replica never applied {pos}; see {}",
            self.replica.error_log().display()
        );
        replica.close().await;
    }

    /// The primary's `Rpl_semi_sync_master_status`: whether its commits
    /// still wait for the replica (`false` once the timeout switched it to
    /// asynchronous).
    pub async fn semi_sync_on(&self) -> bool {
        let admin = self.primary.admin().await;
        let on = status(&admin, "RPL_SEMI_SYNC_MASTER_STATUS").await == "ON";
        admin.close().await;
        on
    }

    /// Waits (30 s at most) until a commit on the primary waits for the
    /// replica's acknowledgement (`Rpl_semi_sync_master_wait_sessions`) and
    /// `n` client statements are running there in all: the binary log's
    /// group commit queues a later commit behind the one waiting (its state
    /// is `Commit`, not the wait's).
    ///
    /// # Panics
    ///
    /// When that is not so by then.
    pub async fn wait_for_held_commits(&self, n: i64) {
        let admin = self.primary.admin().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting = status(&admin, "RPL_SEMI_SYNC_MASTER_WAIT_SESSIONS").await;
            let running: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE COMMAND IN ('Query', 'Execute') AND ID <> CONNECTION_ID()",
            )
            .fetch_one(&admin)
            .await
            .expect("PROCESSLIST");
            if waiting != "0" && running >= n {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{waiting} commits wait for the replica, {running} statements run, not {n}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        admin.close().await;
    }

    /// SIGKILLs the primary: nothing more reaches the replica.
    pub async fn kill_primary(&mut self) {
        self.primary.kill().await;
    }

    /// Promotes the replica as a failover tool would: stops receiving,
    /// applies what it received (its relay log, up to `Gtid_IO_Pos`), forgets
    /// its primary and accepts writes.
    ///
    /// # Panics
    ///
    /// When a step fails.
    pub async fn promote_replica(&self) {
        let admin = self.replica.admin().await;
        run(&admin, "STOP SLAVE IO_THREAD".into()).await;
        let status = sqlx::raw_sql("SHOW SLAVE STATUS")
            .fetch_one(&admin)
            .await
            .expect("SHOW SLAVE STATUS");
        let received: String = status.try_get("Gtid_IO_Pos").expect("Gtid_IO_Pos");
        self.replica_applies(&received).await;
        run(&admin, "STOP SLAVE".into()).await;
        run(&admin, "RESET SLAVE ALL".into()).await;
        run(&admin, "SET GLOBAL read_only = OFF".into()).await;
        admin.close().await;
    }
}
