//! A loopback TCP proxy in front of a SQL server: it can drop every
//! connection, refuse new ones, stall every connection (bytes are read but
//! held until it resumes), point new connections at another server, and
//! counts what the client sends ([`Protocol`]: the Postgres frontend
//! messages, or the MySQL commands) and the connections it forwards, to
//! measure statements and round trips per call.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The wire protocol the proxy reads to count what the client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// PostgreSQL: untyped startup messages, then `type byte + i32 length`
    /// messages. Execute (`E`) and simple Query (`Q`) are statements; a Sync
    /// (`S`) after extended-protocol messages and each Query wait for the
    /// server; a bare Sync is sqlx's liveness ping; Parse (`P`) prepares.
    Postgres,
    /// MySQL / MariaDB: packets of a 3-byte little-endian length and a
    /// sequence id; a packet with sequence id 0 starts a command, whose first
    /// byte says which. `COM_STMT_EXECUTE` and `COM_QUERY` are statements;
    /// every command with an answer but `COM_PING` (sqlx's liveness ping) is
    /// a round trip; `COM_STMT_CLOSE` has no answer.
    MySql,
}

/// What the client sent so far.
#[derive(Debug, Default)]
struct Counts {
    execute: AtomicU64,
    query: AtomicU64,
    prepare: AtomicU64,
    ping: AtomicU64,
    round_trips: AtomicU64,
    connections: AtomicU64,
}

/// A snapshot of what went through the proxy; subtract two to get what a
/// call sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Prepared statements run (Postgres `E`, MySQL `COM_STMT_EXECUTE`).
    pub execute: u64,
    /// Text queries (Postgres `Q`: BEGIN, COMMIT, ...; MySQL `COM_QUERY`).
    pub query: u64,
    /// Statements prepared on the server (Postgres `P`, MySQL
    /// `COM_STMT_PREPARE`).
    pub prepare: u64,
    /// sqlx's liveness pings, sent when a connection goes back to a sqlx
    /// pool (off the caller's path).
    pub ping: u64,
    /// Round trips the caller waits for (not counting the pings).
    pub round_trips: u64,
    /// Connections accepted and forwarded.
    pub connections: u64,
}

impl Snapshot {
    /// Statements sent: prepared executes plus text queries.
    pub fn statements(&self) -> u64 {
        self.execute + self.query
    }
}

impl std::ops::Sub for Snapshot {
    type Output = Snapshot;
    fn sub(self, o: Snapshot) -> Snapshot {
        Snapshot {
            execute: self.execute - o.execute,
            query: self.query - o.query,
            prepare: self.prepare - o.prepare,
            ping: self.ping - o.ping,
            round_trips: self.round_trips - o.round_trips,
            connections: self.connections - o.connections,
        }
    }
}

/// The proxy; dropping it drops every connection.
#[derive(Debug)]
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    stalled: watch::Sender<bool>,
    upstream: Arc<Mutex<SocketAddr>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    counts: Arc<Counts>,
    accept: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.kill_all();
    }
}

impl Proxy {
    /// Listens on 127.0.0.1 (random port), forwarding to `upstream`.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn start(upstream: SocketAddr, protocol: Protocol) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let down = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let counts = Arc::new(Counts::default());
        let (d, c, n) = (Arc::clone(&down), Arc::clone(&conns), Arc::clone(&counts));
        let stalled = watch::Sender::new(false);
        let upstream = Arc::new(Mutex::new(upstream));
        let (s, u) = (stalled.clone(), Arc::clone(&upstream));
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if d.load(Ordering::SeqCst) {
                    drop(client); // "server down": the connection is closed at once
                    continue;
                }
                n.connections.fetch_add(1, Ordering::SeqCst);
                let n = Arc::clone(&n);
                let gate = s.subscribe();
                let upstream = *u.lock().expect("lock");
                let task = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    pipe(client, server, Parser::new(protocol, n), gate).await;
                });
                c.lock().expect("lock").push(task);
            }
        });
        Self {
            addr,
            down,
            stalled,
            upstream,
            conns,
            counts,
            accept,
        }
    }

    /// Drops every open connection (both sides see the socket close).
    pub fn kill_all(&self) {
        for t in self.conns.lock().expect("lock").drain(..) {
            t.abort();
        }
    }

    /// While down, new connections are closed as soon as they are accepted.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// While stalled, every connection's bytes (both ways) are read and
    /// held, not forwarded: the peers see a silent, open link. Bytes read
    /// after `set_stalled(true)` returns are never forwarded before
    /// `set_stalled(false)`.
    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.send_replace(stalled);
    }

    /// New connections go to `upstream` (open ones keep their server).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.upstream.lock().expect("lock") = upstream;
    }

    /// What went through so far.
    pub fn snapshot(&self) -> Snapshot {
        let c = &self.counts;
        Snapshot {
            execute: c.execute.load(Ordering::SeqCst),
            query: c.query.load(Ordering::SeqCst),
            prepare: c.prepare.load(Ordering::SeqCst),
            ping: c.ping.load(Ordering::SeqCst),
            round_trips: c.round_trips.load(Ordering::SeqCst),
            connections: c.connections.load(Ordering::SeqCst),
        }
    }
}

/// Waits while the proxy is stalled; false once the proxy is gone.
async fn open(gate: &mut watch::Receiver<bool>) -> bool {
    gate.wait_for(|stalled| !stalled).await.is_ok()
}

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    mut parser: Parser,
    gate: watch::Receiver<bool>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let mut up_gate = gate.clone();
    let mut down_gate = gate;
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            parser.feed(&buf[..n]);
            if !open(&mut up_gate).await || sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !open(&mut down_gate).await || cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// Splits the client byte stream into messages and counts them.
#[derive(Debug)]
struct Parser {
    protocol: Protocol,
    counts: Arc<Counts>,
    buf: Vec<u8>,
    /// Postgres: past the untyped startup messages.
    started: bool,
    /// Postgres: extended-protocol messages sent since the last Sync.
    busy: bool,
}

impl Parser {
    fn new(protocol: Protocol, counts: Arc<Counts>) -> Self {
        Self {
            protocol,
            counts,
            buf: Vec::new(),
            started: false,
            busy: false,
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        while let Some(len) = match self.protocol {
            Protocol::Postgres => self.postgres(),
            Protocol::MySql => self.mysql(),
        } {
            self.buf.drain(..len);
        }
    }

    fn hit(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts the next complete Postgres message; its length, or `None`
    /// while it is incomplete. SSLRequest and GSSENCRequest are followed by
    /// the real startup message.
    fn postgres(&mut self) -> Option<usize> {
        let header = usize::from(self.started);
        if self.buf.len() < header + 4 {
            return None;
        }
        let len =
            i32::from_be_bytes(self.buf[header..header + 4].try_into().expect("4 bytes")) as usize;
        if self.buf.len() < header + len {
            return None;
        }
        let c = &self.counts;
        if self.started {
            match self.buf[0] {
                b'E' => Self::hit(&c.execute),
                b'Q' => {
                    Self::hit(&c.query);
                    Self::hit(&c.round_trips);
                }
                b'S' if self.busy => Self::hit(&c.round_trips),
                b'S' => Self::hit(&c.ping),
                b'P' => Self::hit(&c.prepare),
                _ => {}
            }
            self.busy = matches!(self.buf[0], b'P' | b'B' | b'D' | b'E' | b'C' | b'H');
        } else {
            let code = i32::from_be_bytes(self.buf[4..8].try_into().expect("4 bytes"));
            // 80877103: SSLRequest, 80877104: GSSENCRequest; otherwise startup.
            self.started = !(code == 80_877_103 || code == 80_877_104);
        }
        Some(header + len)
    }

    /// Counts the next complete MySQL packet; its length, or `None` while
    /// it is incomplete. The handshake response has sequence id 1.
    fn mysql(&mut self) -> Option<usize> {
        if self.buf.len() < 4 {
            return None;
        }
        let len = usize::from(self.buf[0])
            | usize::from(self.buf[1]) << 8
            | usize::from(self.buf[2]) << 16;
        if self.buf.len() < 4 + len {
            return None;
        }
        let c = &self.counts;
        if self.buf[3] == 0 && len > 0 {
            match self.buf[4] {
                0x17 => Self::hit(&c.execute),
                0x03 => Self::hit(&c.query),
                0x16 => Self::hit(&c.prepare),
                0x0e => Self::hit(&c.ping),
                0x19 => {} // COM_STMT_CLOSE: no answer
                _ => {}
            }
            if !matches!(self.buf[4], 0x0e | 0x19) {
                Self::hit(&c.round_trips);
            }
        }
        Some(4 + len)
    }
}
