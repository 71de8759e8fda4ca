//! Retell's side of the custom-LLM WebSocket, driven by [`voxgate_retell::RetellDriver`]:
//! connect to `/llm-websocket/{call_id}`, answer `config` (send `call_details` when asked),
//! wait for the begin message, then say each user utterance and wait for the agent's complete
//! response; ping_pong and reminders run on the driver's timers. After a lost connection it
//! reconnects as Retell does (same URL, at most twice) and still waits for the answer that was
//! streaming: the driver asks for it again under the same id, and it is read from its start.

use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use voxgate_retell::{DriverConfig, DriverInput, DriverOutput, RetellDriver, ServerEvent};

use crate::events::Events;
use crate::ws::{self, Ws};

/// How long to wait for the begin message before speaking anyway.
const BEGIN_WAIT: Duration = Duration::from_secs(3);

/// What to do in one call.
#[derive(Debug, Clone)]
pub struct RetellOptions {
    /// `ws://host:port/llm-websocket/{call_id}`; the last path segment is the call id.
    pub url: String,
    /// User utterances, each sent after the previous response completed.
    pub texts: Vec<String>,
    /// The agent id in `call_details`.
    pub agent_id: String,
    /// Give up after this long.
    pub timeout: Duration,
}

impl RetellOptions {
    /// Defaults for `url`: no utterances, 30 s timeout.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            texts: Vec::new(),
            agent_id: "agent_voxgate_client".into(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// What a call produced.
#[derive(Debug, Clone, Default)]
pub struct RetellOutcome {
    /// The begin message's text (empty: the agent waits for the user).
    pub begin: Option<String>,
    /// Complete agent responses by id, in order.
    pub responses: Vec<(u64, String)>,
    /// Protocol violations the driver saw.
    pub violations: Vec<String>,
    /// The call ended (end_call, server unresponsive or closed).
    pub ended: Option<String>,
    /// Whether the server sent `config`.
    pub configured: bool,
}

/// The call id in a custom-LLM URL: its last non-empty path segment.
#[must_use]
pub fn call_id_of(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/')
        .find(|s| !s.is_empty() && !s.contains(':'))
        .unwrap_or("call_voxgate_client")
        .to_owned()
}

/// Milliseconds since the Unix epoch at `t` (0 for a clock set before 1970).
fn epoch_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Plays one call, emitting every event to `events`.
///
/// # Errors
/// Connection failures, the server closing or going silent before the utterances were
/// answered, or the timeout.
pub async fn run(opts: &RetellOptions, events: &mut Events) -> anyhow::Result<RetellOutcome> {
    let deadline = Instant::now() + opts.timeout;
    let mut cfg = DriverConfig::default();
    cfg.call.call_id = call_id_of(&opts.url);
    cfg.call.agent_id.clone_from(&opts.agent_id);
    cfg.call.call_status = "ongoing".into();
    // The client plays a scripted user: no reminders unless the server configures them.
    cfg.reminder_trigger = None;
    let fields = json!({"call_id": call_id_of(&opts.url)});
    let mut ws = ws::open(&opts.url, &[], opts.timeout, events, fields).await?;
    // Retell's ping timestamps are epoch milliseconds; the driver counts on from this one.
    cfg.epoch_ms = epoch_ms(std::time::SystemTime::now());
    let mut driver = RetellDriver::new(cfg);
    driver.handle_input(std::time::Instant::now(), DriverInput::Connected);

    let mut out = RetellOutcome::default();
    let begin_deadline = Instant::now() + BEGIN_WAIT;
    let mut begun = false;
    let mut next_text = 0usize;
    let mut awaiting: Option<u64> = None;

    loop {
        // Flush what the driver wants done.
        while let Some(output) = driver.poll_output() {
            match output {
                DriverOutput::Send(ev) => {
                    let text = ev.to_json().context("encoding a Retell event")?;
                    events.emit("sent", json!({"message": serde_json::from_str::<Value>(&text).unwrap_or(Value::Null)}));
                    ws.send(Message::Text(text.into()))
                        .await
                        .context("sending")?;
                }
                DriverOutput::AgentSpoke {
                    response_id,
                    content,
                } => {
                    events.emit(
                        "agent_spoke",
                        json!({"response_id": response_id, "content": content}),
                    );
                    if response_id == 0 {
                        out.begin = Some(content);
                        begun = true;
                    } else {
                        out.responses.push((response_id, content));
                        if awaiting == Some(response_id) {
                            awaiting = None;
                        }
                    }
                }
                DriverOutput::InterruptSpoken {
                    interrupt_id,
                    content,
                } => {
                    events.emit(
                        "agent_interrupt_spoken",
                        json!({"interrupt_id": interrupt_id, "content": content}),
                    );
                }
                DriverOutput::Transfer { number } => {
                    events.emit("transfer", json!({"number": number}));
                }
                DriverOutput::PressDigits { digits } => {
                    events.emit("press_digits", json!({"digits": digits}));
                }
                DriverOutput::Metadata(m) => {
                    events.emit("metadata_received", json!({"metadata": m}));
                }
                DriverOutput::Unknown(u) => {
                    events.emit("unknown_event", json!({"event": format!("{u:?}")}));
                }
                DriverOutput::Violation(v) => {
                    let v = format!("{v:?}");
                    events.emit("violation", json!({"violation": v}));
                    out.violations.push(v);
                }
                DriverOutput::Close { code } => {
                    events.emit("closing", json!({"code": code}));
                    let _ = ws
                        .close(Some(CloseFrame {
                            code: CloseCode::from(code),
                            reason: "".into(),
                        }))
                        .await;
                }
                DriverOutput::Reconnect { attempt } => {
                    events.emit("reconnect", json!({"attempt": attempt}));
                    ws = ws::connect(&opts.url, &[], opts.timeout).await?;
                    driver.handle_input(std::time::Instant::now(), DriverInput::Connected);
                }
                DriverOutput::CallEnded(reason) => {
                    let reason = format!("{reason:?}");
                    events.emit("call_ended", json!({"reason": reason}));
                    out.ended = Some(reason);
                }
                other => events.emit("driver", json!({"output": format!("{other:?}")})),
            }
        }
        if out.ended.is_some() {
            break;
        }
        let can_speak = begun || Instant::now() >= begin_deadline;
        if can_speak && awaiting.is_none() {
            let Some(text) = opts.texts.get(next_text) else {
                break;
            };
            next_text += 1;
            driver.handle_input(
                std::time::Instant::now(),
                DriverInput::UserSaid(text.clone()),
            );
            awaiting = driver.last_requested();
            continue;
        }
        let timer = driver.poll_timeout().map(|t| {
            let now = std::time::Instant::now();
            Instant::now() + t.saturating_duration_since(now)
        });
        let wake = if begun {
            deadline
        } else {
            begin_deadline.min(deadline)
        };
        tokio::select! {
            () = sleep_until(wake) => {
                if Instant::now() >= deadline { bail!("timed out after {:?}", opts.timeout); }
            }
            () = sleep_until(timer.unwrap_or(deadline)), if timer.is_some() => {
                driver.handle_timeout(std::time::Instant::now());
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Text(text))) => {
                    let raw: Value = serde_json::from_str(text.as_str()).unwrap_or_else(|_| json!(text.as_str()));
                    events.emit("recv", json!({"message": raw}));
                    match ServerEvent::from_json(text.as_str()) {
                        Ok(ev) => {
                            match &ev {
                                ServerEvent::Config(_) => out.configured = true,
                                // An empty begin message means "wait for the user": no
                                // AgentSpoke comes for it, so note it here.
                                ServerEvent::Response(r) if r.response_id == 0 && r.content_complete => {
                                    begun = true;
                                    out.begin.get_or_insert_with(String::new);
                                }
                                _ => {}
                            }
                            driver.handle_input(std::time::Instant::now(), DriverInput::Received(ev));
                        }
                        Err(e) => events.emit("malformed", json!({"error": e.to_string()})),
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    events.emit("closed", ws::close_fields(frame.as_ref()));
                    driver.handle_input(std::time::Instant::now(), DriverInput::Disconnected);
                    if awaiting.is_some() || next_text < opts.texts.len() {
                        // The driver decides whether to reconnect; keep looping for its outputs.
                        if driver.is_ended() {
                            continue;
                        }
                        ws = reconnect_or_fail(&mut driver, opts, events).await?;
                    } else {
                        return Ok(out);
                    }
                }
                None | Some(Err(_)) => {
                    driver.handle_input(std::time::Instant::now(), DriverInput::Disconnected);
                    if driver.is_ended() && out.ended.is_none() {
                        continue;
                    }
                    ws = reconnect_or_fail(&mut driver, opts, events).await?;
                }
                Some(Ok(_)) => {}
            }
        }
    }
    let _ = ws
        .close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        }))
        .await;
    events.emit(
        "done",
        json!({"responses": out.responses.len(), "violations": out.violations.len()}),
    );
    Ok(out)
}

/// After a lost connection: follow the driver's `Reconnect`, or fail if it ended the call.
async fn reconnect_or_fail(
    driver: &mut RetellDriver,
    opts: &RetellOptions,
    events: &mut Events,
) -> anyhow::Result<Ws> {
    while let Some(output) = driver.poll_output() {
        match output {
            DriverOutput::Reconnect { attempt } => {
                events.emit("reconnect", json!({"attempt": attempt}));
                let ws = ws::connect(&opts.url, &[], opts.timeout).await?;
                driver.handle_input(std::time::Instant::now(), DriverInput::Connected);
                return Ok(ws);
            }
            DriverOutput::CallEnded(reason) => {
                events.emit("call_ended", json!({"reason": format!("{reason:?}")}));
                bail!("the server closed the call before it was over ({reason:?})");
            }
            other => events.emit("driver", json!({"output": format!("{other:?}")})),
        }
    }
    bail!("the server closed the connection")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_id_is_the_last_path_segment() {
        assert_eq!(call_id_of("ws://h:1/llm-websocket/call_42"), "call_42");
        assert_eq!(call_id_of("ws://h:1/llm-websocket/call_42/"), "call_42");
        assert_eq!(call_id_of("wss://h/llm-websocket/abc?x=1"), "abc");
        assert_eq!(call_id_of("ws://h:1"), "call_voxgate_client");
    }

    #[test]
    fn ping_timestamps_are_epoch_milliseconds() {
        let t = std::time::UNIX_EPOCH + Duration::from_millis(1_764_000_000_123);
        assert_eq!(epoch_ms(t), 1_764_000_000_123);
        assert_eq!(epoch_ms(std::time::UNIX_EPOCH - Duration::from_secs(1)), 0);
    }
}
