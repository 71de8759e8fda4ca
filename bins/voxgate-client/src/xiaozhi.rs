//! The Xiaozhi door, played as an ESP32 device: optional OTA, hello, text turns with
//! `listen detect`, audio turns streamed as 60 ms Opus frames at real time, MCP answered from a
//! small built-in tool set, reply audio decoded and saved.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::tungstenite::Message;
use voxgate_audio::opus::{OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig};
use voxgate_xiaozhi::control::{
    DeviceHello, DeviceMessage, Features, Listen, ListenMode, Mcp, ServerMessage, TtsState,
};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};
use voxgate_xiaozhi::ota::OtaResponse;

use crate::audio::{self, Pacing, Playback};
use crate::events::Events;
use crate::ws::{self, Ws};

/// The uplink rate every device uses.
pub const UPLINK_RATE: u32 = 16_000;
/// The uplink frame length (60 ms, as the firmware sends).
pub const UPLINK_FRAME: Duration = Duration::from_millis(60);
/// How long to wait for the server's hello (the firmware's own limit).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// In auto mode, silence streamed after the WAV while waiting for the server to end the turn.
const AUTO_SILENCE_MAX: Duration = Duration::from_secs(4);

/// What to do in one device session.
#[derive(Debug, Clone)]
pub struct XiaozhiOptions {
    /// The WebSocket URL; `None` takes it from the OTA answer.
    pub url: Option<String>,
    /// The OTA URL to POST to first (e.g. `http://host:8080/xiaozhi/ota/`).
    pub ota: Option<String>,
    /// Text turns (`listen detect`), each after the previous reply's `tts stop`.
    pub texts: Vec<String>,
    /// A WAV streamed as one audio turn after the text turns.
    pub wav: Option<PathBuf>,
    /// Where to save the decoded reply audio as WAV.
    pub save_reply: Option<PathBuf>,
    /// `Device-Id` (a MAC address).
    pub device_id: String,
    /// `Client-Id` (a UUID).
    pub client_id: String,
    /// Bearer token; the OTA's token when `None`.
    pub token: Option<String>,
    /// Binary protocol version 1, 2 or 3; the OTA's, else 1, when `None`.
    pub protocol_version: Option<u8>,
    /// How an audio turn ends: `manual` sends `listen stop`, `auto` waits for the server's VAD.
    pub mode: ListenMode,
    /// Announce MCP and answer the server's MCP requests with the built-in tools.
    pub mcp: bool,
    /// Give up after this long.
    pub timeout: Duration,
}

impl XiaozhiOptions {
    /// Defaults: a fixed test device, protocol 1, manual mode, MCP on, 30 s timeout.
    #[must_use]
    pub fn new(url: Option<String>) -> Self {
        Self {
            url,
            ota: None,
            texts: Vec::new(),
            wav: None,
            save_reply: None,
            device_id: "02:00:00:00:00:01".into(),
            client_id: "0b0c0d0e-0000-4000-8000-000000000001".into(),
            token: None,
            protocol_version: None,
            mode: ListenMode::Manual,
            mcp: true,
            timeout: Duration::from_secs(30),
        }
    }
}

/// What a session produced.
#[derive(Debug, Clone, Default)]
pub struct XiaozhiOutcome {
    /// The server hello's session id.
    pub session_id: String,
    /// `stt` texts.
    pub stt: Vec<String>,
    /// `tts sentence_start` texts.
    pub sentences: Vec<String>,
    /// `llm` emotions.
    pub emotions: Vec<String>,
    /// Turns that ended with `tts stop`.
    pub turns: usize,
    /// Opus frames received.
    pub reply_frames: u64,
    /// Frames that arrived after their playback slot.
    pub late_frames: u64,
    /// Decoded reply audio at the downlink rate.
    pub audio: Vec<i16>,
    /// The downlink rate.
    pub sample_rate: u32,
    /// MCP requests answered.
    pub mcp_requests: Vec<String>,
}

enum Turn {
    Text(String),
    Audio(Vec<Vec<u8>>),
}

/// Posts the device's system info to the OTA URL and returns the answer.
///
/// # Errors
/// HTTP failures, a non-success status, or a body that is not an OTA answer.
pub async fn ota(url: &str, device_id: &str, client_id: &str) -> anyhow::Result<OtaResponse> {
    let body = json!({
        "version": 2,
        "language": "en-US",
        "mac_address": device_id,
        "uuid": client_id,
        "chip_model_name": "voxgate-client",
        "application": {"name": "xiaozhi", "version": "1.6.0"},
        "board": {"type": "voxgate-client", "name": "voxgate-client"},
    });
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .context("HTTP client")?;
    let response = client
        .post(url)
        .header("Device-Id", device_id)
        .header("Client-Id", client_id)
        .header("Activation-Version", "1")
        .header("User-Agent", "voxgate-client/1.6.0")
        .header("Accept-Language", "en-US")
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .with_context(|| format!("OTA request to {url}"))?;
    let status = response.status();
    let bytes = response.bytes().await.context("OTA body")?;
    if !status.is_success() {
        bail!("OTA answered {status}: {}", String::from_utf8_lossy(&bytes));
    }
    serde_json::from_slice(&bytes).context("OTA answer is not valid")
}

/// Encodes mono 16 kHz audio as 60 ms Opus packets (the last one padded).
///
/// # Errors
/// When the encoder fails.
pub fn encode_opus(samples: &[f32]) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut enc =
        OpusEncoder::new(OpusEncoderConfig::voice(UPLINK_RATE)).context("Opus encoder")?;
    let len = enc.frame_samples();
    audio::frames(samples, len)
        .iter()
        .map(|f| enc.encode_f32(f).map(<[u8]>::to_vec).context("Opus encode"))
        .collect()
}

/// The request headers a device sends on upgrade.
#[must_use]
pub fn upgrade_headers(
    device_id: &str,
    client_id: &str,
    token: Option<&str>,
    version: ProtocolVersion,
) -> Vec<(&'static str, String)> {
    let mut headers = vec![
        ("protocol-version", version.number().to_string()),
        ("device-id", device_id.to_owned()),
        ("client-id", client_id.to_owned()),
    ];
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        // A token that already holds a scheme is sent verbatim, like the firmware does.
        let value = if token.contains(' ') {
            token.to_owned()
        } else {
            format!("Bearer {token}")
        };
        headers.push(("authorization", value));
    }
    headers
}

/// The device hello: protocol version, features, 16 kHz mono 60 ms Opus uplink.
#[must_use]
pub fn hello(version: ProtocolVersion, mcp: bool) -> String {
    let hello = DeviceHello {
        session_id: None,
        version: Some(u32::from(version.number())),
        features: Features {
            aec: Some(false),
            mcp: Some(mcp),
            ..Features::default()
        },
        transport: Some(voxgate_xiaozhi::control::Transport::WebSocket),
        audio_params: Some(voxgate_xiaozhi::control::AudioParams::uplink()),
    };
    DeviceMessage::from(hello).to_json()
}

fn listen(msg: Listen, session_id: &str) -> String {
    let mut msg = msg;
    msg.session_id = Some(session_id.to_owned());
    DeviceMessage::from(msg).to_json()
}

/// Runs one device session, emitting every event to `events`.
///
/// # Errors
/// OTA or connection failures, no hello, the server closing before the turns finished, or the
/// timeout.
pub async fn run(opts: &XiaozhiOptions, events: &mut Events) -> anyhow::Result<XiaozhiOutcome> {
    let deadline = Instant::now() + opts.timeout;
    let mut url = opts.url.clone();
    let mut token = opts.token.clone();
    let mut version = opts.protocol_version;
    if let Some(ota_url) = &opts.ota {
        let answer = ota(ota_url, &opts.device_id, &opts.client_id).await?;
        events.emit("ota", serde_json::to_value(&answer).unwrap_or(Value::Null));
        // A server with device auth on hands no token until the device is activated: say how,
        // instead of failing later with a bare 401.
        if let (Some(activation), None) = (&answer.activation, &token) {
            let no_token = answer.websocket.as_ref().is_none_or(|w| w.token.is_empty());
            if no_token {
                bail!(
                    "the server wants this device ({}) activated: code {}. Confirm it on the \
                     server (POST /admin/xiaozhi/activate with {{\"code\":\"{}\"}}), then run \
                     again",
                    opts.device_id,
                    activation.code,
                    activation.code
                );
            }
        }
        if let Some(wsc) = answer.websocket {
            url = url.or(Some(wsc.url));
            if token.is_none() && !wsc.token.is_empty() {
                token = Some(wsc.token);
            }
            version = version.or(Some(wsc.version.number()));
        }
    }
    let url = url.context("no WebSocket URL: give one or an --ota URL whose answer has one")?;
    let version = ProtocolVersion::from_number(u64::from(version.unwrap_or(1)))
        .context("protocol version")?;
    let codec = FrameCodec::new(version);

    let mut turns: Vec<Turn> = opts.texts.iter().cloned().map(Turn::Text).collect();
    if let Some(path) = &opts.wav {
        let samples = audio::load_wav(path, UPLINK_RATE)?;
        turns.push(Turn::Audio(encode_opus(&samples)?));
    }
    // Silence packets for the auto-mode tail.
    let silence = encode_opus(&vec![0.0; audio::frame_samples(UPLINK_RATE, UPLINK_FRAME)])?
        .pop()
        .unwrap_or_default();

    let headers = upgrade_headers(&opts.device_id, &opts.client_id, token.as_deref(), version);
    let fields = json!({"protocol_version": version.number()});
    let mut ws = ws::open(&url, &headers, opts.timeout, events, fields).await?;
    send_text(&mut ws, hello(version, opts.mcp), events).await?;

    let mut out = XiaozhiOutcome::default();
    let mut tools = DeviceTools::default();
    let mut decoder: Option<OpusDecoder> = None;
    let mut playback = Playback::new(Duration::from_millis(60), Duration::from_millis(30));
    let hello_deadline = Instant::now() + HELLO_TIMEOUT;
    let mut ready = false;
    let mut turn_index = 0usize;
    let mut waiting = false;
    let mut speaking = false;
    let mut streaming: Option<(Pacing, usize)> = None;
    let mut tail_until: Option<Instant> = None;
    let mut frame_buf = Vec::with_capacity(codec.max_frame_len());

    loop {
        if ready && !waiting && streaming.is_none() {
            match turns.get(turn_index) {
                None => break,
                Some(Turn::Text(text)) => {
                    send_text(
                        &mut ws,
                        listen(Listen::detect(text.clone()), &out.session_id),
                        events,
                    )
                    .await?;
                    waiting = true;
                }
                Some(Turn::Audio(_)) => {
                    send_text(
                        &mut ws,
                        listen(Listen::start(opts.mode.clone()), &out.session_id),
                        events,
                    )
                    .await?;
                    streaming = Some((Pacing::new(Instant::now(), UPLINK_FRAME), 0));
                    tail_until = None;
                    waiting = true;
                }
            }
        }
        let next_frame = streaming.map(|(p, i)| p.due(i as u64));
        let limit = if ready {
            deadline
        } else {
            hello_deadline.min(deadline)
        };
        tokio::select! {
            () = sleep_until(limit) => {
                if ready { bail!("timed out after {:?}", opts.timeout) }
                bail!("no server hello within {HELLO_TIMEOUT:?}")
            }
            () = sleep_until(next_frame.unwrap_or(limit)), if next_frame.is_some() => {
                let Some((_, i)) = streaming.as_mut() else { continue };
                let Some(Turn::Audio(packets)) = turns.get(turn_index) else { continue };
                let packet = if let Some(p) = packets.get(*i) {
                    p
                } else {
                    // Past the WAV: manual mode stops, auto mode sends silence until the server
                    // ends the turn (or gives up and stops).
                    let now = Instant::now();
                    let tail_end = *tail_until.get_or_insert(now + AUTO_SILENCE_MAX);
                    if opts.mode == ListenMode::Manual || speaking || now >= tail_end {
                        events.emit("sent", json!({"message": "audio_stream_end", "frames": *i}));
                        streaming = None;
                        if opts.mode == ListenMode::Manual || !speaking {
                            send_text(&mut ws, listen(Listen::stop(), &out.session_id), events).await?;
                        }
                        continue;
                    }
                    &silence
                };
                frame_buf.clear();
                codec.encode(&Frame::opus(packet), &mut frame_buf).context("framing")?;
                ws.send(Message::Binary(frame_buf.clone().into())).await.context("sending audio")?;
                *i += 1;
            }
            msg = ws.next() => {
                match msg {
                    Some(Ok(Message::Text(text))) => {
                        let raw: Value = serde_json::from_str(text.as_str()).unwrap_or_else(|_| json!(text.as_str()));
                        events.emit("recv", json!({"message": raw}));
                        let parsed = match ServerMessage::from_slice(text.as_bytes()) {
                            Ok(m) => m,
                            Err(e) => {
                                events.emit("malformed", json!({"error": e.to_string()}));
                                continue;
                            }
                        };
                        match parsed {
                            ServerMessage::Hello(h) => {
                                out.session_id = h.session_id.clone();
                                out.sample_rate = h.audio_params.sample_rate;
                                let frame_ms = u64::from(h.audio_params.frame_duration.max(1));
                                playback = Playback::new(Duration::from_millis(frame_ms), Duration::from_millis(30));
                                decoder = Some(OpusDecoder::new(h.audio_params.sample_rate, OpusBackend::Pure)
                                    .context("Opus decoder for the announced rate")?);
                                ready = true;
                            }
                            ServerMessage::Stt(s) => out.stt.push(s.text),
                            ServerMessage::Llm(l) => out.emotions.push(l.emotion.as_str().to_owned()),
                            ServerMessage::Tts(t) => match t.state {
                                TtsState::Start => {
                                    speaking = true;
                                    // A device in auto mode stops its microphone while it speaks.
                                    if opts.mode == ListenMode::Auto && let Some((_, i)) = streaming.take() {
                                        events.emit("sent", json!({"message": "audio_stream_end", "frames": i}));
                                    }
                                }
                                TtsState::SentenceStart => out.sentences.extend(t.text),
                                TtsState::Stop => {
                                    playback.stop();
                                    if speaking || waiting {
                                        out.turns += 1;
                                    }
                                    speaking = false;
                                    if waiting && streaming.is_none() {
                                        waiting = false;
                                        turn_index += 1;
                                    }
                                }
                                _ => {}
                            },
                            ServerMessage::Mcp(m) => {
                                let payload = m.payload_value().unwrap_or(Value::Null);
                                if let Some(method) = payload.get("method").and_then(Value::as_str) {
                                    out.mcp_requests.push(method.to_owned());
                                }
                                if let Some(reply) = tools.handle(&payload) {
                                    let mut msg = Mcp::wrap(reply);
                                    msg.session_id = Some(out.session_id.clone());
                                    send_text(&mut ws, DeviceMessage::from(msg).to_json(), events).await?;
                                }
                            }
                            _ => {}
                        }
                    }
                    Some(Ok(Message::Binary(bytes))) => {
                        let now = Instant::now();
                        match codec.decode(&bytes) {
                            Ok(frame) => {
                                out.reply_frames += 1;
                                playback.frame(now);
                                let mut samples = 0;
                                if let Some(dec) = decoder.as_mut() {
                                    match dec.decode(frame.payload) {
                                        Ok(pcm) => {
                                            samples = pcm.len();
                                            out.audio.extend_from_slice(pcm);
                                        }
                                        Err(e) => events.emit("bad_opus", json!({"error": e.to_string()})),
                                    }
                                }
                                events.emit("audio", json!({"bytes": frame.payload.len(),
                                    "timestamp": frame.timestamp, "samples": samples}));
                            }
                            Err(e) => events.emit("bad_frame", json!({"error": e.to_string(), "bytes": bytes.len()})),
                        }
                    }
                    Some(Ok(Message::Close(frame))) => {
                        events.emit("closed", ws::close_fields(frame.as_ref()));
                        bail!("server closed the session");
                    }
                    None => bail!("connection lost"),
                    Some(Err(e)) => return Err(e).context("receiving"),
                    Some(Ok(_)) => {}
                }
            }
        }
    }
    out.late_frames = playback.late;
    let _ = ws.close(None).await;
    events.emit(
        "done",
        json!({"turns": out.turns, "reply_frames": out.reply_frames,
        "late_frames": out.late_frames, "audio_samples": out.audio.len()}),
    );
    if let Some(path) = &opts.save_reply {
        audio::save_wav(path, out.sample_rate.max(8000), &out.audio)?;
        events.emit(
            "saved",
            json!({"path": path.display().to_string(),
            "samples": out.audio.len(), "sample_rate": out.sample_rate}),
        );
    }
    Ok(out)
}

async fn send_text(ws: &mut Ws, text: String, events: &mut Events) -> anyhow::Result<()> {
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    events.emit("sent", json!({"message": value}));
    ws.send(Message::Text(text.into())).await.context("sending")
}

/// The device's MCP server: a handful of the firmware's built-in tools over local state.
#[derive(Debug, Clone)]
pub struct DeviceTools {
    volume: i64,
    brightness: i64,
    theme: String,
}

impl Default for DeviceTools {
    fn default() -> Self {
        Self {
            volume: 70,
            brightness: 80,
            theme: "light".into(),
        }
    }
}

/// Largest `tools/list` page, like the firmware's cap.
const PAGE_BYTES: usize = 8000;

impl DeviceTools {
    fn tools() -> Vec<Value> {
        let int = |name: &str| json!({"type": "object", "properties": {name: {"type": "integer", "minimum": 0, "maximum": 100}}, "required": [name]});
        vec![
            json!({"name": "self.get_device_status", "description": "Current speaker volume, screen brightness and theme, battery and network state.", "inputSchema": {"type": "object", "properties": {}}}),
            json!({"name": "self.audio_speaker.set_volume", "description": "Set the speaker volume (0-100).", "inputSchema": int("volume")}),
            json!({"name": "self.screen.set_brightness", "description": "Set the screen brightness (0-100).", "inputSchema": int("brightness")}),
            json!({"name": "self.screen.set_theme", "description": "Set the screen theme: light or dark.", "inputSchema": {"type": "object", "properties": {"theme": {"type": "string", "enum": ["light", "dark"]}}, "required": ["theme"]}}),
            json!({"name": "self.reboot", "description": "Reboot the device.", "inputSchema": {"type": "object", "properties": {}}, "annotations": {"audience": ["user"]}}),
        ]
    }

    /// The answer to one JSON-RPC message from the server; `None` for notifications and
    /// responses (which a device ignores).
    pub fn handle(&mut self, msg: &Value) -> Option<Value> {
        let id = msg.get("id")?.clone();
        let method = msg.get("method")?.as_str()?;
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let result = match method {
            "initialize" => Ok(json!({
                "protocolVersion": "2024-11-05",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "voxgate-client", "version": env!("CARGO_PKG_VERSION")},
            })),
            "tools/list" => Ok(self.list(&params)),
            "tools/call" => self.call(&params),
            other => Err(format!("Method not found: {other}")),
        };
        Some(match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            // The firmware's errors carry no `code`; servers must tolerate that, so do the same.
            Err(message) => json!({"jsonrpc": "2.0", "id": id, "error": {"message": message}}),
        })
    }

    fn list(&self, params: &Value) -> Value {
        let cursor = params.get("cursor").and_then(Value::as_str).unwrap_or("");
        let with_user = params
            .get("withUserTools")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let tools: Vec<Value> = Self::tools()
            .into_iter()
            .filter(|t| with_user || t.get("annotations").is_none())
            .collect();
        let start = if cursor.is_empty() {
            0
        } else {
            tools
                .iter()
                .position(|t| t["name"] == cursor)
                .unwrap_or(tools.len())
        };
        let mut page = Vec::new();
        let mut size = 0;
        let mut next = None;
        for t in &tools[start..] {
            let len = t.to_string().len();
            if !page.is_empty() && size + len > PAGE_BYTES {
                next = t["name"].as_str().map(str::to_owned);
                break;
            }
            size += len;
            page.push(t.clone());
        }
        let mut result = json!({"tools": page});
        if let Some(next) = next {
            result["nextCursor"] = json!(next);
        }
        result
    }

    fn call(&mut self, params: &Value) -> Result<Value, String> {
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        let args = params.get("arguments").cloned().unwrap_or(Value::Null);
        let level = |key: &str| -> Result<i64, String> {
            args.get(key)
                .and_then(Value::as_i64)
                .filter(|v| (0..=100).contains(v))
                .ok_or_else(|| format!("Invalid arguments: {key} must be an integer 0..100"))
        };
        let text = match name {
            "self.get_device_status" => json!({
                "audio_speaker": {"volume": self.volume},
                "screen": {"brightness": self.brightness, "theme": self.theme},
                "battery": {"level": 87, "charging": false},
                "network": {"type": "wifi", "signal": "strong"},
            })
            .to_string(),
            "self.audio_speaker.set_volume" => {
                self.volume = level("volume")?;
                "true".into()
            }
            "self.screen.set_brightness" => {
                self.brightness = level("brightness")?;
                "true".into()
            }
            "self.screen.set_theme" => match args.get("theme").and_then(Value::as_str) {
                Some(t @ ("light" | "dark")) => {
                    t.clone_into(&mut self.theme);
                    "true".into()
                }
                _ => return Err("Invalid arguments: theme must be light or dark".into()),
            },
            "self.reboot" => "true".into(),
            other => return Err(format!("Unknown tool: {other}")),
        };
        Ok(json!({"content": [{"type": "text", "text": text}], "isError": false}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_handshake_list_and_calls() {
        let mut t = DeviceTools::default();
        let init = t.handle(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{"vision":{"url":"http://x","token":"t"}}}})).unwrap();
        assert_eq!(init["id"], 1);
        assert_eq!(init["result"]["serverInfo"]["name"], "voxgate-client");
        let list = t
            .handle(&json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":""}}))
            .unwrap();
        let names: Vec<&str> = list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"self.audio_speaker.set_volume"));
        assert!(
            !names.contains(&"self.reboot"),
            "user-only tools need withUserTools"
        );
        assert!(list["result"].get("nextCursor").is_none());
        let all = t.handle(&json!({"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"withUserTools":true}})).unwrap();
        assert_eq!(all["result"]["tools"].as_array().unwrap().len(), 5);
        let set = t.handle(&json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":15}}})).unwrap();
        assert_eq!(set["result"]["content"][0]["text"], "true");
        let status = t.handle(&json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"self.get_device_status"}})).unwrap();
        let text: Value =
            serde_json::from_str(status["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text["audio_speaker"]["volume"], 15);
        let bad = t.handle(&json!({"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":300}}})).unwrap();
        assert!(bad["error"]["message"].as_str().unwrap().contains("volume"));
        let unknown = t
            .handle(&json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"nope"}}))
            .unwrap();
        assert_eq!(unknown["error"]["message"], "Unknown tool: nope");
        assert!(
            t.handle(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
                .is_none()
        );
        assert!(
            t.handle(&json!({"jsonrpc":"2.0","id":8,"result":{}}))
                .is_none()
        );
    }

    #[test]
    fn paging_resumes_at_the_cursor() {
        let t = DeviceTools::default();
        let page = t.list(&json!({"cursor": "self.screen.set_brightness"}));
        let names: Vec<&str> = page["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["self.screen.set_brightness", "self.screen.set_theme"]
        );
    }

    #[test]
    fn upgrade_headers_and_hello_match_the_firmware() {
        let h = upgrade_headers("aa:bb", "c1", Some("tok"), ProtocolVersion::V3);
        assert!(h.contains(&("protocol-version", "3".into())));
        assert!(h.contains(&("authorization", "Bearer tok".into())));
        let h = upgrade_headers("aa:bb", "c1", Some("Basic abc"), ProtocolVersion::V1);
        assert!(h.contains(&("authorization", "Basic abc".into())));
        assert!(
            upgrade_headers("aa:bb", "c1", Some(""), ProtocolVersion::V1)
                .iter()
                .all(|(k, _)| *k != "authorization")
        );
        let v: Value = serde_json::from_str(&hello(ProtocolVersion::V2, true)).unwrap();
        assert_eq!(v["type"], "hello");
        assert_eq!(v["version"], 2);
        assert_eq!(v["features"]["mcp"], true);
        assert_eq!(v["transport"], "websocket");
        assert_eq!(
            v["audio_params"],
            json!({"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60})
        );
    }

    #[test]
    fn opus_packets_are_one_per_60_ms() {
        let one_second: Vec<f32> = (0..16_000).map(|i| (i as f32 * 0.06).sin() * 0.3).collect();
        let packets = encode_opus(&one_second).unwrap();
        assert_eq!(packets.len(), 17); // 16.67 frames, the last padded
        let mut dec = OpusDecoder::new(16_000, OpusBackend::Pure).unwrap();
        assert_eq!(dec.decode(&packets[0]).unwrap().len(), 960);
    }
}
