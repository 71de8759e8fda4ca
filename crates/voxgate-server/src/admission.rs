//! Admission control: whether a new WebSocket session may start, decided before the handshake
//! so a refused attempt costs the server one small HTTP answer and nothing more.
//!
//! Every door's upgrade handler calls [`Admission::try_admit`] first. It checks, in order, the
//! peer address's handshake rate (a token bucket), the address's open sessions, the door's,
//! the whole server's, and the overload guard (the runtime's scheduling delay, measured by
//! [`Admission::monitor`]). An admitted session gets a [`Permit`] that gives its place back
//! when dropped; a refused one gets a [`Refusal`] that answers 503 or 429 with `Retry-After`
//! and is counted in `voxgate_sessions_refused_total{door,reason}`.
//!
//! The same per-address entries count open TCP connections ([`Admission::try_connect`], every
//! listener's accept loop asks it): beyond `max_connections_per_ip` a new connection is
//! answered and closed at once, so one address cannot take the process's descriptors.
//!
//! All counts live behind one mutex held for a few map operations, so the check-and-take is
//! atomic and costs O(1) per attempt. The per-address map is bounded: an address with no open
//! session and a full bucket is forgotten (by the monitor every few seconds, or at once when
//! the map is full), and beyond [`MAX_TRACKED_IPS`] addresses new ones are refused as
//! overload, so a flood from many addresses cannot grow it without bound.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use crate::config::LimitsConfig;
use crate::metrics::{DOORS, Door, Metrics, RefusalReason};

/// Most peer addresses tracked at once (about 64 bytes each, a few MiB in all). Far more than
/// the sessions a server carries; reached only by a flood from many addresses.
pub(crate) const MAX_TRACKED_IPS: usize = 65_536;

/// How often the overload guard samples the runtime: short enough to see a stall within a
/// 60 ms audio frame or two, long enough to cost nothing (50 wake-ups a second).
const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// How often the monitor forgets idle addresses.
const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// When the map is full, how often an attempt may sweep it for idle addresses (a sweep walks
/// the whole map, so a flood must not trigger one per attempt).
const FULL_SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A token bucket's capacity: one second's worth of handshakes, so a client may burst its
/// whole per-second allowance at once.
const BUCKET: Duration = Duration::from_secs(1);

/// `Retry-After` for a handshake-rate refusal: a token comes back within a second at any rate
/// of one a second or more.
const RETRY_RATE_SECS: u32 = 1;
/// `Retry-After` for capacity, per-address and overload refusals: sessions last minutes, so
/// sooner retries would mostly be refused again.
const RETRY_CAPACITY_SECS: u32 = 5;

/// The limits `try_admit` applies; 0 is off, as in [`LimitsConfig`].
#[derive(Debug, Clone, Copy)]
struct Limits {
    server: usize,
    door: usize,
    per_ip: usize,
    /// Cost of one handshake in bucket credit; `None` when the rate is unlimited.
    handshake_cost: Option<Duration>,
    /// The overload guard's threshold in microseconds; `None` when off.
    max_delay_micros: Option<u64>,
    ip_cap: usize,
    /// Open connections per address; 0: not counted.
    connections_per_ip: usize,
}

impl Limits {
    fn tracks_ips(&self) -> bool {
        self.per_ip > 0 || self.handshake_cost.is_some()
    }
}

/// One peer address: its open sessions and connections, and its handshake bucket.
#[derive(Debug, Clone, Copy)]
struct IpEntry {
    sessions: usize,
    /// Open TCP connections (counted only when `max_connections_per_ip` is set).
    connections: usize,
    /// Handshake credit at `last`, at most [`BUCKET`].
    credit: Duration,
    last: Instant,
}

impl IpEntry {
    fn new(now: Instant) -> Self {
        Self {
            sessions: 0,
            connections: 0,
            credit: BUCKET,
            last: now,
        }
    }

    /// Refills the bucket for the time since the last attempt, then takes `cost` if there is
    /// that much credit.
    fn take(&mut self, cost: Duration, now: Instant) -> bool {
        self.credit = self.credit_at(now);
        self.last = now;
        if self.credit >= cost {
            self.credit -= cost;
            true
        } else {
            false
        }
    }

    fn credit_at(&self, now: Instant) -> Duration {
        self.credit
            .saturating_add(now.saturating_duration_since(self.last))
            .min(BUCKET)
    }

    /// No open session or connection and a full bucket: forgetting the address changes
    /// nothing.
    fn idle(&self, now: Instant) -> bool {
        self.sessions == 0 && self.connections == 0 && self.credit_at(now) >= BUCKET
    }
}

#[derive(Debug)]
struct State {
    total: usize,
    per_door: [usize; DOORS],
    ips: Ips,
}

/// The tracked peer addresses.
#[derive(Debug, Default)]
struct Ips {
    map: HashMap<IpAddr, IpEntry>,
    last_full_sweep: Option<Instant>,
}

impl Ips {
    fn prune(&mut self, now: Instant) {
        self.map.retain(|_, e| !e.idle(now));
    }

    /// The entry of `peer`, made if new; `None` when the map holds `cap` addresses that are
    /// not idle (a sweep for idle ones runs at most every [`FULL_SWEEP_EVERY`]).
    fn entry(&mut self, peer: IpAddr, now: Instant, cap: usize) -> Option<&mut IpEntry> {
        if !self.map.contains_key(&peer) && self.map.len() >= cap {
            let swept_lately = self
                .last_full_sweep
                .is_some_and(|t| now.saturating_duration_since(t) < FULL_SWEEP_EVERY);
            if !swept_lately {
                self.prune(now);
                self.last_full_sweep = Some(now);
            }
            if self.map.len() >= cap {
                return None;
            }
        }
        Some(self.map.entry(peer).or_insert_with(|| IpEntry::new(now)))
    }

    /// Gives back one session or connection of `ip`; forgets the address when it holds
    /// nothing and `keep_buckets` is false (with a rate limit its bucket must outlive its
    /// sessions, or closing and reconnecting would refill it: the prune removes it once full).
    fn release(&mut self, ip: IpAddr, what: fn(&mut IpEntry) -> &mut usize, keep_buckets: bool) {
        if let Some(e) = self.map.get_mut(&ip) {
            let n = what(e);
            *n = n.saturating_sub(1);
            if e.sessions == 0 && e.connections == 0 && !keep_buckets {
                self.map.remove(&ip);
            }
        }
    }
}

#[derive(Debug)]
struct Shared {
    limits: Limits,
    metrics: Arc<Metrics>,
    /// The overload guard's smoothed scheduling delay, in microseconds.
    delay_micros: AtomicU64,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; if something ever did, the counts are still
        // consistent (every update is a single statement), so go on with them.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The server's admission control, shared by every door (cheap to clone: one `Arc`).
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    shared: Arc<Shared>,
}

impl Admission {
    /// Admission under `limits`, counting refusals in `metrics`.
    pub(crate) fn new(limits: &LimitsConfig, metrics: Arc<Metrics>) -> Self {
        Self::with_ip_cap(limits, metrics, MAX_TRACKED_IPS)
    }

    /// Like [`Self::new`] with another bound on tracked addresses (tests).
    fn with_ip_cap(limits: &LimitsConfig, metrics: Arc<Metrics>, ip_cap: usize) -> Self {
        let rate = limits.max_handshakes_per_sec_per_ip;
        let limits = Limits {
            server: limits.max_sessions,
            door: limits.max_sessions_per_door,
            per_ip: limits.max_sessions_per_ip,
            handshake_cost: (rate > 0).then(|| BUCKET / rate),
            max_delay_micros: limits
                .max_scheduling_delay()
                .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            ip_cap,
            connections_per_ip: limits.max_connections_per_ip,
        };
        Self {
            shared: Arc::new(Shared {
                limits,
                metrics,
                delay_micros: AtomicU64::new(0),
                state: Mutex::new(State {
                    total: 0,
                    per_door: [0; DOORS],
                    ips: Ips::default(),
                }),
            }),
        }
    }

    /// Admits a new session of `door` from `peer`, or says why not. Call it before the
    /// WebSocket handshake and keep the [`Permit`] for the session's whole life.
    ///
    /// # Errors
    /// A [`Refusal`] (already counted in the metrics) to answer the request with.
    pub(crate) fn try_admit(&self, door: Door, peer: IpAddr) -> Result<Permit, Refusal> {
        self.admit_at(door, peer, Instant::now())
    }

    /// The refusal of a session the cluster-wide limit turned away, counted.
    pub(crate) fn refuse_cluster(&self, door: Door) -> Refusal {
        self.shared
            .metrics
            .refused(door, RefusalReason::CapacityCluster);
        Refusal {
            door,
            reason: RefusalReason::CapacityCluster,
        }
    }

    /// Admits a new TCP connection from `peer` under `max_connections_per_ip`, or says why
    /// not. Call it right after `accept` and keep the [`ConnectionPermit`] as long as the
    /// socket is open (an upgraded WebSocket session included).
    ///
    /// # Errors
    /// [`ConnectionRefusal`] to answer the connection with before closing it.
    pub(crate) fn try_connect(&self, peer: IpAddr) -> Result<ConnectionPermit, ConnectionRefusal> {
        self.connect_at(peer, Instant::now())
    }

    /// [`Self::try_connect`] at `now`.
    fn connect_at(
        &self,
        peer: IpAddr,
        now: Instant,
    ) -> Result<ConnectionPermit, ConnectionRefusal> {
        let cap = self.shared.limits.connections_per_ip;
        if cap == 0 {
            return Ok(ConnectionPermit {
                shared: Arc::clone(&self.shared),
                ip: None,
            });
        }
        let mut state = self.shared.lock();
        let Some(e) = state.ips.entry(peer, now, self.shared.limits.ip_cap) else {
            return Err(ConnectionRefusal::Overload);
        };
        if e.connections >= cap {
            return Err(ConnectionRefusal::PerIp);
        }
        e.connections += 1;
        Ok(ConnectionPermit {
            shared: Arc::clone(&self.shared),
            ip: Some(peer),
        })
    }

    /// Connections from `peer` holding a permit now.
    #[cfg(test)]
    fn connections(&self, peer: IpAddr) -> usize {
        self.shared
            .lock()
            .ips
            .map
            .get(&peer)
            .map_or(0, |e| e.connections)
    }

    /// [`Self::try_admit`] at `now`, so tests can run it on a virtual clock.
    fn admit_at(&self, door: Door, peer: IpAddr, now: Instant) -> Result<Permit, Refusal> {
        let result = self.decide(door, peer, now);
        if let Err(reason) = result {
            self.shared.metrics.refused(door, reason);
            tracing::debug!(
                door = door.label(),
                %peer,
                reason = reason.label(),
                "session refused"
            );
        }
        result
            .map(|ip| Permit {
                shared: Arc::clone(&self.shared),
                door,
                ip,
            })
            .map_err(|reason| Refusal { door, reason })
    }

    /// The checks, in order; on success the counts are taken and the tracked address (if any)
    /// is returned for the permit to give back.
    fn decide(
        &self,
        door: Door,
        peer: IpAddr,
        now: Instant,
    ) -> Result<Option<IpAddr>, RefusalReason> {
        let limits = self.shared.limits;
        let mut state = self.shared.lock();
        let state = &mut *state;
        let mut entry = None;
        if limits.tracks_ips() {
            let e = state
                .ips
                .entry(peer, now, limits.ip_cap)
                .ok_or(RefusalReason::Overload)?;
            if let Some(cost) = limits.handshake_cost
                && !e.take(cost, now)
            {
                return Err(RefusalReason::HandshakeRate);
            }
            if limits.per_ip > 0 && e.sessions >= limits.per_ip {
                return Err(RefusalReason::PerIp);
            }
            entry = Some(e);
        }
        if limits.door > 0 && state.per_door[door.index()] >= limits.door {
            return Err(RefusalReason::CapacityDoor);
        }
        if limits.server > 0 && state.total >= limits.server {
            return Err(RefusalReason::CapacityServer);
        }
        if limits
            .max_delay_micros
            .is_some_and(|max| self.shared.delay_micros.load(Ordering::Relaxed) > max)
        {
            return Err(RefusalReason::Overload);
        }
        state.total += 1;
        state.per_door[door.index()] += 1;
        Ok(entry.map(|e| {
            e.sessions += 1;
            peer
        }))
    }

    /// Sets the smoothed scheduling delay the overload guard compares (the monitor does; tests
    /// may) and exports it as `voxgate_scheduling_delay_seconds`.
    fn set_scheduling_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_micros.store(micros, Ordering::Relaxed);
        self.shared.metrics.set_scheduling_delay(delay);
    }

    /// Forgets addresses with no open session and a full bucket.
    fn prune(&self, now: Instant) {
        self.shared.lock().ips.prune(now);
    }

    /// Addresses tracked now.
    #[cfg(test)]
    fn tracked_ips(&self) -> usize {
        self.shared.lock().ips.map.len()
    }

    /// Sessions holding a permit now, over the whole server.
    #[cfg(test)]
    fn admitted(&self) -> usize {
        self.shared.lock().total
    }

    /// The overload guard: until `stop` turns true (or its sender goes), sleeps
    /// [`SAMPLE_EVERY`] at a time and records how late each wake-up was, smoothed by
    /// [`DelayFilter`]; also forgets idle addresses every [`PRUNE_EVERY`]. `Server::run`
    /// spawns it.
    pub(crate) async fn monitor(self, mut stop: watch::Receiver<bool>) {
        let mut filter = DelayFilter::default();
        let mut last_prune = Instant::now();
        let sampling = async {
            loop {
                let asleep = tokio::time::Instant::now();
                tokio::time::sleep(SAMPLE_EVERY).await;
                let late = asleep.elapsed().saturating_sub(SAMPLE_EVERY);
                self.set_scheduling_delay(filter.record(late));
                let now = Instant::now();
                if now.saturating_duration_since(last_prune) >= PRUNE_EVERY {
                    self.prune(now);
                    last_prune = now;
                }
            }
        };
        tokio::select! {
            () = sampling => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
}

/// Smooths wake-up lateness samples into the overload guard's figure: it rises by half the gap
/// to a higher sample and falls by an eighth of the gap to a lower one. A sustained stall
/// trips the guard within three samples; a lone hiccup under twice the threshold does not;
/// and the figure comes down over a few hundred milliseconds, so admission does not flap.
#[derive(Debug, Default, Clone, Copy)]
struct DelayFilter {
    micros: u64,
}

impl DelayFilter {
    /// Adds one sample; returns the new figure.
    fn record(&mut self, late: Duration) -> Duration {
        let x = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        if x >= self.micros {
            self.micros += (x - self.micros).div_ceil(2);
        } else {
            self.micros -= (self.micros - x).div_ceil(8);
        }
        Duration::from_micros(self.micros)
    }
}

/// An admitted session's place: the counts it took are given back when it is dropped. Move it
/// into the session task and hold it until the session ends.
#[derive(Debug)]
#[must_use = "the session's place is given back when the permit is dropped"]
pub(crate) struct Permit {
    shared: Arc<Shared>,
    door: Door,
    /// The tracked address whose session count this permit holds.
    ip: Option<IpAddr>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let limits = self.shared.limits;
        let mut state = self.shared.lock();
        state.total = state.total.saturating_sub(1);
        let d = &mut state.per_door[self.door.index()];
        *d = d.saturating_sub(1);
        if let Some(ip) = self.ip {
            state
                .ips
                .release(ip, |e| &mut e.sessions, limits.handshake_cost.is_some());
        }
    }
}

/// An open connection's place in its address's count, given back when dropped. It travels
/// with the socket (an upgraded WebSocket session keeps it).
#[derive(Debug)]
#[must_use = "the connection's place is given back when the permit is dropped"]
pub(crate) struct ConnectionPermit {
    shared: Arc<Shared>,
    /// The address whose connection count this permit holds; `None` when not counted.
    ip: Option<IpAddr>,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        if let Some(ip) = self.ip {
            let keep = self.shared.limits.handshake_cost.is_some();
            self.shared
                .lock()
                .ips
                .release(ip, |e| &mut e.connections, keep);
        }
    }
}

/// Why a new connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionRefusal {
    /// Its address already holds `max_connections_per_ip` connections.
    PerIp,
    /// The per-address table is full ([`MAX_TRACKED_IPS`] busy addresses).
    Overload,
}

impl ConnectionRefusal {
    /// A whole HTTP/1.1 answer, small enough for one non-blocking write on a fresh socket:
    /// `429` for the address over its share, `503` when the server tracks too many.
    pub(crate) fn response(self) -> &'static [u8] {
        match self {
            Self::PerIp => {
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 5\r\n\
                  Content-Type: text/plain; charset=utf-8\r\nContent-Length: 38\r\n\
                  Connection: close\r\n\r\ntoo many connections from this address"
            }
            Self::Overload => {
                b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\n\
                  Content-Type: text/plain; charset=utf-8\r\nContent-Length: 17\r\n\
                  Connection: close\r\n\r\nserver overloaded"
            }
        }
    }
}

/// An admitted session's places: this instance's [`Permit`] and, with a cluster-wide limit,
/// its place in the cluster (`crate::cluster`). Hold it for the session's whole life.
#[derive(Debug)]
#[must_use = "the session's places are given back when this is dropped"]
pub(crate) struct Admitted {
    /// The place on this instance (held for its `Drop`).
    pub(crate) _permit: Permit,
    /// The place in the cluster, when `[cluster] max_sessions` is set (held for its `Drop`).
    pub(crate) _slot: Option<crate::cluster::ClusterSlot>,
}

/// A refused session: which door, and why. Answers the upgrade request as an HTTP error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    door: Door,
    reason: RefusalReason,
}

impl Refusal {
    /// Why the session was refused.
    #[cfg_attr(not(test), allow(dead_code, reason = "for tests"))]
    pub(crate) fn reason(self) -> RefusalReason {
        self.reason
    }

    /// The door it was refused at.
    #[cfg_attr(not(test), allow(dead_code, reason = "for tests"))]
    pub(crate) fn door(self) -> Door {
        self.door
    }

    /// 429 when the peer itself is over its share (it should slow down), 503 when the server
    /// is full or overloaded (anyone would be refused).
    pub(crate) fn status(self) -> StatusCode {
        match self.reason {
            RefusalReason::PerIp | RefusalReason::HandshakeRate => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The `Retry-After` value, in seconds.
    pub(crate) fn retry_after_secs(self) -> u32 {
        match self.reason {
            RefusalReason::HandshakeRate => RETRY_RATE_SECS,
            _ => RETRY_CAPACITY_SECS,
        }
    }

    /// What the refused client is told.
    pub(crate) fn message(self) -> &'static str {
        match self.reason {
            RefusalReason::CapacityServer => "server at capacity: too many sessions",
            RefusalReason::CapacityDoor => "door at capacity: too many sessions",
            RefusalReason::CapacityCluster => "cluster at capacity: too many sessions",
            RefusalReason::PerIp => "too many sessions from this address",
            RefusalReason::HandshakeRate => "too many connection attempts from this address",
            _ => "server overloaded",
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (
            self.status(),
            [
                (header::RETRY_AFTER, self.retry_after_secs().to_string()),
                (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_owned()),
            ],
            self.message(),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn ip(n: u16) -> IpAddr {
        let [hi, lo] = n.to_be_bytes();
        IpAddr::V4(Ipv4Addr::new(10, 0, hi, lo))
    }

    fn limits() -> LimitsConfig {
        LimitsConfig {
            max_sessions: 0,
            max_sessions_per_door: 0,
            max_sessions_per_ip: 0,
            max_handshakes_per_sec_per_ip: 0,
            max_scheduling_delay_ms: 0,
            max_connections_per_ip: 0,
            ..LimitsConfig::default()
        }
    }

    fn admission(l: &LimitsConfig) -> (Admission, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        (Admission::new(l, Arc::clone(&metrics)), metrics)
    }

    fn reason(r: Result<Permit, Refusal>) -> RefusalReason {
        r.expect_err("expected a refusal").reason()
    }

    #[test]
    fn everything_off_admits_anything_and_tracks_nothing() {
        let (a, _) = admission(&limits());
        let t = Instant::now();
        let permits: Vec<_> = (0..1000_u16)
            .map(|i| a.admit_at(Door::Realtime, ip(i % 7), t).unwrap())
            .collect();
        assert_eq!(a.admitted(), 1000);
        assert_eq!(a.tracked_ips(), 0);
        drop(permits);
        assert_eq!(a.admitted(), 0);
    }

    #[test]
    fn server_and_door_capacity_and_release_on_drop() {
        let (a, metrics) = admission(&LimitsConfig {
            max_sessions: 3,
            max_sessions_per_door: 2,
            ..limits()
        });
        let t = Instant::now();
        let x1 = a.admit_at(Door::Xiaozhi, ip(1), t).unwrap();
        let x2 = a.admit_at(Door::Xiaozhi, ip(2), t).unwrap();
        let refused = a.admit_at(Door::Xiaozhi, ip(3), t).unwrap_err();
        assert_eq!(refused.reason(), RefusalReason::CapacityDoor);
        assert_eq!(refused.door(), Door::Xiaozhi);
        let r1 = a.admit_at(Door::Realtime, ip(3), t).unwrap();
        assert_eq!(
            reason(a.admit_at(Door::Realtime, ip(4), t)),
            RefusalReason::CapacityServer
        );
        // A place at the door frees one on the server too.
        drop(x1);
        let x3 = a.admit_at(Door::Xiaozhi, ip(5), t).unwrap();
        assert_eq!(
            reason(a.admit_at(Door::Realtime, ip(6), t)),
            RefusalReason::CapacityServer
        );
        drop(r1);
        let r2 = a.admit_at(Door::Realtime, ip(6), t).unwrap();
        assert_eq!(a.admitted(), 3);
        drop((x2, x3, r2));
        assert_eq!(a.admitted(), 0);
        assert_eq!(
            metrics.refused_sessions(Door::Xiaozhi, RefusalReason::CapacityDoor),
            1
        );
        assert_eq!(
            metrics.refused_sessions(Door::Realtime, RefusalReason::CapacityServer),
            2
        );
    }

    #[test]
    fn per_ip_sessions_across_doors() {
        let (a, _) = admission(&LimitsConfig {
            max_sessions_per_ip: 2,
            ..limits()
        });
        let t = Instant::now();
        let p1 = a.admit_at(Door::Xiaozhi, ip(1), t).unwrap();
        let _p2 = a.admit_at(Door::Gemini, ip(1), t).unwrap();
        assert_eq!(
            reason(a.admit_at(Door::Retell, ip(1), t)),
            RefusalReason::PerIp
        );
        let _other = a.admit_at(Door::Retell, ip(2), t).unwrap();
        drop(p1);
        let _p3 = a.admit_at(Door::Retell, ip(1), t).unwrap();
        assert_eq!(a.tracked_ips(), 2);
    }

    #[test]
    fn addresses_without_sessions_are_forgotten_when_there_is_no_rate_limit() {
        let (a, _) = admission(&LimitsConfig {
            max_sessions_per_ip: 2,
            ..limits()
        });
        let p = a.admit_at(Door::Xiaozhi, ip(1), Instant::now()).unwrap();
        assert_eq!(a.tracked_ips(), 1);
        drop(p);
        assert_eq!(a.tracked_ips(), 0);
    }

    #[test]
    fn handshake_rate_is_a_token_bucket_on_a_virtual_clock() {
        let (a, metrics) = admission(&LimitsConfig {
            max_handshakes_per_sec_per_ip: 4,
            ..limits()
        });
        let t0 = Instant::now();
        // A burst of one second's allowance passes; a refused attempt takes no permit.
        for _ in 0..4 {
            drop(a.admit_at(Door::Realtime, ip(1), t0).unwrap());
        }
        let refused = a.admit_at(Door::Realtime, ip(1), t0).unwrap_err();
        assert_eq!(refused.reason(), RefusalReason::HandshakeRate);
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.retry_after_secs(), 1);
        // Other addresses have their own buckets.
        drop(a.admit_at(Door::Realtime, ip(2), t0).unwrap());
        // One token every 250 ms.
        let t = t0 + Duration::from_millis(249);
        assert_eq!(
            reason(a.admit_at(Door::Realtime, ip(1), t)),
            RefusalReason::HandshakeRate
        );
        let t = t0 + Duration::from_millis(250);
        drop(a.admit_at(Door::Realtime, ip(1), t).unwrap());
        assert_eq!(
            reason(a.admit_at(Door::Realtime, ip(1), t)),
            RefusalReason::HandshakeRate
        );
        // A long pause refills to the burst, no more.
        let t = t0 + Duration::from_secs(60);
        for _ in 0..4 {
            drop(a.admit_at(Door::Realtime, ip(1), t).unwrap());
        }
        assert_eq!(
            reason(a.admit_at(Door::Realtime, ip(1), t)),
            RefusalReason::HandshakeRate
        );
        assert_eq!(
            metrics.refused_sessions(Door::Realtime, RefusalReason::HandshakeRate),
            4
        );
        assert_eq!(a.admitted(), 0);
    }

    #[test]
    fn rate_is_checked_before_sessions_and_reconnecting_does_not_refill() {
        let (a, _) = admission(&LimitsConfig {
            max_sessions_per_ip: 1,
            max_handshakes_per_sec_per_ip: 2,
            ..limits()
        });
        let t = Instant::now();
        let held = a.admit_at(Door::Xiaozhi, ip(1), t).unwrap();
        assert_eq!(
            reason(a.admit_at(Door::Xiaozhi, ip(1), t)),
            RefusalReason::PerIp
        );
        assert_eq!(
            reason(a.admit_at(Door::Xiaozhi, ip(1), t)),
            RefusalReason::HandshakeRate,
            "the refused attempt still spent a token"
        );
        drop(held);
        assert_eq!(a.tracked_ips(), 1, "its bucket is not full yet");
        assert_eq!(
            reason(a.admit_at(Door::Xiaozhi, ip(1), t)),
            RefusalReason::HandshakeRate
        );
        // Once the bucket is full again the address is idle and the prune forgets it.
        a.prune(t + Duration::from_millis(999));
        assert_eq!(a.tracked_ips(), 1);
        a.prune(t + Duration::from_secs(1));
        assert_eq!(a.tracked_ips(), 0);
    }

    #[test]
    fn tracked_addresses_are_capped_and_idle_ones_swept_when_full() {
        let metrics = Arc::new(Metrics::new());
        let a = Admission::with_ip_cap(
            &LimitsConfig {
                max_handshakes_per_sec_per_ip: 10,
                ..limits()
            },
            Arc::clone(&metrics),
            3,
        );
        let t = Instant::now();
        let held: Vec<_> = (1..=2)
            .map(|i| a.admit_at(Door::Gemini, ip(i), t).unwrap())
            .collect();
        drop(a.admit_at(Door::Gemini, ip(3), t).unwrap());
        assert_eq!(a.tracked_ips(), 3);
        // A new address beyond the cap: the sweep finds nothing idle yet.
        assert_eq!(
            reason(a.admit_at(Door::Gemini, ip(4), t)),
            RefusalReason::Overload
        );
        // Known addresses still get in.
        drop(a.admit_at(Door::Gemini, ip(3), t).unwrap());
        // Within a second of that sweep, none runs again, even though ip(3) is idle by then.
        let later = t + Duration::from_millis(900);
        assert_eq!(
            reason(a.admit_at(Door::Gemini, ip(5), later)),
            RefusalReason::Overload
        );
        // After it, the sweep forgets ip(3) (bucket full, no session) and makes room.
        let later = t + Duration::from_millis(1500);
        drop(a.admit_at(Door::Gemini, ip(5), later).unwrap());
        assert_eq!(a.tracked_ips(), 3);
        assert_eq!(
            metrics.refused_sessions(Door::Gemini, RefusalReason::Overload),
            2
        );
        drop(held);
    }

    #[test]
    fn connections_per_address_are_capped_and_given_back_on_drop() {
        let (a, _) = admission(&LimitsConfig {
            max_connections_per_ip: 2,
            max_sessions_per_ip: 1,
            ..limits()
        });
        let t = Instant::now();
        let c1 = a.connect_at(ip(1), t).unwrap();
        let c2 = a.connect_at(ip(1), t).unwrap();
        assert_eq!(
            a.connect_at(ip(1), t).unwrap_err(),
            ConnectionRefusal::PerIp
        );
        let _other = a.connect_at(ip(2), t).unwrap();
        // Sessions are counted apart from connections, on the same entry.
        let session = a.admit_at(Door::Xiaozhi, ip(1), t).unwrap();
        drop(c1);
        assert_eq!(a.connections(ip(1)), 1);
        let c3 = a.connect_at(ip(1), t).unwrap();
        drop((c2, c3));
        assert_eq!(a.connections(ip(1)), 0);
        assert_eq!(a.tracked_ips(), 2, "its session keeps the address");
        drop(session);
        assert_eq!(a.tracked_ips(), 1);
        // Off: nothing is tracked.
        let (off, _) = admission(&limits());
        let held: Vec<_> = (0..300)
            .map(|_| off.connect_at(ip(1), t).unwrap())
            .collect();
        assert_eq!(off.tracked_ips(), 0);
        drop(held);
    }

    #[test]
    fn connections_refused_when_the_address_table_is_full() {
        let metrics = Arc::new(Metrics::new());
        let a = Admission::with_ip_cap(
            &LimitsConfig {
                max_connections_per_ip: 4,
                ..limits()
            },
            metrics,
            2,
        );
        let t = Instant::now();
        let _held: Vec<_> = (1..=2).map(|i| a.connect_at(ip(i), t).unwrap()).collect();
        assert_eq!(
            a.connect_at(ip(3), t).unwrap_err(),
            ConnectionRefusal::Overload
        );
        for r in [ConnectionRefusal::PerIp, ConnectionRefusal::Overload] {
            let text = std::str::from_utf8(r.response()).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(
                head.contains(&format!("Content-Length: {}", body.len())),
                "{text}"
            );
        }
    }

    #[test]
    fn overload_guard_refuses_while_the_delay_is_high() {
        let (a, metrics) = admission(&LimitsConfig {
            max_scheduling_delay_ms: 50,
            max_sessions: 10,
            ..limits()
        });
        let t = Instant::now();
        a.set_scheduling_delay(Duration::from_millis(50));
        let p = a.admit_at(Door::Mcp, ip(1), t).unwrap();
        a.set_scheduling_delay(Duration::from_micros(50_001));
        let refused = a.admit_at(Door::Mcp, ip(1), t).unwrap_err();
        assert_eq!(refused.reason(), RefusalReason::Overload);
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(metrics.scheduling_delay(), Duration::from_micros(50_001));
        a.set_scheduling_delay(Duration::from_millis(3));
        drop(a.admit_at(Door::Mcp, ip(1), t).unwrap());
        drop(p);
        // Off: never refuses for it.
        let (off, _) = admission(&limits());
        off.set_scheduling_delay(Duration::from_secs(5));
        drop(off.admit_at(Door::Mcp, ip(1), t).unwrap());
    }

    #[test]
    fn delay_filter_trips_on_stalls_not_on_a_hiccup() {
        let ms = Duration::from_millis;
        let mut f = DelayFilter::default();
        assert_eq!(f.record(ms(1)), Duration::from_micros(500));
        let mut f = DelayFilter::default();
        // A lone 90 ms hiccup stays under a 50 ms threshold and decays.
        assert!(f.record(ms(90)) <= ms(50));
        let mut last = ms(45);
        for _ in 0..10 {
            let v = f.record(ms(1));
            assert!(v < last);
            last = v;
        }
        assert!(last < ms(15), "{last:?}");
        // A sustained 60 ms stall trips it within three samples.
        let mut f = DelayFilter::default();
        f.record(ms(60));
        f.record(ms(60));
        assert!(f.record(ms(60)) > ms(50));
        // And it converges to a steady value exactly.
        for _ in 0..20 {
            f.record(ms(60));
        }
        assert_eq!(f.record(ms(60)), ms(60));
    }

    #[test]
    fn refusals_answer_with_status_retry_after_and_reason() {
        let cases = [
            (RefusalReason::CapacityServer, 503, "5"),
            (RefusalReason::CapacityDoor, 503, "5"),
            (RefusalReason::PerIp, 429, "5"),
            (RefusalReason::HandshakeRate, 429, "1"),
            (RefusalReason::Overload, 503, "5"),
        ];
        for (reason, status, retry) in cases {
            let r = Refusal {
                door: Door::Xiaozhi,
                reason,
            }
            .into_response();
            assert_eq!(r.status().as_u16(), status, "{reason:?}");
            assert_eq!(r.headers()[header::RETRY_AFTER], retry, "{reason:?}");
            assert!(
                r.headers()[header::CONTENT_TYPE]
                    .to_str()
                    .unwrap()
                    .starts_with("text/plain")
            );
        }
    }

    #[tokio::test]
    async fn monitor_runs_until_shutdown_or_until_the_server_is_gone() {
        let (a, metrics) = admission(&limits());
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(a.clone().monitor(stopped));
        tokio::time::sleep(SAMPLE_EVERY * 5).await;
        assert!(!task.is_finished());
        // An idle runtime wakes timers within a few milliseconds.
        assert!(metrics.scheduling_delay() < Duration::from_secs(1));
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .unwrap()
            .unwrap();
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(a.monitor(stopped));
        drop(stop);
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .unwrap()
            .unwrap();
    }
}
