//! The call registry: the Retell calls this server knows, and whether a new socket may have
//! one.
//!
//! # The rule
//! A call belongs to one socket at a time. While that socket is live, another socket for the
//! same `call_id` is refused ([`Claim::Busy`]; 409 at the door) and the live one is left alone:
//! a call id is no secret (it shows in Retell's dashboard, webhooks and logs), and letting a
//! second socket take a live call over would let anyone who learns one cut the real Retell
//! connection off and speak for the agent. When the socket closes (cleanly or by a drop), the
//! call's state is parked for the resume window: a socket that arrives within it resumes the
//! call, which is what Retell's reconnect (`auto_reconnect`) needs; one that arrives later
//! starts a new call.
//!
//! # Pieces
//! [`Calls`] is the decision, pure: a map, with the time passed in, unit-tested below.
//! [`Registry`] wraps it in a mutex, so checking and taking a call is one step (of two
//! reconnects at once exactly one gets the call), hands the state out in a [`Lease`] that puts
//! it back when dropped (with the session, whichever way the socket ended), and wakes upgrades
//! waiting out the reconnect grace ([`Registry::claim_within`]).

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};

use super::Control;
use super::session::CallState;

/// Queue of control requests per connected call.
const CONTROL_QUEUE: usize = 16;

/// Calls (connected or parked for resuming) one server keeps at most; new call ids beyond it
/// are refused so a flood of connections cannot grow the registry without bound.
pub(crate) const MAX_CALLS: usize = 10_000;
/// Largest state one parked call keeps (its conversation as the cluster store would save it):
/// a real call's is a few KiB to tens of KiB; one over this is forgotten as its socket closes
/// (a reconnect then starts afresh) instead of holding up to a 16 MiB frame for the window.
pub(crate) const MAX_PARKED_CALL_BYTES: usize = 1024 * 1024;
/// Most bytes all parked calls keep together; beyond, the longest parked are forgotten first.
pub(crate) const MAX_PARKED_BYTES: usize = 64 * 1024 * 1024;

/// What a parked call costs in memory, as the registry counts it.
pub(crate) trait ParkedSize {
    /// Bytes kept while parked.
    fn parked_bytes(&self) -> usize;
}

impl ParkedSize for CallState {
    fn parked_bytes(&self) -> usize {
        self.to_saved().len()
    }
}

/// What [`Calls::claim`] decided.
#[derive(Debug)]
pub(crate) enum Claim<S> {
    /// The socket has the call: a new one (`resumed == false`, fresh state) or a parked one
    /// within the resume window (its state as the last socket left it).
    Granted {
        /// The call's state, the socket's until it releases it.
        state: S,
        /// Whether this continues a call a closed socket left.
        resumed: bool,
    },
    /// Another socket of this call is live: it keeps the call.
    Busy,
    /// The registry is full of other calls.
    Full,
}

/// One known call.
#[derive(Debug)]
enum Slot<S> {
    /// A socket has it; control API requests go to that socket.
    Live { control: mpsc::Sender<Control> },
    /// No socket has it since `since`; its state (of `bytes`) waits for a reconnect.
    Parked {
        state: S,
        since: Instant,
        bytes: usize,
    },
}

/// The calls by `call_id`, and the rule deciding who gets one. No I/O, no clock.
#[derive(Debug)]
pub(crate) struct Calls<S> {
    map: HashMap<String, Slot<S>>,
    capacity: usize,
    /// Bytes of all parked states.
    parked_bytes: usize,
    max_parked_call_bytes: usize,
    max_parked_bytes: usize,
}

impl<S: ParkedSize> Calls<S> {
    /// An empty registry holding at most `capacity` calls, parked ones within
    /// [`MAX_PARKED_CALL_BYTES`] each and [`MAX_PARKED_BYTES`] together.
    pub(crate) fn new(capacity: usize) -> Self {
        Self::with_parked_bytes(capacity, MAX_PARKED_CALL_BYTES, MAX_PARKED_BYTES)
    }

    /// An empty registry with its own byte bounds for parked calls.
    pub(crate) fn with_parked_bytes(capacity: usize, per_call: usize, total: usize) -> Self {
        Self {
            map: HashMap::new(),
            capacity,
            parked_bytes: 0,
            max_parked_call_bytes: per_call,
            max_parked_bytes: total,
        }
    }

    /// Bytes all parked calls keep.
    #[cfg(test)]
    pub(crate) fn parked_bytes(&self) -> usize {
        self.parked_bytes
    }

    /// Takes `call_id`'s slot out, keeping the parked byte count right.
    fn take(&mut self, call_id: &str) -> Option<Slot<S>> {
        let slot = self.map.remove(call_id)?;
        if let Slot::Parked { bytes, .. } = &slot {
            self.parked_bytes -= bytes;
        }
        Some(slot)
    }

    /// Parks `state`, within the byte bounds: `false` (and nothing kept) when it alone is
    /// over the per-call bound; the longest parked others are forgotten to make room.
    fn park(&mut self, call_id: &str, state: S, since: Instant) -> bool {
        let bytes = state.parked_bytes();
        if bytes > self.max_parked_call_bytes {
            return false;
        }
        while self.parked_bytes + bytes > self.max_parked_bytes {
            let oldest = self
                .map
                .iter()
                .filter_map(|(id, slot)| match slot {
                    Slot::Parked { since, .. } => Some((*since, id.clone())),
                    Slot::Live { .. } => None,
                })
                .min();
            match oldest {
                Some((_, id)) => {
                    self.take(&id);
                }
                None => return false,
            }
        }
        self.parked_bytes += bytes;
        self.map.insert(
            call_id.to_owned(),
            Slot::Parked {
                state,
                since,
                bytes,
            },
        );
        true
    }

    /// A socket for `call_id` asks for the call at `now`; parked calls resume within `window`
    /// of their socket closing. On [`Claim::Granted`] the call is live with `control` as its
    /// control channel until [`Calls::release`].
    pub(crate) fn claim(
        &mut self,
        call_id: &str,
        now: Instant,
        window: Duration,
        control: mpsc::Sender<Control>,
        new_state: impl FnOnce() -> S,
    ) -> Claim<S> {
        let (state, resumed) = match self.take(call_id) {
            Some(live @ Slot::Live { .. }) => {
                self.map.insert(call_id.to_owned(), live);
                return Claim::Busy;
            }
            Some(Slot::Parked { state, since, .. }) if Self::within(since, now, window) => {
                (state, true)
            }
            // Unknown, or parked for longer than the window: a new call.
            _ => {
                if self.map.len() >= self.capacity {
                    self.prune(now, window);
                    if self.map.len() >= self.capacity {
                        return Claim::Full;
                    }
                }
                (new_state(), false)
            }
        };
        self.map.insert(call_id.to_owned(), Slot::Live { control });
        Claim::Granted { state, resumed }
    }

    /// The live socket of `call_id` closed at `now`: park its state for `window` (a zero
    /// window forgets the call at once, and so does a state over the per-call byte bound).
    /// Only the socket that claimed the call calls this ([`Lease`] makes sure), so the slot
    /// is always the live one. `false` when the call was forgotten.
    pub(crate) fn release(
        &mut self,
        call_id: &str,
        state: S,
        now: Instant,
        window: Duration,
    ) -> bool {
        self.take(call_id);
        !window.is_zero() && self.park(call_id, state, now)
    }

    /// Parks `state` for `call_id` at `now` unless a socket has the call here: the call's
    /// conversation as another instance saved it (`crate::cluster`), which replaces an older
    /// one parked here. `false` when the call is live here or the registry is full.
    pub(crate) fn adopt(
        &mut self,
        call_id: &str,
        state: S,
        now: Instant,
        window: Duration,
    ) -> bool {
        match self.map.get(call_id) {
            Some(Slot::Live { .. }) => return false,
            Some(Slot::Parked { .. }) => {
                self.take(call_id);
            }
            None => {
                if self.map.len() >= self.capacity {
                    self.prune(now, window);
                    if self.map.len() >= self.capacity {
                        return false;
                    }
                }
            }
        }
        self.park(call_id, state, now)
    }

    /// Forgets `call_id` if it is parked and its window has passed at `now`.
    pub(crate) fn expire(&mut self, call_id: &str, now: Instant, window: Duration) {
        if let Some(Slot::Parked { since, .. }) = self.map.get(call_id)
            && !Self::within(*since, now, window)
        {
            self.take(call_id);
        }
    }

    /// Forgets every parked call whose window has passed at `now`.
    fn prune(&mut self, now: Instant, window: Duration) {
        let mut freed = 0;
        self.map.retain(|_, slot| match slot {
            Slot::Live { .. } => true,
            Slot::Parked { since, bytes, .. } => {
                let keep = Self::within(*since, now, window);
                if !keep {
                    freed += *bytes;
                }
                keep
            }
        });
        self.parked_bytes -= freed;
    }

    fn within(since: Instant, now: Instant, window: Duration) -> bool {
        now.saturating_duration_since(since) < window
    }

    /// The control channel of `call_id` while a socket has it.
    pub(crate) fn control(&self, call_id: &str) -> Option<mpsc::Sender<Control>> {
        match self.map.get(call_id)? {
            Slot::Live { control } => Some(control.clone()),
            Slot::Parked { .. } => None,
        }
    }

    /// Every known call with whether a socket has it, sorted by id.
    pub(crate) fn list(&self) -> Vec<(String, bool)> {
        let mut calls: Vec<_> = self
            .map
            .iter()
            .map(|(id, slot)| (id.clone(), matches!(slot, Slot::Live { .. })))
            .collect();
        calls.sort();
        calls
    }
}

/// Why [`Registry::claim`] gave no call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A live socket has the call (409).
    Busy,
    /// Too many calls (503).
    Full,
}

/// The calls this server knows, shared by the door's handlers and sessions.
#[derive(Debug)]
pub(crate) struct Registry {
    calls: Mutex<Calls<CallState>>,
    /// Signalled whenever a socket releases a call, for upgrades waiting out the grace.
    released: Notify,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            calls: Mutex::new(Calls::new(MAX_CALLS)),
            released: Notify::new(),
        }
    }
}

impl Registry {
    /// An empty registry whose parked calls keep at most `per_call` bytes each and `total`
    /// together (`[retell] max_parked_call_bytes`, `max_parked_bytes`).
    pub(crate) fn with_parked_bytes(per_call: usize, total: usize) -> Self {
        Self {
            calls: Mutex::new(Calls::with_parked_bytes(MAX_CALLS, per_call, total)),
            released: Notify::new(),
        }
    }
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Calls<CallState>> {
        // A panic elsewhere cannot leave the map inconsistent: every update is one operation.
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims `call_id` for a new socket now (see [`Calls::claim`]).
    pub(crate) fn claim(
        self: &Arc<Self>,
        call_id: &str,
        window: Duration,
        new_state: impl FnOnce() -> CallState,
    ) -> Result<Lease, Refused> {
        let (control_tx, control) = mpsc::channel(CONTROL_QUEUE);
        let claim = self
            .lock()
            .claim(call_id, Instant::now(), window, control_tx, new_state);
        match claim {
            Claim::Granted { state, resumed } => Ok(Lease {
                registry: Arc::clone(self),
                call_id: call_id.to_owned(),
                window,
                state,
                resumed,
                control: Some(control),
            }),
            Claim::Busy => Err(Refused::Busy),
            Claim::Full => Err(Refused::Full),
        }
    }

    /// Claims `call_id`, waiting up to `grace` for a live socket of the call to close first.
    ///
    /// Retell reconnects the moment it gives up on a socket, and its close frame (or our
    /// noticing the silence) can reach the session a little after the new upgrade reaches the
    /// handler; without the wait such a reconnect would be refused. A socket that stays live
    /// is never disturbed: after `grace` the answer is [`Refused::Busy`].
    pub(crate) async fn claim_within(
        self: &Arc<Self>,
        call_id: &str,
        window: Duration,
        grace: Duration,
        new_state: impl Fn() -> CallState,
    ) -> Result<Lease, Refused> {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            // Registered before the attempt, so a release between the two is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            match self.claim(call_id, window, &new_state) {
                Err(Refused::Busy) => {}
                other => return other,
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Err(Refused::Busy);
            }
        }
    }

    /// Parks a closed socket's call and wakes waiting upgrades; forgets it once the window
    /// passes (when a runtime is there to keep time; otherwise at the next claim that needs
    /// the room, or the next claim of the same id).
    fn release(self: &Arc<Self>, call_id: &str, state: CallState, window: Duration) {
        let parked = self.lock().release(call_id, state, Instant::now(), window);
        self.released.notify_waiters();
        if !parked {
            if !window.is_zero() {
                tracing::warn!(
                    "a closed Retell call's state is over [retell] max_parked_call_bytes (or \
                     max_parked_bytes is taken by live-window calls): forgotten, a reconnect \
                     starts afresh"
                );
            }
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let registry = Arc::clone(self);
            let call_id = call_id.to_owned();
            runtime.spawn(async move {
                tokio::time::sleep(window).await;
                registry.lock().expire(&call_id, Instant::now(), window);
            });
        }
    }

    /// The control channel of `call_id` while a socket has it.
    pub(crate) fn control(&self, call_id: &str) -> Option<mpsc::Sender<Control>> {
        self.lock().control(call_id)
    }

    /// Parks a call's conversation saved by another instance, so the next claim resumes it
    /// ([`Calls::adopt`]).
    pub(crate) fn adopt(&self, call_id: &str, state: CallState, window: Duration) -> bool {
        self.lock().adopt(call_id, state, Instant::now(), window)
    }

    /// Every known call as `{"call_id", "connected"}` (the control API's listing).
    pub(crate) fn list(&self) -> Vec<serde_json::Value> {
        self.lock()
            .list()
            .into_iter()
            .map(|(id, connected)| serde_json::json!({"call_id": id, "connected": connected}))
            .collect()
    }
}

/// A socket's hold on its call: the call's state (through `Deref`) and control requests.
/// Dropping it gives the state back to the registry, parked for the resume window.
#[derive(Debug)]
pub(crate) struct Lease {
    registry: Arc<Registry>,
    call_id: String,
    window: Duration,
    state: CallState,
    resumed: bool,
    control: Option<mpsc::Receiver<Control>>,
}

impl Lease {
    /// The call's id.
    pub(crate) fn call_id(&self) -> &str {
        &self.call_id
    }

    /// Whether this socket resumes a call a closed socket left.
    pub(crate) fn resumed(&self) -> bool {
        self.resumed
    }

    /// The call's control requests (once; the session polls them).
    pub(crate) fn take_control(&mut self) -> Option<mpsc::Receiver<Control>> {
        self.control.take()
    }
}

impl Deref for Lease {
    type Target = CallState;

    fn deref(&self) -> &CallState {
        &self.state
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut CallState {
        &mut self.state
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let state = std::mem::take(&mut self.state);
        self.registry.release(&self.call_id, state, self.window);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(60);

    impl ParkedSize for &'static str {
        fn parked_bytes(&self) -> usize {
            self.len()
        }
    }

    fn control() -> mpsc::Sender<Control> {
        mpsc::channel(1).0
    }

    /// Claims `id` with state `fresh` for a new call; the decision and the state.
    fn claim(calls: &mut Calls<&'static str>, id: &str, now: Instant) -> Claim<&'static str> {
        calls.claim(id, now, WINDOW, control(), || "fresh")
    }

    #[test]
    fn a_live_call_is_refused_to_a_second_socket() {
        let mut calls = Calls::new(10);
        let t0 = Instant::now();
        assert!(matches!(
            claim(&mut calls, "c", t0),
            Claim::Granted {
                state: "fresh",
                resumed: false
            }
        ));
        // However often, however much later: the live socket keeps its call.
        for later in [0, 1, 3600] {
            let now = t0 + Duration::from_secs(later);
            assert!(matches!(claim(&mut calls, "c", now), Claim::Busy));
        }
        assert!(calls.control("c").is_some());
        assert_eq!(calls.list(), [("c".to_owned(), true)]);
        // Other calls are not affected.
        assert!(matches!(
            claim(&mut calls, "d", t0),
            Claim::Granted { resumed: false, .. }
        ));
    }

    #[test]
    fn after_the_socket_closes_a_reconnect_within_the_window_resumes() {
        let mut calls = Calls::new(10);
        let t0 = Instant::now();
        assert!(matches!(claim(&mut calls, "c", t0), Claim::Granted { .. }));
        calls.release("c", "talked", t0 + Duration::from_secs(10), WINDOW);
        assert!(calls.control("c").is_none());
        assert_eq!(calls.list(), [("c".to_owned(), false)]);
        let now = t0 + Duration::from_secs(69);
        assert!(matches!(
            claim(&mut calls, "c", now),
            Claim::Granted {
                state: "talked",
                resumed: true
            }
        ));
        // Two reconnects at once: the first wins, the second finds the call live again.
        assert!(matches!(claim(&mut calls, "c", now), Claim::Busy));
    }

    #[test]
    fn an_adopted_conversation_resumes_and_never_displaces_a_live_socket() {
        let mut calls = Calls::new(2);
        let t0 = Instant::now();
        // Saved elsewhere, unknown here: the next socket resumes it.
        assert!(calls.adopt("c", "saved", t0, WINDOW));
        assert!(matches!(
            claim(&mut calls, "c", t0),
            Claim::Granted {
                state: "saved",
                resumed: true
            }
        ));
        // Live here: left alone.
        assert!(!calls.adopt("c", "other", t0, WINDOW));
        assert!(matches!(claim(&mut calls, "c", t0), Claim::Busy));
        // Parked here with an older state: the saved one replaces it.
        calls.release("c", "old", t0, WINDOW);
        assert!(calls.adopt("c", "newer", t0, WINDOW));
        assert!(matches!(
            claim(&mut calls, "c", t0),
            Claim::Granted { state: "newer", .. }
        ));
        // Full of live calls: nothing adopted.
        assert!(matches!(claim(&mut calls, "d", t0), Claim::Granted { .. }));
        assert!(!calls.adopt("e", "x", t0, WINDOW));
    }

    #[test]
    fn after_the_window_a_reconnect_is_a_new_call() {
        let mut calls = Calls::new(10);
        let t0 = Instant::now();
        assert!(matches!(claim(&mut calls, "c", t0), Claim::Granted { .. }));
        calls.release("c", "talked", t0, WINDOW);
        assert!(matches!(
            claim(&mut calls, "c", t0 + WINDOW),
            Claim::Granted {
                state: "fresh",
                resumed: false
            }
        ));
        // A zero window forgets the call as its socket closes.
        calls.release("c", "talked", t0, Duration::ZERO);
        assert!(calls.list().is_empty());
    }

    #[test]
    fn expiry_forgets_only_calls_parked_longer_than_the_window() {
        let mut calls = Calls::new(10);
        let t0 = Instant::now();
        let _ = claim(&mut calls, "c", t0);
        calls.release("c", "talked", t0, WINDOW);
        // Reclaimed and parked again later: the first parking's timer must not forget it.
        let t1 = t0 + Duration::from_secs(30);
        let _ = claim(&mut calls, "c", t1);
        calls.release("c", "again", t1, WINDOW);
        calls.expire("c", t0 + WINDOW, WINDOW);
        assert_eq!(calls.list().len(), 1);
        calls.expire("c", t1 + WINDOW, WINDOW);
        assert!(calls.list().is_empty());
        // A live call never expires.
        let _ = claim(&mut calls, "d", t0);
        calls.expire("d", t0 + WINDOW * 10, WINDOW);
        assert!(calls.control("d").is_some());
    }

    #[test]
    fn a_full_registry_refuses_new_calls_but_not_known_ones() {
        let mut calls = Calls::new(2);
        let t0 = Instant::now();
        let _ = claim(&mut calls, "a", t0);
        let _ = claim(&mut calls, "b", t0);
        calls.release("b", "talked", t0, WINDOW);
        assert!(matches!(claim(&mut calls, "c", t0), Claim::Full));
        // A parked call resumes even when full.
        assert!(matches!(
            claim(&mut calls, "b", t0),
            Claim::Granted { resumed: true, .. }
        ));
        calls.release("b", "talked", t0, WINDOW);
        // Once its window passed, the parked call makes room.
        assert!(matches!(
            claim(&mut calls, "c", t0 + WINDOW),
            Claim::Granted { resumed: false, .. }
        ));
        assert_eq!(
            calls.list(),
            [("a".to_owned(), true), ("c".to_owned(), true)]
        );
    }

    #[test]
    fn a_dropped_lease_gives_the_call_back_for_a_resume() {
        let registry = Arc::new(Registry::default());
        let cfg = super::super::RetellConfig::default();
        let first = registry
            .claim("c", WINDOW, || CallState::new(&cfg))
            .unwrap();
        assert!(!first.resumed());
        assert_eq!(first.call_id(), "c");
        assert_eq!(
            registry
                .claim("c", WINDOW, || CallState::new(&cfg))
                .unwrap_err(),
            Refused::Busy
        );
        drop(first);
        let second = registry
            .claim("c", WINDOW, || CallState::new(&cfg))
            .unwrap();
        assert!(second.resumed());
        assert_eq!(
            registry.list(),
            [serde_json::json!({"call_id": "c", "connected": true})]
        );
    }

    #[tokio::test]
    async fn an_upgrade_waits_out_the_grace_for_a_closing_socket() {
        let registry = Arc::new(Registry::default());
        let cfg = super::super::RetellConfig::default();
        let new = || CallState::new(&cfg);
        let first = registry.claim("c", WINDOW, new).unwrap();
        // The live socket stays: the wait ends in a refusal, and the call is still its.
        let grace = Duration::from_millis(50);
        let refused = registry.claim_within("c", WINDOW, grace, new).await;
        assert_eq!(refused.unwrap_err(), Refused::Busy);
        assert!(registry.control("c").is_some());
        // The socket closes while a reconnect waits: the reconnect gets the call.
        let waiting = registry.claim_within("c", WINDOW, Duration::from_secs(30), new);
        let closing = async {
            tokio::task::yield_now().await;
            drop(first);
        };
        let (lease, ()) = tokio::join!(waiting, closing);
        assert!(lease.unwrap().resumed());
    }

    #[test]
    fn parked_calls_keep_a_bounded_number_of_bytes() {
        // 10 bytes a call, 25 for all.
        let mut calls: Calls<&'static str> = Calls::with_parked_bytes(100, 10, 25);
        let t0 = Instant::now();
        for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
            let _ = claim(&mut calls, id, t0);
            let at = t0 + Duration::from_secs(i as u64);
            assert!(calls.release(id, "ten bytes!", at, WINDOW));
        }
        // The third made room by forgetting the longest parked.
        assert_eq!(calls.parked_bytes(), 20);
        assert_eq!(
            calls.list(),
            [("b".to_owned(), false), ("c".to_owned(), false)]
        );
        // Over the per-call bound: forgotten, not parked.
        let _ = claim(&mut calls, "big", t0);
        assert!(!calls.release("big", "eleven bytes", t0, WINDOW));
        assert!(matches!(
            claim(&mut calls, "big", t0),
            Claim::Granted { resumed: false, .. }
        ));
        // Resuming, expiring and pruning give the bytes back.
        assert!(matches!(
            claim(&mut calls, "b", t0),
            Claim::Granted { resumed: true, .. }
        ));
        assert_eq!(calls.parked_bytes(), 10);
        calls.expire("c", t0 + WINDOW * 2, WINDOW);
        assert_eq!(calls.parked_bytes(), 0);
    }
}
