//! Scale-out: several server instances behind a load balancer, coordinated through Redis
//! (`[cluster] redis_url`). Without it none of this exists and the server is one process.
//!
//! What lives in Redis (every key under `[cluster] key_prefix`, `voxgate` by default):
//!
//! | key | what | written by |
//! |---|---|---|
//! | `<p>:dir:<kind>:<id>` | the instance holding a session (`xiaozhi` device, `retell` call) | its holder: `SET PX lease` when it opens, renewed every third of the lease, compare-and-delete when it ends |
//! | `<p>:inst:<instance>` | an instance is alive | its heartbeat, `SET PX lease` |
//! | `<p>:sessions` | cluster admission: one member per open session, scored by its lease's end | a script that drops expired members and adds one only below `max_sessions`; renewed by the heartbeat |
//! | `<p>:perception` | the perception bus across instances | `XADD MAXLEN ~ perception_stream_len` |
//! | `<p>:retell:<call>` | a Retell call's conversation, saved at each turn boundary | the call's holder, with the resume window as TTL |
//! | channel `<p>:rpc:<instance>` | requests routed to an instance, and replies to its requests | any instance ([`wire::Envelope`]) |
//!
//! Leases make a dead instance's entries vanish by themselves; the renewals re-create entries
//! a restarted Redis lost, so what an instance still holds comes back within a third of a
//! lease. While Redis is unreachable an instance serves its own sessions as before: claims,
//! renewals and releases fail and are logged, cross-instance requests answer 503, cluster
//! admission lets sessions in on the instance's own limits (the renewals count them once Redis
//! is back), and the routing subscriber reconnects with back-off.
//!
//! The choices that keep Redis cheap on the turn path: nothing here is touched per turn except
//! a Retell call's conversation save (one `SET` at each turn boundary); sessions cost one
//! claim at open and one release at close, and the heartbeat renews everything held in one
//! script call per lease third, however many sessions there are.

mod mcp;
pub(crate) mod perception;
mod stats;
pub(crate) mod wire;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::AsyncCommands;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

use crate::config::ClusterConfig;
pub(crate) use stats::Stats;
use wire::Envelope;
pub(crate) use wire::Reply;

/// How long one Redis command may take before it counts as failed: Redis on a LAN answers in
/// well under a millisecond, and a session open must not hang on a dead Redis.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(1000);
/// First and longest pause between reconnection attempts of the subscriber and stream reader.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Requests waiting for replies at once; past it a request is refused at once.
const MAX_PENDING: usize = 4096;

/// Drops expired members of the admission set and adds `ARGV[3]` if fewer than `ARGV[1]`
/// remain; scores are Redis's own clock (`TIME`) plus the lease, so instance clocks never
/// matter.
const ADMIT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
return 1
";

/// Renews every admission member in `ARGV[2..]` (re-adding any a restarted Redis lost) and
/// every directory key in `KEYS[2..]` still naming this instance (`ARGV[1]`) or gone; a key
/// another instance took since (the device reconnected there) is left to it. `KEYS[1]` is the
/// admission set, `ARGV[1]` the instance, `ARGV[2]` the lease, then `ARGV[3]` the number of
/// members.
const RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local members = tonumber(ARGV[3])
for i = 1, members do
  redis.call('ZADD', KEYS[1], now + lease, ARGV[3 + i])
end
local kept = 0
for i = 2, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if (not v) or v == ARGV[1] then
    redis.call('SET', KEYS[i], ARGV[1], 'PX', lease)
    kept = kept + 1
  end
end
return kept
";

/// Deletes `KEYS[1]` only while it still names this instance (`ARGV[1]`): a device that
/// reconnected elsewhere keeps its new entry when the old connection closes.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// The holder of `KEYS[1]` and how many subscribers its routing channel (`ARGV[1]` followed
/// by the holder's id) has: one round trip for "who holds it, and is it alive".
const HOLDER: &str = r"
local h = redis.call('GET', KEYS[1])
if not h then return false end
local n = redis.call('PUBSUB', 'NUMSUB', ARGV[1] .. h)
return {h, n[2]}
";

/// Kinds of sessions in the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A Xiaozhi device, by `Device-Id` (lower case).
    Xiaozhi,
    /// A Retell call, by call id.
    Retell,
    /// A Bridge API conversation, by `channel:session_id`.
    Bridge,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Self::Xiaozhi => "xiaozhi",
            Self::Retell => "retell",
            Self::Bridge => "bridge",
        }
    }
}

/// Why a cluster operation did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    /// Redis could not be reached or answered with an error.
    #[error("cluster store unavailable: {0}")]
    Unavailable(String),
    /// The instance the directory names is not listening (it died; its entry will expire).
    #[error("instance {0} is gone")]
    Gone(String),
    /// The other instance did not answer in time.
    #[error("instance {0} did not answer within {1:?}")]
    Timeout(String, Duration),
    /// Too many requests are waiting for answers.
    #[error("too many routed requests waiting")]
    Busy,
}

impl ClusterError {
    /// The HTTP status an API answers this with.
    pub(crate) fn status(&self) -> u16 {
        match self {
            Self::Timeout(..) => 504,
            Self::Gone(_) => 502,
            Self::Unavailable(_) | Self::Busy => 503,
        }
    }

    /// The API error code.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Self::Timeout(..) => "instance_timeout",
            Self::Gone(_) => "instance_gone",
            Self::Unavailable(_) => "cluster_unavailable",
            Self::Busy => "cluster_busy",
        }
    }
}

/// What an instance does with requests routed to it: the server's side of [`Cluster::call`].
#[async_trait::async_trait]
pub(crate) trait Handler: Send + Sync + 'static {
    /// Acts on `op` for `target` with `body`, answering as the HTTP API would.
    async fn handle(&self, op: &str, target: &str, body: Value) -> Reply;
}

/// Handlers that an instance-local API offers to others ([`Handler`] over a function table,
/// so each door registers its own operations).
pub(crate) type Handlers = Arc<dyn Handler>;

/// What this instance holds in Redis, renewed by the heartbeat.
#[derive(Debug, Default)]
struct Held {
    /// Directory keys, with how many local sessions hold each (a device may reconnect to the
    /// same instance before its old connection closed).
    keys: HashMap<String, usize>,
    /// Admission members.
    slots: HashSet<String>,
}

/// This instance's link to the cluster (cheap to share: keep it in an `Arc`).
pub(crate) struct Cluster {
    instance: String,
    prefix: String,
    lease: Duration,
    request_timeout: Duration,
    max_sessions: usize,
    stream_len: usize,
    client: redis::Client,
    conn: ConnectionManager,
    held: Mutex<Held>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: AtomicU64,
    /// Whether the last heartbeat reached Redis.
    up: AtomicBool,
    stats: Stats,
    metrics: Arc<crate::metrics::Metrics>,
    admit: redis::Script,
    holder_script: redis::Script,
    renew: redis::Script,
    release: redis::Script,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("instance", &self.instance)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// The cluster `config` describes, or `None` without a Redis URL. Connects lazily: an
    /// instance starts (and serves its own sessions) while Redis is down.
    ///
    /// # Errors
    /// A Redis URL that does not parse.
    pub(crate) fn new(
        config: &ClusterConfig,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Result<Option<Arc<Self>>, String> {
        let Some(url) = &config.redis_url else {
            return Ok(None);
        };
        let url = url.replacen("valkey://", "redis://", 1);
        let client = redis::Client::open(url.as_str()).map_err(|e| format!("redis_url: {e}"))?;
        let conn = ConnectionManager::new_lazy_with_config(
            client.clone(),
            ConnectionManagerConfig::new()
                .set_connection_timeout(Some(COMMAND_TIMEOUT))
                .set_response_timeout(Some(COMMAND_TIMEOUT))
                .set_number_of_retries(1)
                .set_max_delay(BACKOFF_MAX),
        )
        .map_err(|e| format!("redis: {e}"))?;
        let instance = if config.instance_id.is_empty() {
            let bytes = crate::secret::random_bytes(6).map_err(|e| e.to_string())?;
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        } else {
            config.instance_id.clone()
        };
        Ok(Some(Arc::new(Self {
            instance,
            prefix: config.key_prefix.clone(),
            lease: Duration::from_millis(config.lease_ms),
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            max_sessions: config.max_sessions,
            stream_len: config.perception_stream_len,
            client,
            conn,
            held: Mutex::default(),
            pending: Mutex::default(),
            next_id: AtomicU64::new(1),
            up: AtomicBool::new(false),
            stats: Stats::default(),
            metrics,
            admit: redis::Script::new(ADMIT),
            holder_script: redis::Script::new(HOLDER),
            renew: redis::Script::new(RENEW),
            release: redis::Script::new(RELEASE),
        })))
    }

    /// This instance's id.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// How long entries live without renewal.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// `[cluster] request_timeout_ms`.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut k = self.prefix.clone();
        for p in parts {
            k.push(':');
            k.push_str(p);
        }
        k
    }

    fn dir_key(&self, kind: Kind, id: &str) -> String {
        self.key(&["dir", kind.label(), id])
    }

    fn channel(&self, instance: &str) -> String {
        self.key(&["rpc", instance])
    }

    /// The perception stream's key.
    pub(crate) fn perception_key(&self) -> String {
        self.key(&["perception"])
    }

    /// A key of this cluster under `parts` (`<prefix>:a:b`).
    pub(crate) fn key_of(&self, parts: &[&str]) -> String {
        self.key(parts)
    }

    /// Runs one Redis operation under [`COMMAND_TIMEOUT`], counted in the stats under `op`.
    pub(crate) async fn op<T>(
        &self,
        op: &'static str,
        f: impl AsyncFnOnce(&mut ConnectionManager) -> redis::RedisResult<T>,
    ) -> Result<T, ClusterError> {
        let mut conn = self.conn.clone();
        let started = Instant::now();
        let result = tokio::time::timeout(COMMAND_TIMEOUT, f(&mut conn)).await;
        let result = match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(ClusterError::Unavailable(e.to_string())),
            Err(_) => Err(ClusterError::Unavailable(format!(
                "no answer within {COMMAND_TIMEOUT:?}"
            ))),
        };
        self.stats.record(op, started.elapsed(), result.is_ok());
        if result.is_err() {
            self.metrics.cluster_redis_error();
        }
        result
    }

    // ---- directory ------------------------------------------------------------------------

    /// Records that this instance holds `kind`/`id` (the newest holder wins) until the returned
    /// entry is dropped. A failure to write it is logged, not returned: the session is served
    /// either way, and the heartbeat writes the entry once Redis answers.
    pub(crate) async fn claim(self: &Arc<Self>, kind: Kind, id: &str) -> DirectoryEntry {
        let key = self.dir_key(kind, id);
        *self.lock_held().keys.entry(key.clone()).or_insert(0) += 1;
        let entry = DirectoryEntry {
            cluster: Arc::clone(self),
            key: key.clone(),
        };
        if !self.is_up() {
            // Redis was unreachable at the last heartbeat: do not hold a session open waiting
            // for it; the heartbeat writes the entry once Redis answers.
            return entry;
        }
        let lease = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let instance = self.instance.clone();
        let k = key.clone();
        if let Err(e) = self
            .op("claim", async move |c| {
                c.set_options::<_, _, ()>(
                    &k,
                    &instance,
                    redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(lease)),
                )
                .await
            })
            .await
        {
            tracing::warn!(%key, error = %e, "cluster directory claim failed; the heartbeat retries");
        }
        entry
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn drop_key(self: &Arc<Self>, key: &str) {
        let last = {
            let mut held = self.lock_held();
            match held.keys.get_mut(key) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    held.keys.remove(key);
                    true
                }
                None => false,
            }
        };
        if last {
            let this = Arc::clone(self);
            let key = key.to_owned();
            spawn(async move {
                let script = this.release.clone();
                let instance = this.instance.clone();
                let k = key.clone();
                if let Err(e) = this
                    .op("release", async move |c| {
                        script.key(&k).arg(&instance).invoke_async::<i64>(c).await
                    })
                    .await
                {
                    tracing::warn!(%key, error = %e, "cluster directory release failed; the entry expires with its lease");
                }
            });
        }
    }

    // ---- admission ------------------------------------------------------------------------

    /// Takes one of the cluster's `max_sessions` places, or says the cluster is full. With no
    /// cluster limit this costs nothing; with Redis unreachable the session is let in (the
    /// instance's own limits still apply) and counted once Redis answers again.
    pub(crate) async fn admit(self: &Arc<Self>) -> Result<Option<ClusterSlot>, ()> {
        if self.max_sessions == 0 {
            return Ok(None);
        }
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let member = format!("{}:{n}", self.instance);
        if !self.is_up() {
            // Redis was unreachable at the last heartbeat: admit on this instance's own limits
            // at once (the heartbeat counts the place once Redis is back).
            self.lock_held().slots.insert(member.clone());
            return Ok(Some(ClusterSlot {
                cluster: Arc::clone(self),
                member,
            }));
        }
        let script = self.admit.clone();
        let key = self.key(&["sessions"]);
        let (limit, lease) = (self.max_sessions, self.lease.as_millis());
        let m = member.clone();
        let admitted = self
            .op("admit", async move |c| {
                script
                    .key(&key)
                    .arg(limit)
                    .arg(u64::try_from(lease).unwrap_or(u64::MAX))
                    .arg(&m)
                    .invoke_async::<i64>(c)
                    .await
            })
            .await;
        match admitted {
            Ok(0) => Err(()),
            Ok(_) => {
                self.lock_held().slots.insert(member.clone());
                Ok(Some(ClusterSlot {
                    cluster: Arc::clone(self),
                    member,
                }))
            }
            Err(e) => {
                tracing::warn!(error = %e, "cluster admission unavailable; admitting on this instance's limits");
                self.lock_held().slots.insert(member.clone());
                Ok(Some(ClusterSlot {
                    cluster: Arc::clone(self),
                    member,
                }))
            }
        }
    }

    fn drop_slot(self: &Arc<Self>, member: &str) {
        if !self.lock_held().slots.remove(member) {
            return;
        }
        let this = Arc::clone(self);
        let member = member.to_owned();
        spawn(async move {
            let key = this.key(&["sessions"]);
            if let Err(e) = this
                .op("release", async move |c| {
                    c.zrem::<_, _, i64>(&key, &member).await
                })
                .await
            {
                tracing::warn!(error = %e, "cluster admission release failed; the place expires with its lease");
            }
        });
    }

    /// Sessions counted cluster-wide now (expired places excluded).
    pub(crate) async fn sessions(&self) -> Result<u64, ClusterError> {
        let key = self.key(&["sessions"]);
        self.op("count", async move |c| {
            let t: (u64, u64) = redis::cmd("TIME").query_async(c).await?;
            let now = t.0 * 1000 + t.1 / 1000;
            c.zcount::<_, _, _, u64>(&key, now, "+inf").await
        })
        .await
    }

    // ---- heartbeat ------------------------------------------------------------------------

    /// Renews this instance's liveness key, directory entries and admission places.
    async fn heartbeat(&self) -> Result<(), ClusterError> {
        let (keys, slots): (Vec<String>, Vec<String>) = {
            let held = self.lock_held();
            (
                held.keys.keys().cloned().collect(),
                held.slots.iter().cloned().collect(),
            )
        };
        let lease = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let alive = self.key(&["inst", &self.instance]);
        let instance = self.instance.clone();
        let sessions = self.key(&["sessions"]);
        let script = self.renew.clone();
        self.op("heartbeat", async move |c| {
            c.set_options::<_, _, ()>(
                &alive,
                &instance,
                redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(lease)),
            )
            .await?;
            let mut inv = script.key(&sessions);
            for k in &keys {
                inv.key(k);
            }
            inv.arg(&instance).arg(lease).arg(slots.len());
            for m in &slots {
                inv.arg(m);
            }
            inv.invoke_async::<i64>(c).await.map(drop)
        })
        .await
    }

    /// The first heartbeat, before the server accepts sessions: whether Redis is reachable
    /// decides how the first sessions are admitted and entered in the directory.
    pub(crate) async fn first_heartbeat(&self) {
        let ok = self.heartbeat().await.is_ok();
        self.up.store(ok, Ordering::Relaxed);
        self.metrics.set_cluster_redis_up(ok);
        if ok {
            tracing::info!(instance = %self.instance, "cluster store reachable");
        } else {
            tracing::warn!(instance = %self.instance, "cluster store unreachable at start; serving this instance's sessions alone until it answers");
        }
    }

    /// Whether the last heartbeat reached Redis.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The instances alive now (their liveness keys).
    pub(crate) async fn instances(&self) -> Result<Vec<String>, ClusterError> {
        let pattern = self.key(&["inst", "*"]);
        let skip = self.key(&["inst", ""]).len();
        self.op("instances", async move |c| {
            let mut found = Vec::new();
            let mut iter = c.scan_match::<_, String>(&pattern).await?;
            while let Some(k) = iter.next_item().await {
                found.push(k?.get(skip..).unwrap_or_default().to_owned());
                if found.len() >= 1000 {
                    break;
                }
            }
            found.sort();
            Ok(found)
        })
        .await
    }

    // ---- routing --------------------------------------------------------------------------

    /// Sends `op` for `target` to `instance` and waits for its reply (at most
    /// `[cluster] request_timeout_ms`).
    pub(crate) async fn call(
        &self,
        instance: &str,
        op: &str,
        target: &str,
        body: Value,
    ) -> Result<Reply, ClusterError> {
        self.call_within(instance, op, target, body, self.request_timeout)
            .await
    }

    /// [`Self::call`] waiting up to `wait` for the reply (an operation with its own deadline,
    /// such as a tool call, gets that deadline plus the request timeout).
    pub(crate) async fn call_within(
        &self,
        instance: &str,
        op: &str,
        target: &str,
        body: Value,
        wait: Duration,
    ) -> Result<Reply, ClusterError> {
        self.metrics.cluster_routed();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            if pending.len() >= MAX_PENDING {
                return Err(ClusterError::Busy);
            }
            pending.insert(id, tx);
        }
        let message = serde_json::to_string(&Envelope::Request {
            id,
            from: self.instance.clone(),
            op: op.to_owned(),
            target: target.to_owned(),
            body,
        })
        .unwrap_or_default();
        let channel = self.channel(instance);
        let sent = self
            .op("publish", async move |c| {
                c.publish::<_, _, u64>(&channel, &message).await
            })
            .await;
        let outcome = match sent {
            Err(e) => Err(e),
            Ok(0) => Err(ClusterError::Gone(instance.to_owned())),
            Ok(_) => match tokio::time::timeout(wait, rx).await {
                Ok(Ok(reply)) => Ok(reply),
                // The sender is only dropped when the entry is removed below.
                Ok(Err(_)) | Err(_) => Err(ClusterError::Timeout(instance.to_owned(), wait)),
            },
        };
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        outcome
    }

    /// Handles one message from this instance's routing channel.
    async fn on_message(self: &Arc<Self>, payload: &[u8], handlers: &Handlers) {
        match Envelope::parse(payload) {
            Ok(Envelope::Reply { id, status, body }) => {
                let waiting = self
                    .pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
                if let Some(tx) = waiting {
                    let _ = tx.send(Reply::new(status, body));
                }
            }
            Ok(Envelope::Request {
                id,
                from,
                op,
                target,
                body,
            }) => {
                let this = Arc::clone(self);
                let handlers = Arc::clone(handlers);
                tokio::spawn(async move {
                    let reply = handlers.handle(&op, &target, body).await;
                    let message = serde_json::to_string(&Envelope::Reply {
                        id,
                        status: reply.status,
                        body: reply.body,
                    })
                    .unwrap_or_default();
                    let channel = this.channel(&from);
                    if let Err(e) = this
                        .op("publish", async move |c| {
                            c.publish::<_, _, u64>(&channel, &message).await
                        })
                        .await
                    {
                        tracing::warn!(%op, %from, error = %e, "cluster reply not sent");
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "cluster routing message ignored"),
        }
    }

    /// Runs the heartbeat and the routing subscriber until `stop`, then gives back what this
    /// instance holds.
    pub(crate) async fn run(
        self: Arc<Self>,
        handlers: Handlers,
        bus: Arc<crate::bridge::perception::PerceptionBus>,
        hub: Arc<crate::mcp_endpoint::hub::McpHub>,
        mut stop: watch::Receiver<bool>,
    ) {
        let tools = tokio::spawn(mcp::sync(Arc::clone(&self), hub, stop.clone()));
        let (outbox, queued) = tokio::sync::mpsc::channel(perception::OUTBOX);
        bus.set_outbox(outbox);
        let append = tokio::spawn(perception::append(Arc::clone(&self), queued, stop.clone()));
        let read = tokio::spawn(perception::read(Arc::clone(&self), bus, stop.clone()));
        let beat = {
            let this = Arc::clone(&self);
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(this.lease / 3);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        () = stopped(&mut stop) => break,
                    }
                    let ok = match this.heartbeat().await {
                        Ok(()) => true,
                        Err(e) => {
                            if this.is_up() {
                                tracing::warn!(error = %e, "cluster store unreachable; serving this instance's sessions alone");
                            }
                            false
                        }
                    };
                    this.metrics.set_cluster_redis_up(ok);
                    if ok && !this.up.swap(true, Ordering::Relaxed) {
                        tracing::info!(instance = %this.instance, "cluster store reachable");
                    }
                    if !ok {
                        this.up.store(false, Ordering::Relaxed);
                    }
                }
            })
        };
        let subscriber = {
            let this = Arc::clone(&self);
            let stop = stop.clone();
            tokio::spawn(async move { this.subscribe(handlers, stop).await })
        };
        stopped(&mut stop).await;
        let _ = tokio::join!(subscriber, append, read, tools);
        let _ = beat.await;
        self.give_back().await;
    }

    /// Listens on this instance's routing channel, reconnecting with back-off.
    async fn subscribe(self: Arc<Self>, handlers: Handlers, mut stop: watch::Receiver<bool>) {
        let channel = self.channel(&self.instance);
        let mut backoff = BACKOFF_MIN;
        loop {
            let connected = async {
                let mut pubsub = self.client.get_async_pubsub().await?;
                pubsub.subscribe(&channel).await?;
                redis::RedisResult::Ok(pubsub)
            };
            let pubsub = tokio::select! {
                r = tokio::time::timeout(COMMAND_TIMEOUT, connected) => r,
                () = stopped(&mut stop) => return,
            };
            match pubsub {
                Ok(Ok(pubsub)) => {
                    backoff = BACKOFF_MIN;
                    tracing::debug!(%channel, "cluster routing channel subscribed");
                    let mut messages = pubsub.into_on_message();
                    loop {
                        tokio::select! {
                            m = messages.next() => match m {
                                Some(m) => self.on_message(m.get_payload_bytes(), &handlers).await,
                                None => break,
                            },
                            () = stopped(&mut stop) => return,
                        }
                    }
                    tracing::warn!(%channel, "cluster routing channel lost; reconnecting");
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cluster routing subscribe failed"),
                Err(_) => tracing::debug!("cluster routing subscribe timed out"),
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stopped(&mut stop) => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// At shutdown: releases every directory entry and admission place still held (sessions
    /// that outlived the grace period), and the liveness key.
    async fn give_back(&self) {
        let (keys, slots): (Vec<String>, Vec<String>) = {
            let mut held = self.lock_held();
            (
                held.keys.drain().map(|(k, _)| k).collect(),
                held.slots.drain().collect(),
            )
        };
        let alive = self.key(&["inst", &self.instance]);
        let sessions = self.key(&["sessions"]);
        let instance = self.instance.clone();
        let script = self.release.clone();
        let _ = self
            .op("release", async move |c| {
                for k in &keys {
                    script.key(k).arg(&instance).invoke_async::<i64>(c).await?;
                }
                if !slots.is_empty() {
                    c.zrem::<_, _, i64>(&sessions, &slots).await?;
                }
                c.del::<_, i64>(&alive).await.map(drop)
            })
            .await;
    }

    /// A JSON view for `/admin/cluster`.
    pub(crate) async fn describe(&self) -> Value {
        let (keys, slots) = {
            let held = self.lock_held();
            (held.keys.len(), held.slots.len())
        };
        let instances = self.instances().await;
        let sessions = if self.max_sessions > 0 {
            self.sessions().await.ok()
        } else {
            None
        };
        json!({
            "instance": self.instance,
            "redis": if self.is_up() { "up" } else { "down" },
            "instances": instances.ok(),
            "lease_ms": u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX),
            "held": {"directory_entries": keys, "admission_places": slots},
            "max_sessions": self.max_sessions,
            "sessions": sessions,
            "redis_ops": self.stats.describe(),
        })
    }

    /// How long the perception stream is kept (`XADD MAXLEN ~`).
    pub(crate) fn stream_len(&self) -> usize {
        self.stream_len
    }

    /// A dedicated connection (blocking reads must not stall the shared one).
    pub(crate) async fn dedicated(
        &self,
    ) -> Result<redis::aio::MultiplexedConnection, ClusterError> {
        tokio::time::timeout(
            COMMAND_TIMEOUT,
            self.client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| ClusterError::Unavailable("connect timed out".into()))?
        .map_err(|e| ClusterError::Unavailable(e.to_string()))
    }
}

/// The other instance holding `kind`/`id`, when it is alive (listening on its channel). `None`
/// when nobody holds it, this instance does, or its holder died (its entry expires with its
/// lease). One round trip.
///
/// # Errors
/// Redis could not say.
pub(crate) async fn live_holder(
    cluster: &Cluster,
    kind: Kind,
    id: &str,
) -> Result<Option<String>, ClusterError> {
    let key = cluster.dir_key(kind, id);
    let prefix = cluster.channel("");
    let script = cluster.holder_script.clone();
    let found = cluster
        .op("holder", async move |c| {
            script
                .key(&key)
                .arg(&prefix)
                .invoke_async::<Option<(String, u64)>>(c)
                .await
        })
        .await?;
    Ok(found.and_then(|(holder, listeners)| {
        (holder != cluster.instance() && listeners > 0).then_some(holder)
    }))
}

/// Completes once `stop` says so (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Spawns `f` if a runtime is running (drops can happen outside one, at the very end).
fn spawn(f: impl Future<Output = ()> + Send + 'static) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(f);
    }
}

/// A session's directory entry: released (if it still names this instance) when dropped.
#[derive(Debug)]
#[must_use = "the entry is released when dropped"]
pub(crate) struct DirectoryEntry {
    cluster: Arc<Cluster>,
    key: String,
}

impl Drop for DirectoryEntry {
    fn drop(&mut self) {
        self.cluster.drop_key(&self.key);
    }
}

/// A session's place in the cluster-wide limit: given back when dropped.
#[derive(Debug)]
#[must_use = "the place is given back when dropped"]
pub(crate) struct ClusterSlot {
    cluster: Arc<Cluster>,
    member: String,
}

impl Drop for ClusterSlot {
    fn drop(&mut self) {
        self.cluster.drop_slot(&self.member);
    }
}

/// The server's answers to requests other instances route here.
pub(crate) struct Routed(pub(crate) Arc<crate::server::App>);

#[async_trait::async_trait]
impl Handler for Routed {
    async fn handle(&self, op: &str, target: &str, body: Value) -> Reply {
        match op {
            "xiaozhi.push" => crate::xiaozhi::devices::push(&self.0, target, body, true).await,
            "mcp.call" => mcp::call_here(&self.0.shared.mcp, target, body).await,
            "bridge.message" => crate::bridge::routed_message(&self.0, &body).await,
            "retell.interrupt" | "retell.metadata" => {
                match crate::retell::ControlOp::from_routed(op, body) {
                    Some(c) => crate::retell::control(&self.0, target, c, true).await,
                    None => Reply::new(400, json!({"error": "unreadable routed request"})),
                }
            }
            _ => Reply::new(
                404,
                json!({"ok": false, "error": "unknown_op", "detail": format!("no operation {op:?} here")}),
            ),
        }
    }
}
