//! What the door driver tells the operator about a session, the same for every door: the
//! session's tracing span and its opened / closed / latency-summary lines, a span per turn with
//! the provider calls as children, the turn-stage histograms, and the session's entry in the
//! admin registry (`GET /admin/sessions`).
//!
//! It only observes: it reads the provider requests the driver starts, the provider events it
//! hands the translator and the engine's [`TurnEvent`]s, and never changes what the session
//! does. Turn figures come from the engine (pure, fed the driver's clock) and provider figures
//! from the instants the driver saw, so every door reports the same stages the same way.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tracing::Span;
use tracing::field::Empty;
use voxgate_engine::{ProviderEvent, ProviderRequest, RequestId, ToolKind, ToolOutcome, TurnEvent};
use voxgate_turn::State as TurnState;

use crate::metrics::{Door, Metrics, Stage, ToolCallKind, ToolOutcomeLabel};

/// Finished turns an admin entry keeps for `GET /admin/sessions/{id}`.
const TIMELINE: usize = 16;
/// Tool calls a turn record keeps (a model calling more in one turn has the rest counted only).
const TOOLS_PER_TURN: usize = 8;
/// Turn figures kept per session for the close summary's median.
const SUMMARY_SAMPLES: usize = 64;
/// Provider requests whose first answer is awaited; past it the oldest is forgotten (an engine
/// cancels its own, so this only bounds a misbehaving provider).
const MAX_PENDING: usize = 64;

/// Who a session is, as the door knows it at the upgrade.
#[derive(Debug, Clone, Default)]
pub(crate) struct Identity {
    /// The client's address (after trusted proxies).
    pub(crate) peer: Option<SocketAddr>,
    /// The device or call the session serves (Xiaozhi `Device-Id`, Retell call id).
    pub(crate) device: Option<String>,
}

/// One turn's figures, as the admin timeline shows them. Milliseconds; `None` when the stage
/// did not happen in the turn.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct TurnRecord {
    /// The turn machine's id of the response (or the user turn), once known.
    pub(crate) turn: Option<u64>,
    /// When the turn's first activity was seen, in Unix milliseconds.
    pub(crate) started_unix_ms: u64,
    /// Whether the user spoke (rather than typed) the turn.
    pub(crate) spoken: Option<bool>,
    /// End of speech → end-of-turn decision.
    pub(crate) endpointing_ms: Option<u64>,
    /// Recognition request → transcript.
    pub(crate) asr_ms: Option<u64>,
    /// Generation request → first token or tool call.
    pub(crate) llm_first_token_ms: Option<u64>,
    /// First synthesis request → first audio.
    pub(crate) tts_first_byte_ms: Option<u64>,
    /// Origin (end of speech, or the input's arrival) → first reply audio.
    pub(crate) first_audio_ms: Option<u64>,
    /// Speech onset → playback cleared, when the user barged in.
    pub(crate) barge_in_ms: Option<u64>,
    /// The user interrupted the reply.
    pub(crate) interrupted: bool,
    /// An interruption proved false and the reply resumed.
    pub(crate) resumed: bool,
    /// Tool calls of the turn, in the order they ended.
    pub(crate) tools: Vec<ToolRecord>,
    /// How the turn ended: `open`, `completed`, `cut`, `superseded` or `session_closed`.
    pub(crate) outcome: &'static str,
    /// Turn start → its end, once ended.
    pub(crate) duration_ms: Option<u64>,
}

/// One tool call of a turn.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ToolRecord {
    /// The tool's name.
    pub(crate) name: String,
    /// Who ran it: `client`, `mcp`, `device` or `action`.
    pub(crate) kind: &'static str,
    /// Request → result.
    pub(crate) ms: u64,
    /// `ok`, `error`, `cancelled` or `timeout`.
    pub(crate) outcome: &'static str,
}

/// What the admin registry knows of one open session.
#[derive(Debug)]
struct Entry {
    id: Arc<str>,
    door: Door,
    peer: Option<SocketAddr>,
    device: Option<String>,
    opened: Instant,
    opened_unix_ms: u64,
    live: Mutex<Live>,
}

#[derive(Debug)]
struct Live {
    state: &'static str,
    turns: u64,
    current: Option<TurnRecord>,
    timeline: VecDeque<TurnRecord>,
}

impl Entry {
    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        // A panic elsewhere cannot leave these figures inconsistent in a way that matters.
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An open session in `GET /admin/sessions`.
#[derive(Debug, Serialize)]
pub(crate) struct SessionSummary {
    /// The session id (log lines and spans carry it as `session`).
    pub(crate) id: String,
    /// Its door.
    pub(crate) door: &'static str,
    /// The client's address.
    pub(crate) peer: Option<String>,
    /// Device or call id.
    pub(crate) device: Option<String>,
    /// Seconds since it opened.
    pub(crate) age_s: f64,
    /// Opened at, Unix milliseconds.
    pub(crate) opened_unix_ms: u64,
    /// The turn machine's state (`idle`, `listening`, `processing`, `speaking`, `action`...).
    pub(crate) state: &'static str,
    /// Turns ended so far.
    pub(crate) turns: u64,
    /// The last ended turn's figures.
    pub(crate) last_turn: Option<TurnRecord>,
}

/// One session in `GET /admin/sessions/{id}`: the summary and its recent turns, oldest first,
/// the turn in progress last.
#[derive(Debug, Serialize)]
pub(crate) struct SessionDetail {
    /// What the list shows.
    #[serde(flatten)]
    pub(crate) summary: SessionSummary,
    /// Recent turns, oldest first (the one in progress last, `outcome: "open"`).
    pub(crate) timeline: Vec<TurnRecord>,
}

/// The open sessions of every door, by id, for the admin API.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    sessions: Mutex<BTreeMap<Arc<str>, Arc<Entry>>>,
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<Arc<str>, Arc<Entry>>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, entry: Arc<Entry>) {
        self.map().insert(Arc::clone(&entry.id), entry);
    }

    fn remove(&self, id: &str) {
        self.map().remove(id);
    }

    /// Open sessions, oldest first, at most `limit` of them; and how many there are in all.
    pub(crate) fn list(&self, limit: usize) -> (Vec<SessionSummary>, usize) {
        let mut entries: Vec<Arc<Entry>> = self.map().values().cloned().collect();
        let total = entries.len();
        entries.sort_by_key(|e| e.opened);
        let now = Instant::now();
        let list = entries
            .iter()
            .take(limit)
            .map(|e| summary(e, &e.live(), now))
            .collect();
        (list, total)
    }

    /// One open session with its recent turns.
    pub(crate) fn get(&self, id: &str) -> Option<SessionDetail> {
        let entry = self.map().get(id).cloned()?;
        let live = entry.live();
        let mut timeline: Vec<TurnRecord> = live.timeline.iter().cloned().collect();
        timeline.extend(live.current.clone());
        Some(SessionDetail {
            summary: summary(&entry, &live, Instant::now()),
            timeline,
        })
    }
}

fn summary(e: &Entry, live: &Live, now: Instant) -> SessionSummary {
    SessionSummary {
        id: e.id.to_string(),
        door: e.door.label(),
        peer: e.peer.map(|p| p.to_string()),
        device: e.device.clone(),
        age_s: now.saturating_duration_since(e.opened).as_secs_f64(),
        opened_unix_ms: e.opened_unix_ms,
        state: live.state,
        turns: live.turns,
        last_turn: live.timeline.back().cloned(),
    }
}

/// The wire-neutral name of a turn state.
fn state_label(s: TurnState) -> &'static str {
    match s {
        TurnState::NotConnected => "not_connected",
        TurnState::Connecting => "connecting",
        TurnState::Idle => "idle",
        TurnState::Listening => "listening",
        TurnState::Processing => "processing",
        TurnState::Speaking => "speaking",
        TurnState::Action => "action",
        _ => "other",
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, ms)
}

/// A session id: 16 hex digits from the OS random source (a counter if it fails: the id only
/// names log lines, it guards nothing).
fn new_session_id() -> String {
    static FALLBACK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let bytes = crate::secret::random_bytes(8).unwrap_or_else(|_| {
        FALLBACK
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_be_bytes()
            .to_vec()
    });
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The provider stage a request measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Asr,
    Llm,
    Tts,
    Tool,
    Query,
}

impl Kind {
    fn of(r: &ProviderRequest) -> Option<(RequestId, Self)> {
        Some(match r {
            ProviderRequest::Transcribe { id, .. } => (*id, Self::Asr),
            ProviderRequest::Generate { id, .. } => (*id, Self::Llm),
            ProviderRequest::Synthesize { id, .. } => (*id, Self::Tts),
            ProviderRequest::CallTool { id, .. } => (*id, Self::Tool),
            ProviderRequest::Query { id, .. } => (*id, Self::Query),
            _ => return None,
        })
    }
}

/// The turn in progress.
struct OpenTurn {
    span: Span,
    started: Instant,
    record: TurnRecord,
    /// The user turn it answers was committed (a second one starts a new turn).
    committed: bool,
}

/// A bounded sample of one figure, for the close summary.
#[derive(Default)]
struct Samples(VecDeque<u32>, u64);

impl Samples {
    fn push(&mut self, v: u64) {
        if self.0.len() == SUMMARY_SAMPLES {
            self.0.pop_front();
        }
        self.0.push_back(u32::try_from(v).unwrap_or(u32::MAX));
        self.1 = self.1.max(v);
    }

    fn median(&self) -> Option<u64> {
        let mut v: Vec<u32> = self.0.iter().copied().collect();
        v.sort_unstable();
        v.get(v.len() / 2).map(|m| u64::from(*m))
    }
}

/// A session's figures for the line written when it closes.
#[derive(Default)]
struct Summary {
    turns: u64,
    interruptions: u64,
    false_interruptions: u64,
    cut: u64,
    tool_calls: u64,
    endpointing: Samples,
    first_audio: Samples,
}

/// Observes one session for the driver (see the module docs).
pub(crate) struct Observer {
    door: Door,
    metrics: Arc<Metrics>,
    registry: Arc<Registry>,
    entry: Arc<Entry>,
    span: Span,
    turn: Option<OpenTurn>,
    /// Provider requests awaiting their first answer: their stage and start.
    pending: HashMap<RequestId, (Kind, Instant)>,
    summary: Summary,
    /// Reused buffer for the translator's turn events.
    events: Vec<TurnEvent>,
}

impl Observer {
    /// Opens the session's span, writes its `session opened` line and registers it.
    pub(crate) fn open(
        door: Door,
        identity: Identity,
        metrics: Arc<Metrics>,
        registry: Arc<Registry>,
    ) -> Self {
        // Our own id, not a door's wire id: some of those are capabilities (VIP's session id
        // hangs the session up) that do not belong in logs.
        let id: Arc<str> = new_session_id().into();
        let span = tracing::info_span!(
            "session",
            door = door.label(),
            session = %id,
            peer = Empty,
            device = Empty,
        );
        if let Some(p) = identity.peer {
            span.record("peer", tracing::field::display(p));
        }
        if let Some(d) = &identity.device {
            span.record("device", d.as_str());
        }
        let entry = Arc::new(Entry {
            id,
            door,
            peer: identity.peer,
            device: identity.device,
            opened: Instant::now(),
            opened_unix_ms: unix_ms(),
            live: Mutex::new(Live {
                state: "connecting",
                turns: 0,
                current: None,
                timeline: VecDeque::new(),
            }),
        });
        registry.insert(Arc::clone(&entry));
        tracing::info!(parent: &span, "session opened");
        Self {
            door,
            metrics,
            registry,
            entry,
            span,
            turn: None,
            pending: HashMap::new(),
            summary: Summary::default(),
            events: Vec::new(),
        }
    }

    /// The session's span: the driver runs the session inside it.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// The translator's turn events since the last step, drained into this observer.
    pub(crate) fn events(&mut self) -> &mut Vec<TurnEvent> {
        &mut self.events
    }

    /// Takes the events [`Self::events`] collected.
    pub(crate) fn take_events(&mut self) {
        if self.events.is_empty() {
            return;
        }
        let mut events = std::mem::take(&mut self.events);
        for e in events.drain(..) {
            self.turn_event(e);
        }
        self.events = events;
    }

    /// A provider request is about to start: the span its task runs in (a child of the turn
    /// it belongs to, or of the session).
    pub(crate) fn request(&mut self, r: &ProviderRequest, now: Instant) -> Span {
        if let ProviderRequest::Cancel { id } = r {
            self.pending.remove(id);
            return Span::none();
        }
        let Some((id, kind)) = Kind::of(r) else {
            return Span::none();
        };
        if kind != Kind::Query && self.turn.is_none() {
            self.open_turn(now);
        }
        if self.pending.len() >= MAX_PENDING
            && let Some(oldest) = self
                .pending
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| *k)
        {
            self.pending.remove(&oldest);
        }
        self.pending.insert(id, (kind, now));
        let parent = self.turn.as_ref().map_or(&self.span, |t| &t.span);
        match kind {
            Kind::Asr => {
                tracing::info_span!(parent: parent, "asr", request = id.0, first_ms = Empty)
            }
            Kind::Llm => {
                tracing::info_span!(parent: parent, "llm", request = id.0, first_ms = Empty)
            }
            Kind::Tts => {
                tracing::info_span!(parent: parent, "tts", request = id.0, first_ms = Empty)
            }
            Kind::Tool => {
                tracing::info_span!(parent: parent, "tool", request = id.0, tool = Empty, first_ms = Empty)
            }
            Kind::Query => {
                tracing::info_span!(parent: parent, "query", request = id.0, first_ms = Empty)
            }
        }
    }

    /// A provider event reached the session at `at`: the first one of a request gives its
    /// stage's figure for the turn.
    pub(crate) fn provider_event(&mut self, event: &ProviderEvent, at: Instant) {
        let Some((kind, t0)) = self.pending.remove(&event.id()) else {
            return;
        };
        let Some(turn) = &mut self.turn else { return };
        let took = Some(ms(at.saturating_duration_since(t0)));
        let r = &mut turn.record;
        match kind {
            Kind::Asr if r.asr_ms.is_none() => r.asr_ms = took,
            Kind::Llm if r.llm_first_token_ms.is_none() => r.llm_first_token_ms = took,
            Kind::Tts if r.tts_first_byte_ms.is_none() => r.tts_first_byte_ms = took,
            _ => return,
        }
        self.publish_current();
    }

    fn open_turn(&mut self, now: Instant) {
        let span = tracing::info_span!(
            parent: &self.span,
            "turn",
            turn = Empty,
            speech = Empty,
            endpointing_ms = Empty,
            first_audio_ms = Empty,
            outcome = Empty,
        );
        self.turn = Some(OpenTurn {
            span,
            started: now,
            record: TurnRecord {
                started_unix_ms: unix_ms(),
                outcome: "open",
                ..TurnRecord::default()
            },
            committed: false,
        });
        self.publish_current();
    }

    fn close_turn(&mut self, now: Instant, outcome: &'static str) {
        let Some(mut t) = self.turn.take() else {
            return;
        };
        t.record.outcome = outcome;
        t.record.duration_ms = Some(ms(now.saturating_duration_since(t.started)));
        t.span.record("outcome", outcome);
        self.summary.turns += 1;
        let mut live = self.entry.live();
        live.turns += 1;
        live.current = None;
        if live.timeline.len() == TIMELINE {
            live.timeline.pop_front();
        }
        live.timeline.push_back(t.record);
    }

    fn publish_current(&self) {
        let current = self.turn.as_ref().map(|t| t.record.clone());
        self.entry.live().current = current;
    }

    fn turn_event(&mut self, e: TurnEvent) {
        let door = self.door;
        match e {
            TurnEvent::State { to, .. } => self.entry.live().state = state_label(to),
            TurnEvent::UserTurn { turn, speech, at } => {
                if self.turn.as_ref().is_some_and(|t| t.committed) {
                    self.close_turn(at, "superseded");
                }
                if self.turn.is_none() {
                    self.open_turn(at);
                }
                if let Some(t) = &mut self.turn {
                    t.committed = true;
                    t.record.turn = Some(u64::from(turn.0));
                    t.record.spoken = Some(speech);
                    t.span.record("turn", turn.0);
                    t.span.record("speech", speech);
                }
                self.publish_current();
            }
            TurnEvent::Latency(l) => {
                if let Some(d) = l.endpointing {
                    self.metrics.stage(door, Stage::Endpointing, d);
                    self.summary.endpointing.push(ms(d));
                }
                // User stop → first audio: spoken turns only (others count from a message).
                let spoken = l.endpointing.is_some();
                if spoken && let Some(d) = l.to_first_audio {
                    self.metrics.stage(door, Stage::FirstAudio, d);
                    self.summary.first_audio.push(ms(d));
                }
                if self.turn.is_none() {
                    self.open_turn(l.origin);
                }
                if let Some(t) = &mut self.turn {
                    t.record.turn.get_or_insert(u64::from(l.turn.0));
                    t.record.endpointing_ms = l.endpointing.map(ms);
                    t.record.first_audio_ms = l.to_first_audio.map(ms);
                    if let Some(d) = l.endpointing {
                        t.span.record("endpointing_ms", ms(d));
                    }
                    if let Some(d) = l.to_first_audio {
                        t.span.record("first_audio_ms", ms(d));
                    }
                }
                self.publish_current();
            }
            TurnEvent::Interrupted { barge_in, .. } => {
                self.metrics.interruption(door);
                self.summary.interruptions += 1;
                if let Some(d) = barge_in {
                    self.metrics.stage(door, Stage::BargeIn, d);
                }
                if let Some(t) = &mut self.turn {
                    t.record.interrupted = true;
                    t.record.barge_in_ms = barge_in.map(ms);
                    tracing::info!(parent: &t.span, barge_in_ms = barge_in.map(ms), "interrupted");
                }
                self.publish_current();
            }
            TurnEvent::FalseInterruption { .. } => {
                self.metrics.false_interruption(door);
                self.summary.false_interruptions += 1;
                if let Some(t) = &mut self.turn {
                    t.record.resumed = true;
                    tracing::info!(parent: &t.span, "false interruption: reply resumed");
                }
                self.publish_current();
            }
            TurnEvent::ToolCall {
                kind,
                name,
                elapsed,
                outcome,
                ..
            } => {
                let (kind, kind_label) = match kind {
                    ToolKind::Client => (ToolCallKind::Client, "client"),
                    ToolKind::Mcp => (ToolCallKind::Mcp, "mcp"),
                    ToolKind::Device => (ToolCallKind::Device, "device"),
                    _ => (ToolCallKind::Action, "action"),
                };
                let (outcome, outcome_label) = match outcome {
                    ToolOutcome::Ok => (ToolOutcomeLabel::Ok, "ok"),
                    ToolOutcome::Error => (ToolOutcomeLabel::Error, "error"),
                    ToolOutcome::Cancelled => (ToolOutcomeLabel::Cancelled, "cancelled"),
                    _ => (ToolOutcomeLabel::Timeout, "timeout"),
                };
                self.metrics.tool_call(door, kind, outcome, elapsed);
                self.summary.tool_calls += 1;
                if let Some(t) = &mut self.turn {
                    tracing::info!(
                        parent: &t.span,
                        tool = %name,
                        kind = kind_label,
                        outcome = outcome_label,
                        ms = ms(elapsed),
                        "tool call"
                    );
                    if t.record.tools.len() < TOOLS_PER_TURN {
                        t.record.tools.push(ToolRecord {
                            name,
                            kind: kind_label,
                            ms: ms(elapsed),
                            outcome: outcome_label,
                        });
                    }
                }
                self.publish_current();
            }
            TurnEvent::ResponseEnded {
                interrupted, at, ..
            } => {
                if interrupted {
                    self.metrics.reply_cut(door);
                    self.summary.cut += 1;
                }
                self.close_turn(at, if interrupted { "cut" } else { "completed" });
            }
            _ => {}
        }
    }

    /// Writes the session's `session closed` line and its turn-latency summary, and removes it
    /// from the registry.
    pub(crate) fn close(&mut self, reason: &'static str) {
        self.close_turn(Instant::now(), "session_closed");
        let s = &self.summary;
        let duration = self.entry.opened.elapsed();
        tracing::info!(
            parent: &self.span,
            duration_s = duration.as_secs_f64(),
            turns = s.turns,
            reason,
            "session closed"
        );
        tracing::info!(
            parent: &self.span,
            turns = s.turns,
            spoken_turns = s.first_audio.0.len(),
            first_audio_p50_ms = s.first_audio.median(),
            first_audio_max_ms = (s.first_audio.1 > 0).then_some(s.first_audio.1),
            endpointing_p50_ms = s.endpointing.median(),
            interruptions = s.interruptions,
            false_interruptions = s.false_interruptions,
            replies_cut = s.cut,
            tool_calls = s.tool_calls,
            "session turn latency"
        );
        self.registry.remove(&self.entry.id);
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        // A session task aborted before `close` (a panic, a hung-up VIP peer) leaves no entry.
        self.registry.remove(&self.entry.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_keep_a_bounded_median_and_the_max() {
        let mut s = Samples::default();
        for v in 0..200 {
            s.push(v);
        }
        assert_eq!(s.0.len(), SUMMARY_SAMPLES);
        assert_eq!(s.1, 199);
        assert_eq!(s.median(), Some(168));
        assert_eq!(Samples::default().median(), None);
    }

    #[test]
    fn session_ids_are_16_hex_digits_and_differ() {
        let a = new_session_id();
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_session_id());
    }
}
