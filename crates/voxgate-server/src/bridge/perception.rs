//! The perception event bus: what devices notice (faces, sounds, state changes, dances)
//! broadcast to every subscriber in the process, plus the latest state per device.
//!
//! # Publishing
//! Anything in the server publishes with [`PerceptionBus::publish`]:
//! `POST /api/perception/event` does, and the Xiaozhi door feeds a device's `event` frames the
//! same way:
//! ```text
//! let event = PerceptionEvent::from_value(frame_json, Some(device_id), Some(session_id))?;
//! app.shared.perception.publish(event, EventOrigin::Device);
//! ```
//! [`PerceptionEvent::from_value`] validates a JSON object shaped like the firmware frame
//! (`name`, `data`, `device_id`, `session_id`, `ts`; a `type` member is ignored), filling in the
//! device and session ids the door knows when the frame leaves them out.
//!
//! # Subscribing
//! [`PerceptionBus::subscribe`] gives a `tokio::sync::broadcast` receiver; a subscriber that
//! falls more than [`BUS_CAPACITY`] events behind gets `RecvError::Lagged` and skips ahead
//! (the bus never blocks a publisher). Listeners outside the process read the same stream as
//! Server-Sent Events from `GET /api/perception/events`.
//!
//! # Bounds
//! The bus is open to anonymous clients by default, so what it keeps is bounded in bytes,
//! not only in counts: an event's `data` is at most [`MAX_DATA_BYTES`] (refused beyond, the
//! HTTP API answers 413), a device's remembered events at most [`MAX_DEVICE_BYTES`] (its
//! least recently updated event names are forgotten beyond), and all devices together at most
//! [`MAX_BUS_BYTES`] (the least recently seen devices are forgotten beyond). Sizes are the
//! compact JSON text of `data`, which is also how it is held: each event's data is one
//! shared string, never copied per subscriber or per device.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::{broadcast, mpsc};

/// Events a slow subscriber may fall behind before it starts losing them.
pub(crate) const BUS_CAPACITY: usize = 256;
/// Devices whose state is kept; the least recently seen is forgotten beyond this.
const MAX_DEVICES: usize = 1024;
/// Distinct event names remembered per device.
const MAX_NAMES: usize = 64;
/// Largest `data` of one event, as compact JSON: perception details (a face's box, a sound's
/// level, a state name) are tens of bytes; 4 KiB leaves room for rich ones.
pub(crate) const MAX_DATA_BYTES: usize = 4 * 1024;
/// Most `data` bytes remembered for one device (its latest event of each name).
pub(crate) const MAX_DEVICE_BYTES: usize = 32 * 1024;
/// Most `data` bytes remembered for all devices together (with names and ids, a few MiB).
pub(crate) const MAX_BUS_BYTES: usize = 4 * 1024 * 1024;
const MAX_NAME_LEN: usize = 64;
const MAX_ID_LEN: usize = 256;

/// Who published an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EventOrigin {
    /// `POST /api/perception/event`.
    Http,
    /// A device's own frame (the Xiaozhi door).
    Device,
    /// `POST /admin/perception/event` (a test event).
    Admin,
}

/// An event's `data`: a JSON object held as its compact text, shared (cheap to clone) and
/// written out as the object it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventData(Arc<str>);

impl EventData {
    /// The object's compact JSON text.
    fn of(map: &Map<String, Value>) -> Self {
        Self(Arc::from(
            serde_json::to_string(map).unwrap_or_else(|_| "{}".into()),
        ))
    }

    /// Size in bytes, what the bounds count.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The object, parsed (for reading a member).
    pub(crate) fn object(&self) -> Map<String, Value> {
        serde_json::from_str(&self.0).unwrap_or_default()
    }
}

impl Serialize for EventData {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Written from the text as it is (serde_json passes raw values through).
        let raw = serde_json::value::RawValue::from_string(self.0.to_string())
            .map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for EventData {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self::of(&Map::deserialize(d)?))
    }
}

/// One perception event, as the firmware frame has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PerceptionEvent {
    /// `face_detected`, `face_lost`, `sound_event`, `state_changed`, `dance_started`...
    pub(crate) name: String,
    /// Event details (always an object), at most [`MAX_DATA_BYTES`].
    pub(crate) data: EventData,
    /// The device that noticed it.
    pub(crate) device_id: String,
    /// The device's conversation session, when known.
    pub(crate) session_id: Option<String>,
    /// Seconds since the Unix epoch (the sender's clock, or arrival time when it sent none).
    pub(crate) ts: f64,
    /// Who published it.
    pub(crate) origin: EventOrigin,
    /// With `[cluster]`: the instance it was published on, when that is another one (events
    /// published here leave it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) instance: Option<String>,
}

/// Why an event was refused (the HTTP API answers 400 with this text, 413 when
/// [`InvalidEvent::too_large`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InvalidEvent(pub(crate) String);

impl InvalidEvent {
    /// The event was refused for its size, not its shape.
    pub(crate) fn too_large(&self) -> bool {
        self.0.starts_with(TOO_LARGE)
    }
}

const TOO_LARGE: &str = "`data` is larger than";

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

fn text_field(
    obj: &Map<String, Value>,
    key: &str,
    max: usize,
) -> Result<Option<String>, InvalidEvent> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) if s.len() > max => {
            Err(InvalidEvent(format!("`{key}` is longer than {max} bytes")))
        }
        Some(Value::String(s)) => Ok(Some(s.trim().to_owned())),
        Some(_) => Err(InvalidEvent(format!("`{key}` must be a string"))),
    }
}

impl PerceptionEvent {
    /// Validates a firmware-shaped JSON object. `device_id` / `session_id` fill in what the
    /// object leaves out (a door knows them from the connection); `origin` is recorded.
    pub(crate) fn from_value(
        value: Value,
        device_id: Option<&str>,
        session_id: Option<&str>,
        origin: EventOrigin,
    ) -> Result<Self, InvalidEvent> {
        let Value::Object(mut obj) = value else {
            return Err(InvalidEvent("the event must be a JSON object".into()));
        };
        let name = text_field(&obj, "name", MAX_NAME_LEN)?
            .ok_or_else(|| InvalidEvent("`name` is required (a non-empty string)".into()))?;
        let data = match obj.remove("data") {
            None | Some(Value::Null) => EventData::of(&Map::new()),
            Some(Value::Object(m)) => EventData::of(&m),
            Some(_) => return Err(InvalidEvent("`data` must be a JSON object".into())),
        };
        if data.len() > MAX_DATA_BYTES {
            return Err(InvalidEvent(format!(
                "{TOO_LARGE} {MAX_DATA_BYTES} bytes ({} bytes of JSON)",
                data.len()
            )));
        }
        let device_id = text_field(&obj, "device_id", MAX_ID_LEN)?
            .or_else(|| device_id.map(str::to_owned))
            .ok_or_else(|| InvalidEvent("`device_id` is required (a non-empty string)".into()))?;
        let session_id =
            text_field(&obj, "session_id", MAX_ID_LEN)?.or_else(|| session_id.map(str::to_owned));
        let ts = match obj.get("ts") {
            None | Some(Value::Null) => now_secs(),
            Some(Value::Number(n)) => n
                .as_f64()
                .filter(|t| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| InvalidEvent("`ts` must be a non-negative number".into()))?,
            Some(_) => return Err(InvalidEvent("`ts` must be a number (Unix seconds)".into())),
        };
        Ok(Self {
            name,
            data,
            device_id,
            session_id,
            ts,
            origin,
            instance: None,
        })
    }
}

/// The last event of one name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct LastEvent {
    /// Its data.
    pub(crate) data: EventData,
    /// When.
    pub(crate) ts: f64,
    /// The device's event count when it came (for forgetting the least recently updated).
    #[serde(skip)]
    seq: u64,
}

/// What is known about one device from its events.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct DeviceState {
    /// The device.
    pub(crate) device_id: String,
    /// Its latest session id.
    pub(crate) session_id: Option<String>,
    /// Events seen.
    pub(crate) events: u64,
    /// Name of the latest event.
    pub(crate) last_event: String,
    /// Time of the latest event.
    pub(crate) last_ts: f64,
    /// A face is in view (`face_detected` / `face_lost`); `None` until one of them arrived.
    pub(crate) face_present: Option<bool>,
    /// Who the face is, when an event named them (`data.name`, `data.identity` or
    /// `data.person`); cleared by `face_lost`.
    pub(crate) identity: Option<String>,
    /// The device's state from `state_changed` (`data.state`, `data.new_state` or `data.to`).
    pub(crate) state: Option<String>,
    /// `dance_started` / `dance_ended`.
    pub(crate) dancing: Option<bool>,
    /// The latest event of each name.
    pub(crate) latest: BTreeMap<String, LastEvent>,
    /// `data` bytes in `latest`.
    #[serde(skip)]
    bytes: usize,
}

fn first_string(data: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| data.get(*k).and_then(Value::as_str))
        .map(str::to_owned)
}

impl DeviceState {
    fn new(device_id: &str) -> Self {
        Self {
            device_id: device_id.to_owned(),
            session_id: None,
            events: 0,
            last_event: String::new(),
            last_ts: 0.0,
            face_present: None,
            identity: None,
            state: None,
            dancing: None,
            latest: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// What this device's state holds in bytes, as the bus counts it.
    fn size(&self) -> usize {
        self.bytes
    }

    fn apply(&mut self, e: &PerceptionEvent) {
        self.events += 1;
        self.last_event.clone_from(&e.name);
        self.last_ts = e.ts;
        if e.session_id.is_some() {
            self.session_id.clone_from(&e.session_id);
        }
        // Only the events whose members are read pay for a parse.
        let data = if matches!(
            e.name.as_str(),
            "face_detected" | "face_identified" | "state_changed"
        ) {
            e.data.object()
        } else {
            Map::new()
        };
        let who = first_string(&data, &["name", "identity", "person"]);
        match e.name.as_str() {
            "face_detected" => {
                self.face_present = Some(true);
                if who.is_some() {
                    self.identity = who;
                }
            }
            "face_identified" => {
                self.face_present = Some(true);
                self.identity = who;
            }
            "face_lost" => {
                self.face_present = Some(false);
                self.identity = None;
            }
            "state_changed" => {
                if let Some(s) = first_string(&data, &["state", "new_state", "to"]) {
                    self.state = Some(s);
                }
            }
            "dance_started" => self.dancing = Some(true),
            "dance_ended" => self.dancing = Some(false),
            _ => {}
        }
        if self.latest.len() < MAX_NAMES || self.latest.contains_key(&e.name) {
            let last = LastEvent {
                data: e.data.clone(),
                ts: e.ts,
                seq: self.events,
            };
            self.bytes += last.data.len();
            if let Some(old) = self.latest.insert(e.name.clone(), last) {
                self.bytes -= old.data.len();
            }
        }
        // Over the device's budget: forget its least recently updated names.
        while self.bytes > MAX_DEVICE_BYTES {
            let Some(oldest) = self
                .latest
                .iter()
                .min_by_key(|(_, l)| l.seq)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(old) = self.latest.remove(&oldest) {
                self.bytes -= old.data.len();
            }
        }
    }
}

/// Device state keyed by id with the sighting counter value of its last event, the counter,
/// and the bytes all devices' states hold.
#[derive(Debug, Default)]
struct Devices {
    states: HashMap<String, (u64, DeviceState)>,
    clock: u64,
    bytes: usize,
}

impl Devices {
    /// Forgets the least recently seen device other than `keep`; `false` when there is none.
    fn evict_one(&mut self, keep: &str) -> bool {
        let oldest = self
            .states
            .iter()
            .filter(|(k, _)| k.as_str() != keep)
            .min_by_key(|(_, (t, _))| *t)
            .map(|(k, _)| k.clone());
        match oldest.and_then(|k| self.states.remove(&k)) {
            Some((_, s)) => {
                self.bytes -= s.size();
                true
            }
            None => false,
        }
    }
}

/// The bus and the per-device state. Shared behind an `Arc`.
#[derive(Debug)]
pub(crate) struct PerceptionBus {
    tx: broadcast::Sender<Arc<PerceptionEvent>>,
    /// With `[cluster]`: where events published here go to reach the other instances.
    outbox: std::sync::OnceLock<mpsc::Sender<Arc<PerceptionEvent>>>,
    /// Device state and a counter ordering devices by last sighting (for eviction).
    devices: Mutex<Devices>,
}

impl Default for PerceptionBus {
    fn default() -> Self {
        Self::new()
    }
}

impl PerceptionBus {
    /// An empty bus.
    pub(crate) fn new() -> Self {
        Self {
            tx: broadcast::channel(BUS_CAPACITY).0,
            outbox: std::sync::OnceLock::new(),
            devices: Mutex::new(Devices::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Devices> {
        self.devices
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Updates the device's state and broadcasts the event; returns how many subscribers got
    /// it.
    pub(crate) fn publish(&self, event: PerceptionEvent) -> usize {
        {
            let mut guard = self.lock();
            let d = &mut *guard;
            d.clock += 1;
            let seen = d.clock;
            if !d.states.contains_key(&event.device_id) && d.states.len() >= MAX_DEVICES {
                d.evict_one(&event.device_id);
            }
            let entry = d
                .states
                .entry(event.device_id.clone())
                .or_insert_with(|| (seen, DeviceState::new(&event.device_id)));
            entry.0 = seen;
            let before = entry.1.size();
            entry.1.apply(&event);
            d.bytes = d.bytes - before + entry.1.size();
            // Over the bus's budget: forget the least recently seen devices.
            while d.bytes > MAX_BUS_BYTES && d.evict_one(&event.device_id) {}
        }
        tracing::debug!(name = %event.name, device = %event.device_id, "perception event");
        let event = Arc::new(event);
        if event.instance.is_none()
            && let Some(outbox) = self.outbox.get()
            && outbox.try_send(Arc::clone(&event)).is_err()
        {
            tracing::warn!(name = %event.name, "perception event not shared with the cluster: its queue is full");
        }
        self.tx.send(event).unwrap_or(0)
    }

    /// Sends every event published here from now on (not those from other instances) to
    /// `outbox` as well: the cluster's link (`crate::cluster`). Set once.
    pub(crate) fn set_outbox(&self, outbox: mpsc::Sender<Arc<PerceptionEvent>>) {
        let _ = self.outbox.set(outbox);
    }

    /// A receiver of every event published from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<PerceptionEvent>> {
        self.tx.subscribe()
    }

    /// How many subscribers there are.
    pub(crate) fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }

    /// One device's state.
    pub(crate) fn device(&self, device_id: &str) -> Option<DeviceState> {
        self.lock().states.get(device_id).map(|(_, s)| s.clone())
    }

    /// Every device's state, by device id.
    pub(crate) fn devices(&self) -> Vec<DeviceState> {
        let mut all: Vec<DeviceState> = self
            .lock()
            .states
            .values()
            .map(|(_, s)| s.clone())
            .collect();
        all.sort_by(|a, b| a.device_id.cmp(&b.device_id));
        all
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn event(v: Value) -> PerceptionEvent {
        PerceptionEvent::from_value(v, None, None, EventOrigin::Http).unwrap()
    }

    #[test]
    fn validation() {
        let bad = |v: Value| {
            PerceptionEvent::from_value(v, None, None, EventOrigin::Http)
                .unwrap_err()
                .0
        };
        assert!(bad(json!([1])).contains("object"));
        assert!(bad(json!({"device_id":"d"})).contains("name"));
        assert!(bad(json!({"name":"x"})).contains("device_id"));
        assert!(bad(json!({"name":1,"device_id":"d"})).contains("name"));
        assert!(bad(json!({"name":"x","device_id":"d","data":[1]})).contains("data"));
        assert!(bad(json!({"name":"x","device_id":"d","ts":"now"})).contains("ts"));
        assert!(bad(json!({"name":"x","device_id":"d","ts":-1})).contains("ts"));
        let long = "n".repeat(65);
        assert!(bad(json!({"name":long,"device_id":"d"})).contains("longer"));
        // A door fills in ids the frame leaves out; `type` is ignored.
        let e = PerceptionEvent::from_value(
            json!({"type":"event","name":"face_lost"}),
            Some("dev"),
            Some("s1"),
            EventOrigin::Device,
        )
        .unwrap();
        assert_eq!(
            (e.device_id.as_str(), e.session_id.as_deref()),
            ("dev", Some("s1"))
        );
        assert!(e.ts > 1.0e9);
        assert!(e.data.object().is_empty());
    }

    #[tokio::test]
    async fn publish_updates_state_and_reaches_subscribers() {
        let bus = PerceptionBus::new();
        let mut rx = bus.subscribe();
        let mut rx2 = bus.subscribe();
        assert_eq!(bus.subscribers(), 2);
        let n = bus.publish(event(json!({"name":"face_detected","device_id":"a",
            "data":{"name":"Ana"},"session_id":"s","ts":10.5})));
        assert_eq!(n, 2);
        let got = rx.recv().await.unwrap();
        assert_eq!(got.name, "face_detected");
        assert_eq!(rx2.recv().await.unwrap().ts, 10.5);
        let s = bus.device("a").unwrap();
        assert_eq!(s.face_present, Some(true));
        assert_eq!(s.identity.as_deref(), Some("Ana"));
        bus.publish(event(
            json!({"name":"state_changed","device_id":"a","data":{"state":"listening"}}),
        ));
        bus.publish(event(json!({"name":"dance_started","device_id":"a"})));
        bus.publish(event(json!({"name":"face_lost","device_id":"a"})));
        bus.publish(event(
            json!({"name":"sound_event","device_id":"b","data":{"db":70}}),
        ));
        let s = bus.device("a").unwrap();
        assert_eq!(s.events, 4);
        assert_eq!(s.face_present, Some(false));
        assert_eq!(s.identity, None);
        assert_eq!(s.state.as_deref(), Some("listening"));
        assert_eq!(s.dancing, Some(true));
        assert_eq!(s.last_event, "face_lost");
        assert_eq!(s.session_id.as_deref(), Some("s"));
        assert_eq!(s.latest["face_detected"].data.object()["name"], "Ana");
        let all = bus.devices();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].latest["sound_event"].data.object()["db"], 70);
        // Written out as the object it is.
        assert_eq!(
            serde_json::to_value(&all[1].latest["sound_event"]).unwrap(),
            json!({"data": {"db": 70}, "ts": all[1].latest["sound_event"].ts})
        );
    }

    #[test]
    fn device_table_is_bounded() {
        let bus = PerceptionBus::new();
        for i in 0..=MAX_DEVICES {
            bus.publish(event(json!({"name":"x","device_id":format!("d{i}")})));
        }
        assert_eq!(bus.devices().len(), MAX_DEVICES);
        assert!(bus.device("d0").is_none());
        assert!(bus.device(&format!("d{MAX_DEVICES}")).is_some());
    }

    /// `count` events of `bytes` of data each, named `name{i}` on `device`.
    fn flood(bus: &PerceptionBus, device: &str, names: usize, bytes: usize) {
        let filler = "x".repeat(bytes - 10);
        for i in 0..names {
            bus.publish(event(json!({"name": format!("n{i}"), "device_id": device,
                "data": {"v": filler}})));
        }
    }

    #[test]
    fn an_event_with_too_much_data_is_refused_as_too_large() {
        let big = "x".repeat(MAX_DATA_BYTES);
        let e = PerceptionEvent::from_value(
            json!({"name": "x", "device_id": "d", "data": {"v": big}}),
            None,
            None,
            EventOrigin::Http,
        )
        .unwrap_err();
        assert!(e.too_large(), "{e}");
        assert!(e.0.contains("4096"), "{e}");
        let shape =
            PerceptionEvent::from_value(json!({"device_id": "d"}), None, None, EventOrigin::Http)
                .unwrap_err();
        assert!(!shape.too_large());
    }

    #[test]
    fn what_a_device_and_the_bus_remember_is_bounded_in_bytes() {
        let bus = PerceptionBus::new();
        // One device, 64 names of nearly 4 KiB: it keeps its newest names within its budget.
        flood(&bus, "d", MAX_NAMES, MAX_DATA_BYTES);
        let s = bus.device("d").unwrap();
        let kept: usize = s.latest.values().map(|l| l.data.len()).sum();
        assert!(kept <= MAX_DEVICE_BYTES, "{kept}");
        assert!(s.latest.contains_key(&format!("n{}", MAX_NAMES - 1)));
        assert!(!s.latest.contains_key("n0"));
        assert_eq!(s.events, MAX_NAMES as u64);
        // Many devices: the bus keeps its newest devices within its budget.
        for d in 0..(2 * MAX_BUS_BYTES / MAX_DEVICE_BYTES) {
            flood(&bus, &format!("dev{d}"), 8, MAX_DATA_BYTES);
        }
        let all = bus.devices();
        let total: usize = all
            .iter()
            .flat_map(|s| s.latest.values())
            .map(|l| l.data.len())
            .sum();
        assert!(total <= MAX_BUS_BYTES, "{total}");
        assert!(
            bus.device("d").is_none(),
            "the least recently seen went first"
        );
        let last = format!("dev{}", 2 * MAX_BUS_BYTES / MAX_DEVICE_BYTES - 1);
        assert!(bus.device(&last).is_some());
    }
}
