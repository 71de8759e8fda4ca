//! Event output: one JSON object per line, each stamped with the milliseconds since the session
//! started, so a run can be piped into `jq` or compared between servers.

use std::io::Write;
use std::time::Instant;

use serde_json::{Map, Value};

/// Where events go: a writer (stdout for the command line), and optionally an in-memory record
/// that tests and the load generator inspect afterwards.
pub struct Events {
    out: Option<Box<dyn Write + Send>>,
    start: Instant,
    recorded: Option<Vec<Value>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("writes", &self.out.is_some())
            .field("recorded", &self.recorded.as_ref().map(Vec::len))
            .finish()
    }
}

impl Events {
    /// Events printed on standard output, one line each, flushed per line.
    #[must_use]
    pub fn stdout() -> Self {
        Self::to_writer(Box::new(std::io::stdout()))
    }

    /// Events written to `out`.
    #[must_use]
    pub fn to_writer(out: Box<dyn Write + Send>) -> Self {
        Self {
            out: Some(out),
            start: Instant::now(),
            recorded: None,
        }
    }

    /// Events kept in memory only (see [`recorded`](Self::recorded)).
    #[must_use]
    pub fn recording() -> Self {
        Self {
            out: None,
            start: Instant::now(),
            recorded: Some(Vec::new()),
        }
    }

    /// Events dropped (the load generator counts instead of printing).
    #[must_use]
    pub fn discard() -> Self {
        Self {
            out: None,
            start: Instant::now(),
            recorded: None,
        }
    }

    /// Emits one event named `event` with the fields of `fields` (an object; anything else is
    /// kept under `"value"`).
    pub fn emit(&mut self, event: &str, fields: Value) {
        if self.out.is_none() && self.recorded.is_none() {
            return;
        }
        let t_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let value = render(t_ms, event, fields);
        if let Some(out) = &mut self.out {
            // A closed stdout (e.g. `| head`) must not kill the session mid-protocol.
            let _ = writeln!(out, "{value}");
            let _ = out.flush();
        }
        if let Some(rec) = &mut self.recorded {
            rec.push(value);
        }
    }

    /// The events emitted so far, when recording.
    #[must_use]
    pub fn recorded(&self) -> &[Value] {
        self.recorded.as_deref().unwrap_or(&[])
    }

    /// The recorded events named `event`.
    pub fn named<'a>(&'a self, event: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.recorded()
            .iter()
            .filter(move |v| v.get("event").and_then(Value::as_str) == Some(event))
    }
}

/// One event line as a JSON object: `t_ms`, `event`, then the given fields.
#[must_use]
pub fn render(t_ms: u64, event: &str, fields: Value) -> Value {
    let mut map = Map::new();
    map.insert("t_ms".into(), t_ms.into());
    map.insert("event".into(), event.into());
    match fields {
        Value::Object(fields) => {
            for (k, v) in fields {
                if k != "t_ms" && k != "event" {
                    map.insert(k, v);
                }
            }
        }
        Value::Null => {}
        other => {
            map.insert("value".into(), other);
        }
    }
    Value::Object(map)
}

/// Replaces long base64 audio strings in a JSON tree (fields named `data` under `inlineData`,
/// or a top-level audio `data`) by a short note of their size, so event lines stay readable.
pub fn redact_audio(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "data"
                    && let Value::String(s) = v
                    && s.len() > 64
                {
                    let bytes = s.len() / 4 * 3;
                    *v = Value::String(format!("<base64, about {bytes} bytes>"));
                } else {
                    redact_audio(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_audio),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_carry_time_and_name_first_and_keep_fields() {
        let v = render(
            12,
            "response_begin",
            json!({"turn_id": 3, "event": "ignored"}),
        );
        assert_eq!(
            v,
            json!({"t_ms": 12, "event": "response_begin", "turn_id": 3})
        );
        let v = render(0, "text", json!("hello"));
        assert_eq!(v, json!({"t_ms": 0, "event": "text", "value": "hello"}));
        assert_eq!(
            render(5, "pong", Value::Null),
            json!({"t_ms": 5, "event": "pong"})
        );
    }

    #[test]
    fn writer_gets_one_json_object_per_line() {
        #[derive(Clone, Default)]
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Shared::default();
        let mut events = Events::to_writer(Box::new(buf.clone()));
        events.emit("a", json!({"x": 1}));
        events.emit("b", json!({"text": "line\nbreak"}));
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let b: Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(b["event"], "b");
        assert_eq!(b["text"], "line\nbreak");
    }

    #[test]
    fn long_audio_is_redacted_short_strings_kept() {
        let long = "A".repeat(400);
        let mut v = json!({"serverContent": {"modelTurn": {"parts": [
            {"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": long}},
            {"text": "hi"}
        ]}}, "data": "short"});
        redact_audio(&mut v);
        assert_eq!(
            v["serverContent"]["modelTurn"]["parts"][0]["inlineData"]["data"],
            "<base64, about 300 bytes>"
        );
        assert_eq!(v["serverContent"]["modelTurn"]["parts"][1]["text"], "hi");
        assert_eq!(v["data"], "short");
    }
}
