//! What an operator reads about turns, over real sockets: scripted turns on the Xiaozhi,
//! realtime, Retell and Gemini doors of a real server on 127.0.0.1, then `GET /metrics` parsed
//! with a real Prometheus parser (`prometheus-parse`), checking that each turn-stage, provider
//! and tool histogram moved, by the turn, with plausible values; and `GET /admin/sessions`
//! (and `/{id}`) showing an open session's state, last turn and timeline.
//!
//! Providers are the in-process OpenAI-compatible fakes with known delays, so a histogram's
//! sum has a lower bound (each observation waited at least its fake's delay); upper bounds are
//! generous plausibility ranges only. The VIP door (WebRTC) is covered by voxgate-client's
//! `tests/vip_observability.rs`, which has a WebRTC client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::float_cmp, reason = "counts are small integers, exact in f64")]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use prometheus_parse::Scrape;
use serde_json::{Value, json};
use support::{
    Histogram, Running, WAIT, Ws, connect, histogram, http, mcp_server, next_message, opus_device,
    opus_packets, question, realtime, recv_json, rt_recv, rt_send, scalar, scrape, scrape_until,
    send_json, serve_calls_after, stream_opus, tool, until_tts_stop, wait_tools,
};
use tokio_tungstenite::tungstenite::Message;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::proto::{HostedTtsMode, InferenceTriggerMode, ToolDefinition};
use voxgate_realtime::{
    AudioFormat, HostedTtsSettings, HostedVoice, ServiceBoundMessage, SessionConfig, TtsSettings,
};
use voxgate_server::Config;
use voxgate_server::metrics::Door;
use voxgate_test_support::fake_providers::{FakeDelays, FakeProviders, TRANSCRIPT};

/// The fake recognizer's delay.
const ASR: Duration = Duration::from_millis(100);
/// The fake model's delay to its first token.
const LLM: Duration = Duration::from_millis(150);
/// The fake synthesizer's delay to its first audio byte.
const TTS: Duration = Duration::from_millis(200);
/// The silence the VAD of the Xiaozhi, Gemini and VIP doors waits for before it ends speech
/// (`vad_stop_ms`'s default): spoken-turn figures count from the last voiced audio, before it.
const VAD_STOP: Duration = Duration::from_millis(200);

const ENDPOINTING: &str = "voxgate_turn_endpointing_seconds";
const FIRST_AUDIO: &str = "voxgate_turn_first_audio_seconds";
const BARGE_IN: &str = "voxgate_barge_in_seconds";
const PROVIDER: &str = "voxgate_provider_latency_seconds";
const SERVER_ADDED: &str = "voxgate_turn_server_added_seconds";
const TOOL_CALL: &str = "voxgate_tool_call_seconds";

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Fakes with the delays above.
async fn fakes() -> FakeProviders {
    FakeProviders::start(FakeDelays {
        asr: ASR,
        llm_first_token: LLM,
        tts_first_byte: TTS,
    })
    .await
    .unwrap()
}

/// The default configuration with ASR, LLM and TTS all served by `fakes`.
fn with_fakes(fakes: &FakeProviders) -> Config {
    support::with_fakes(&fakes.base_url())
}

/// A whole test within a bound, so a hang fails instead of stalling the run.
async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(WAIT * 4, test).await.unwrap();
}

/// A door's series of `metric`.
fn door_hist(s: &Scrape, metric: &str, door: Door) -> Histogram {
    histogram(s, metric, &[("door", door.label())])
}

/// A door's provider latency for `provider` (`asr`, `llm`, `tts`).
fn provider(s: &Scrape, door: Door, provider: &str) -> Histogram {
    histogram(
        s,
        PROVIDER,
        &[("door", door.label()), ("provider", provider)],
    )
}

/// A door's tool call round trips of `kind`.
fn tool_calls(s: &Scrape, door: Door, kind: &str) -> Histogram {
    histogram(s, TOOL_CALL, &[("door", door.label()), ("kind", kind)])
}

/// A door's counter (`voxgate_interruptions_total`...).
fn counter(s: &Scrape, name: &str, door: Door) -> f64 {
    scalar(s, name, &[("door", door.label())])
}

/// Every observation of `h` waited at least `floor`, and there are `count` of them.
fn assert_waited(h: Histogram, count: f64, floor: Duration, what: &str) {
    assert_eq!(h.count, count, "{what}: {h:?}");
    assert!(
        h.sum >= count * secs(floor),
        "{what}: {h:?}, each at least {floor:?}"
    );
    // Plausibility only: a loaded debug build is slow, but not ten seconds per observation.
    assert!(h.sum < count * 10.0, "{what}: {h:?}");
}

// ---- admin ---------------------------------------------------------------------------------

/// `GET /admin/sessions`.
async fn admin_sessions(addr: SocketAddr) -> Value {
    let r = http(addr, "GET", "/admin/sessions", &[], b"").await;
    assert_eq!(r.status, 200, "{r:?}");
    r.json()
}

/// The open sessions of `door` in `GET /admin/sessions`.
async fn open_of(addr: SocketAddr, door: Door) -> Vec<Value> {
    admin_sessions(addr).await["open"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["door"] == door.label())
        .cloned()
        .collect()
}

/// The only open session of `door` once `ready` accepts it (its figures are published as
/// the session's events are processed, which may be just after the client saw them).
async fn admin_entry(addr: SocketAddr, door: Door, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let open = open_of(addr, door).await;
        assert!(open.len() <= 1, "{open:#?}");
        if let Some(s) = open.first()
            && ready(s)
        {
            return s.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ready {} session: {open:#?}",
            door.label()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET /admin/sessions/{id}`: the status and the body.
async fn admin_session(addr: SocketAddr, id: &str) -> (u16, Value) {
    let r = http(addr, "GET", &format!("/admin/sessions/{id}"), &[], b"").await;
    (r.status, r.json())
}

/// Waits until `door` has no session in `GET /admin/sessions`.
async fn admin_drained(addr: SocketAddr, door: Door) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !open_of(addr, door).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} session still listed",
            door.label()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ms(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not milliseconds: {v}"))
}

// ---- Xiaozhi --------------------------------------------------------------------------------

/// One spoken turn: `question.wav` at real time, then silence until the turn ends; the reply
/// up to its `tts stop`.
async fn spoken_turn(ws: &mut Ws, codec: &voxgate_xiaozhi::frame::FrameCodec) -> Vec<Value> {
    stream_opus(ws, codec, &opus_packets(&question(), 800)).await;
    let (events, audio) = until_tts_stop(ws).await;
    assert!(
        events
            .iter()
            .any(|v| v["type"] == "stt" && v["text"] == TRANSCRIPT),
        "{events:#?}"
    );
    assert!(audio > 0, "{events:#?}");
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xiaozhi_spoken_turns_move_every_stage_and_show_in_admin_sessions() {
    bounded(async {
        let fakes = fakes().await;
        let server = Running::start(with_fakes(&fakes)).await;
        let (_, fresh) = scrape(&server).await;
        for metric in [ENDPOINTING, FIRST_AUDIO, SERVER_ADDED, BARGE_IN] {
            assert_eq!(
                door_hist(&fresh, metric, Door::Xiaozhi),
                Histogram::default()
            );
        }
        let (mut ws, codec) = opus_device(server.addr, "auto").await;
        let mut before = fresh;
        for turn in 1..=2_u32 {
            if turn > 1 {
                send_json(
                    &mut ws,
                    &json!({"session_id": "s", "type": "listen", "state": "start", "mode": "auto"}),
                )
                .await;
            }
            spoken_turn(&mut ws, &codec).await;
            let n = f64::from(turn);
            let after = scrape_until(&server, "the turn's figures", |s| {
                door_hist(s, FIRST_AUDIO, Door::Xiaozhi).count >= n
                    && door_hist(s, SERVER_ADDED, Door::Xiaozhi).count >= n
            })
            .await;
            // One observation per spoken turn, in a plausible range: about 300 ms on the
            // defaults (vad_stop_ms 200 + endpoint_delay_ms 100, the recognizer's 100 ms
            // inside that wait), never under the VAD's silence.
            let endpointing = door_hist(&after, ENDPOINTING, Door::Xiaozhi);
            let last = door_hist(&before, ENDPOINTING, Door::Xiaozhi);
            assert_eq!(endpointing.count, n, "{endpointing:?}");
            let this = endpointing.sum - last.sum;
            assert!(
                (secs(VAD_STOP)..1.5).contains(&this),
                "endpointing {this} s"
            );
            // The providers, each at least its fake's delay, once per turn.
            assert_waited(provider(&after, Door::Xiaozhi, "asr"), n, ASR, "asr");
            assert_waited(provider(&after, Door::Xiaozhi, "llm"), n, LLM, "llm");
            assert_waited(provider(&after, Door::Xiaozhi, "tts"), n, TTS, "tts");
            // What the user waited: at least the VAD's silence and the three waits in a row.
            let least = VAD_STOP + ASR + LLM + TTS;
            let first_audio = door_hist(&after, FIRST_AUDIO, Door::Xiaozhi);
            assert_waited(first_audio, n, least, "first audio");
            let this = first_audio.sum - door_hist(&before, FIRST_AUDIO, Door::Xiaozhi).sum;
            assert!(this >= secs(least), "first audio {this} s");
            // The server's own share: one per turn (its first reply frame), small.
            let added = door_hist(&after, SERVER_ADDED, Door::Xiaozhi);
            assert_eq!(added.count, n, "{added:?}");
            assert!(added.sum < n * 1.0, "{added:?}");
            // Nothing interrupted, no tools; other doors untouched.
            assert_eq!(door_hist(&after, BARGE_IN, Door::Xiaozhi).count, 0.0);
            for name in ["voxgate_interruptions_total", "voxgate_replies_cut_total"] {
                assert_eq!(counter(&after, name, Door::Xiaozhi), 0.0, "{name}");
            }
            assert_eq!(provider(&after, Door::Realtime, "tts").count, 0.0);
            assert_eq!(door_hist(&after, ENDPOINTING, Door::Vip).count, 0.0);

            // The open session in the admin list, its last turn's figures as measured.
            let entry = admin_entry(server.addr, Door::Xiaozhi, |s| {
                s["turns"].as_u64() == Some(u64::from(turn))
            })
            .await;
            assert_eq!(entry["device"], "aa:bb:cc:dd:ee:ff", "{entry:#}");
            assert!(
                entry["peer"].as_str().unwrap().starts_with("127.0.0.1:"),
                "{entry:#}"
            );
            assert!(
                ["idle", "listening"].contains(&entry["state"].as_str().unwrap()),
                "{entry:#}"
            );
            assert!(entry["age_s"].as_f64().unwrap() > 0.0);
            let t = &entry["last_turn"];
            assert_eq!(t["spoken"], true, "{entry:#}");
            assert_eq!(t["outcome"], "completed", "{entry:#}");
            assert_eq!(t["interrupted"], false, "{entry:#}");
            assert!(t["barge_in_ms"].is_null(), "{entry:#}");
            assert!(ms(&t["asr_ms"]) >= 100, "{entry:#}");
            assert!(ms(&t["llm_first_token_ms"]) >= 150, "{entry:#}");
            assert!(ms(&t["tts_first_byte_ms"]) >= 200, "{entry:#}");
            assert!(ms(&t["first_audio_ms"]) >= 650, "{entry:#}");
            assert!((200..1500).contains(&ms(&t["endpointing_ms"])), "{entry:#}");
            assert!(
                ms(&t["duration_ms"]) >= ms(&t["first_audio_ms"]),
                "{entry:#}"
            );
            let id = entry["id"].as_str().unwrap();
            assert_eq!(id.len(), 16, "{entry:#}");

            // Its timeline: every turn so far, completed, the last one as listed.
            let (status, detail) = admin_session(server.addr, id).await;
            assert_eq!(status, 200, "{detail:#}");
            assert_eq!(detail["door"], "xiaozhi");
            let timeline = detail["timeline"].as_array().unwrap();
            let ended: Vec<&Value> = timeline.iter().filter(|t| t["outcome"] != "open").collect();
            assert_eq!(ended.len(), turn as usize, "{detail:#}");
            assert!(
                ended.iter().all(|t| t["outcome"] == "completed"),
                "{detail:#}"
            );
            assert_eq!(*ended[ended.len() - 1], *t, "{detail:#}");
            before = after;
        }
        let (status, body) = admin_session(server.addr, "0123456789abcdef").await;
        assert_eq!(status, 404, "{body}");
        assert_eq!(body["error"], "not_found");

        // Closed: gone from the list, and its id is unknown.
        let id = open_of(server.addr, Door::Xiaozhi).await[0]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        ws.close(None).await.unwrap();
        server.sessions_drain(Door::Xiaozhi).await;
        admin_drained(server.addr, Door::Xiaozhi).await;
        assert_eq!(admin_session(server.addr, &id).await.0, 404);
        let (_, last) = scrape(&server).await;
        assert_eq!(counter(&last, "voxgate_turns_total", Door::Xiaozhi), 2.0);
        assert_eq!(
            counter(&last, "voxgate_replies_cut_total", Door::Xiaozhi),
            0.0
        );
        server.stop().await;
    })
    .await;
}

/// The speech the interruption policy waits for (`interruption_min_speech_ms`'s default).
const MIN_SPEECH: Duration = Duration::from_millis(300);

const LONG: &str = "please read this long sentence back to me slowly so that the reply \
    takes many seconds of audio to play on the little speaker of the device";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speech_over_a_xiaozhi_reply_is_a_timed_barge_in_and_a_cut_reply() {
    bounded(async {
        // The embedded demo agent and synthesizer: a reply to LONG plays for seconds.
        let server = Running::start(Config::default()).await;
        let (mut ws, codec) = opus_device(server.addr, "realtime").await;
        send_json(
            &mut ws,
            &json!({"session_id": "s", "type": "listen", "state": "detect", "text": LONG}),
        )
        .await;
        let mut frames = 0;
        while frames < 6 {
            if let Message::Binary(_) = next_message(&mut ws, WAIT).await.unwrap() {
                frames += 1;
            }
        }
        // The user talks over the reply at real time (the device streams in realtime mode).
        let (mut sink, mut stream) = ws.split();
        let talker = tokio::spawn(async move {
            stream_opus(&mut sink, &codec, &opus_packets(&question(), 600)).await;
            sink
        });
        let (events, _) = until_tts_stop(&mut stream).await;
        assert!(
            !events.iter().any(|v| v["type"] == "stt"),
            "no recognizer: {events:#?}"
        );
        let after = scrape_until(&server, "the barge-in", |s| {
            door_hist(s, BARGE_IN, Door::Xiaozhi).count >= 1.0
        })
        .await;
        let barge_in = door_hist(&after, BARGE_IN, Door::Xiaozhi);
        assert_eq!(barge_in.count, 1.0, "{barge_in:?}");
        // Speech onset → playback cleared includes the speech the interruption policy waits
        // for (interruption_min_speech_ms, 300 ms by default) after the VAD declared it.
        assert!(
            (secs(MIN_SPEECH)..3.0).contains(&barge_in.sum),
            "{barge_in:?}"
        );
        assert_eq!(
            counter(&after, "voxgate_interruptions_total", Door::Xiaozhi),
            1.0
        );
        assert_eq!(
            counter(&after, "voxgate_replies_cut_total", Door::Xiaozhi),
            1.0
        );
        assert_eq!(
            counter(&after, "voxgate_false_interruptions_total", Door::Xiaozhi),
            0.0
        );

        // The timeline shows the reply cut, with its barge-in.
        let entry = admin_entry(server.addr, Door::Xiaozhi, |s| {
            s["turns"].as_u64() >= Some(1)
        })
        .await;
        let (status, detail) = admin_session(server.addr, entry["id"].as_str().unwrap()).await;
        assert_eq!(status, 200);
        let cut: Vec<&Value> = detail["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["outcome"] == "cut")
            .collect();
        assert_eq!(cut.len(), 1, "{detail:#}");
        assert_eq!(cut[0]["interrupted"], true, "{detail:#}");
        assert!(
            (300..3000).contains(&ms(&cut[0]["barge_in_ms"])),
            "{detail:#}"
        );
        let sink = talker.await.unwrap();
        drop(sink.reunite(stream).unwrap());
        server.stop().await;
    })
    .await;
}

// ---- realtime ---------------------------------------------------------------------------------

/// Sends `text` and reads the model's text until it contains `until`, then to the response's
/// end; the client must never be asked to run a tool.
async fn realtime_turn(ws: &mut Ws, text: &str, until: &str) -> String {
    rt_send(
        ws,
        &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, text),
    )
    .await;
    let mut said = String::new();
    loop {
        match rt_recv(ws).await {
            Down::ModelTextFragment(f) => said.push_str(&f.text),
            Down::ResponseEnd(_) if said.contains(until) => return said,
            Down::ToolCallRequest(r) => panic!("the client was asked to run {}", r.name),
            Down::Error(e) => panic!("error {e:?}"),
            _ => {}
        }
    }
}

/// The realtime door's `vad_stop_ms` default.
const REALTIME_VAD_STOP: Duration = Duration::from_millis(390);

/// 16 kHz mono 16-bit little-endian PCM of `question.wav` and `silence_ms` of silence, in
/// 100 ms packets.
fn pcm_packets(silence_ms: usize) -> Vec<Vec<i16>> {
    let mut pcm = question();
    pcm.extend(std::iter::repeat_n(0, silence_ms * 16));
    pcm.chunks(1_600).map(<[i16]>::to_vec).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoken_realtime_turn_moves_every_stage_under_its_door() {
    bounded(async {
        let fakes = fakes().await;
        let server = Running::start(with_fakes(&fakes)).await;
        let mut ws = connect(server.addr, "/realtime").await;
        // Speech in, spoken replies from the server's own (hosted) synthesizer: the fake.
        let mut config = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_24K);
        config.tts = Some(TtsSettings::Hosted(HostedTtsSettings {
            voice: HostedVoice::Ref {
                voice_id: "default".into(),
            },
            mode: HostedTtsMode::LowLatency,
        }));
        rt_send(&mut ws, &ServiceBoundMessage::initialize(&config).unwrap()).await;
        assert!(matches!(rt_recv(&mut ws).await, Down::SessionReady(_)));
        let (mut sink, mut stream) = ws.split();
        // The user speaks at real time, from a task of its own, while the reply is read.
        let talker = tokio::spawn(async move {
            for (id, packet) in (1..).zip(pcm_packets(800)) {
                let bytes: Vec<u8> = packet.iter().flat_map(|s| s.to_le_bytes()).collect();
                let m = ServiceBoundMessage::user_audio(
                    id,
                    InferenceTriggerMode::Immediate,
                    bytes.into(),
                );
                sink.send(Message::Binary(m.to_frame())).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            sink
        });
        let mut heard = false;
        let mut audio = 0;
        loop {
            match rt_recv(&mut stream).await {
                Down::UserTranscriptionResult(t) => {
                    assert_eq!(t.text, TRANSCRIPT);
                    heard = true;
                }
                Down::ModelAudioChunk(_) => audio += 1,
                Down::ResponseEnd(_) if heard => break,
                Down::Error(e) => panic!("error {e:?}"),
                _ => {}
            }
        }
        assert!(audio > 0, "a spoken reply");
        let sink = talker.await.unwrap();
        let after = scrape_until(&server, "the spoken turn's figures", |s| {
            door_hist(s, FIRST_AUDIO, Door::Realtime).count >= 1.0
                && door_hist(s, SERVER_ADDED, Door::Realtime).count >= 1.0
        })
        .await;
        let endpointing = door_hist(&after, ENDPOINTING, Door::Realtime);
        assert_eq!(endpointing.count, 1.0, "{endpointing:?}");
        assert!(
            (secs(REALTIME_VAD_STOP)..2.0).contains(&endpointing.sum),
            "{endpointing:?}"
        );
        assert_waited(provider(&after, Door::Realtime, "asr"), 1.0, ASR, "asr");
        assert_waited(provider(&after, Door::Realtime, "llm"), 1.0, LLM, "llm");
        assert_waited(provider(&after, Door::Realtime, "tts"), 1.0, TTS, "tts");
        assert_waited(
            door_hist(&after, FIRST_AUDIO, Door::Realtime),
            1.0,
            REALTIME_VAD_STOP + ASR + LLM + TTS,
            "first audio",
        );
        let added = door_hist(&after, SERVER_ADDED, Door::Realtime);
        assert_eq!(added.count, 1.0, "{added:?}");
        assert!(added.sum < 1.0, "{added:?}");
        drop(sink.reunite(stream).unwrap());
        server.stop().await;
    })
    .await;
}

/// How long the test's client takes to answer a tool call.
const CLIENT_TOOL: Duration = Duration::from_millis(300);

#[tokio::test]
async fn a_client_tool_round_trip_on_the_realtime_door_is_timed() {
    bounded(async {
        let server = Running::start(Config::default()).await;
        let mut ws = realtime(server.addr).await;
        let tool = ToolDefinition::from_json(
            "get_weather",
            Some("The weather in a city".into()),
            &json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        )
        .unwrap();
        rt_send(&mut ws, &ServiceBoundMessage::update_tools(vec![tool])).await;
        rt_send(
            &mut ws,
            &ServiceBoundMessage::user_text(
                1,
                InferenceTriggerMode::Queue,
                r#"call get_weather {"city": "Paris"}"#,
            ),
        )
        .await;
        let call = loop {
            if let Down::ToolCallRequest(r) = rt_recv(&mut ws).await {
                break r;
            }
        };
        // The client takes its time.
        tokio::time::sleep(CLIENT_TOOL).await;
        rt_send(
            &mut ws,
            &ServiceBoundMessage::tool_call_response(call.id.clone(), "sunny, 21 C"),
        )
        .await;
        let mut continued = String::new();
        while !continued.contains("sunny, 21 C") {
            if let Down::ModelTextFragment(f) = rt_recv(&mut ws).await {
                continued.push_str(&f.text);
            }
        }
        let after = scrape_until(&server, "the tool call", |s| {
            tool_calls(s, Door::Realtime, "client").count >= 1.0
        })
        .await;
        assert_waited(
            tool_calls(&after, Door::Realtime, "client"),
            1.0,
            CLIENT_TOOL,
            "client tool",
        );
        let ok = [("door", "realtime"), ("kind", "client"), ("outcome", "ok")];
        assert_eq!(scalar(&after, "voxgate_tool_calls_total", &ok), 1.0);
        assert_eq!(tool_calls(&after, Door::Realtime, "mcp").count, 0.0);
        // The demo agent answered twice (the call, then the continuation): model latency.
        assert!(provider(&after, Door::Realtime, "llm").count >= 2.0);
        // The turn's timeline names the call.
        let entry = admin_entry(server.addr, Door::Realtime, |s| {
            s["turns"].as_u64() >= Some(1)
        })
        .await;
        let (_, detail) = admin_session(server.addr, entry["id"].as_str().unwrap()).await;
        let tools: Vec<&Value> = detail["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t["tools"].as_array().unwrap())
            .collect();
        assert_eq!(tools.len(), 1, "{detail:#}");
        assert_eq!(tools[0]["name"], "get_weather");
        assert_eq!(tools[0]["kind"], "client");
        assert_eq!(tools[0]["outcome"], "ok");
        assert!(ms(&tools[0]["ms"]) >= 300, "{detail:#}");
        server.stop().await;
    })
    .await;
}

/// How long the scripted MCP server takes to answer a call.
const MCP_TOOL: Duration = Duration::from_millis(200);
const CALL: &str = r#"call text_echo {"text":"ping pong"}"#;

/// A server with one MCP server offering `text.echo` connected to `/mcp`, answering `n`
/// calls after [`MCP_TOOL`] each (then its socket stays open, answering nothing).
async fn with_slow_echo_server(n: usize) -> (Running, tokio::task::JoinHandle<(Ws, Vec<Value>)>) {
    let server = Running::start(Config::default()).await;
    let mut ws = mcp_server(
        server.addr,
        "/mcp?token=t",
        "tools",
        &[vec![tool("text.echo", "Echo text back")]],
    )
    .await;
    wait_tools(server.addr, |names| names == ["text_echo"]).await;
    let calls = tokio::spawn(async move {
        let seen = serve_calls_after(&mut ws, n, MCP_TOOL).await;
        (ws, seen)
    });
    (server, calls)
}

#[tokio::test]
async fn an_mcp_tool_call_on_the_realtime_door_is_timed() {
    bounded(async {
        let (server, calls) = with_slow_echo_server(1).await;
        let mut ws = realtime(server.addr).await;
        let said = realtime_turn(&mut ws, CALL, "returned").await;
        assert!(said.contains("echo: ping pong"), "{said}");
        assert_eq!(calls.await.unwrap().1.len(), 1);
        let after = scrape_until(&server, "the MCP call", |s| {
            tool_calls(s, Door::Realtime, "mcp").count >= 1.0
        })
        .await;
        assert_waited(
            tool_calls(&after, Door::Realtime, "mcp"),
            1.0,
            MCP_TOOL,
            "mcp tool",
        );
        let ok = [("door", "realtime"), ("kind", "mcp"), ("outcome", "ok")];
        assert_eq!(scalar(&after, "voxgate_tool_calls_total", &ok), 1.0);
        assert_eq!(tool_calls(&after, Door::Realtime, "client").count, 0.0);
        server.stop().await;
    })
    .await;
}

// ---- Retell -----------------------------------------------------------------------------------

/// Retell asks for response `id` to the user's `text`.
async fn response_required(ws: &mut Ws, id: u64, text: &str) {
    send_json(
        ws,
        &json!({"interaction_type": "response_required", "response_id": id,
            "transcript": [{"role": "user", "content": text}]}),
    )
    .await;
}

/// The frames up to response `id`'s last chunk.
async fn until_complete(ws: &mut Ws, id: u64) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let f = recv_json(ws).await;
        let done = f["response_type"] == "response"
            && f["response_id"] == id
            && f["content_complete"] == true;
        frames.push(f);
        if done {
            return frames;
        }
    }
}

#[tokio::test]
async fn retell_responses_move_provider_latency_and_a_superseded_one_is_an_interruption() {
    bounded(async {
        let fakes = fakes().await;
        let server = Running::start(with_fakes(&fakes)).await;
        let mut ws = connect(server.addr, "/llm-websocket/call_obs").await;
        response_required(&mut ws, 1, "hello").await;
        until_complete(&mut ws, 1).await;
        let after = scrape_until(&server, "response 1", |s| {
            provider(s, Door::Retell, "llm").count >= 1.0
        })
        .await;
        assert_waited(provider(&after, Door::Retell, "llm"), 1.0, LLM, "llm");
        assert_eq!(
            counter(&after, "voxgate_interruptions_total", Door::Retell),
            0.0
        );

        // Response 2 is superseded by 3 before its first token: Retell interrupted it.
        response_required(&mut ws, 2, "tell me more").await;
        response_required(&mut ws, 3, "no, something else").await;
        let frames = until_complete(&mut ws, 3).await;
        assert!(
            !frames
                .iter()
                .any(|f| f["response_id"] == 2 && f["content_complete"] == true),
            "{frames:#?}"
        );
        let after = scrape_until(&server, "response 3", |s| {
            provider(s, Door::Retell, "llm").count >= 2.0
        })
        .await;
        assert_waited(provider(&after, Door::Retell, "llm"), 2.0, LLM, "llm");
        assert_eq!(
            counter(&after, "voxgate_interruptions_total", Door::Retell),
            1.0
        );
        assert_eq!(
            counter(&after, "voxgate_replies_cut_total", Door::Retell),
            1.0
        );
        assert_eq!(counter(&after, "voxgate_turns_total", Door::Retell), 2.0);
        // No speech reaches this door: no spoken-turn stages.
        assert_eq!(door_hist(&after, ENDPOINTING, Door::Retell).count, 0.0);

        // The call in the admin list, by its call id; its timeline in order.
        let entry = admin_entry(server.addr, Door::Retell, |s| {
            s["turns"].as_u64() == Some(3)
        })
        .await;
        assert_eq!(entry["device"], "call_obs", "{entry:#}");
        let (_, detail) = admin_session(server.addr, entry["id"].as_str().unwrap()).await;
        let outcomes: Vec<&str> = detail["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["outcome"].as_str().unwrap())
            .collect();
        assert_eq!(outcomes, ["completed", "cut", "completed"], "{detail:#}");
        assert!(ms(&detail["timeline"][0]["llm_first_token_ms"]) >= 150);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn mcp_tool_calls_on_the_retell_door_are_timed_and_a_superseded_one_is_cancelled() {
    bounded(async {
        let (server, calls) = with_slow_echo_server(1).await;
        let mut ws = connect(server.addr, "/llm-websocket/call_mcp").await;
        response_required(&mut ws, 1, CALL).await;
        let frames = until_complete(&mut ws, 1).await;
        assert!(
            frames
                .iter()
                .any(|f| f["response_type"] == "tool_call_result"),
            "{frames:#?}"
        );
        let (mcp, seen) = calls.await.unwrap();
        assert_eq!(seen.len(), 1);
        let after = scrape_until(&server, "the MCP call", |s| {
            tool_calls(s, Door::Retell, "mcp").count >= 1.0
        })
        .await;
        assert_waited(
            tool_calls(&after, Door::Retell, "mcp"),
            1.0,
            MCP_TOOL,
            "mcp tool",
        );
        let ok = [("door", "retell"), ("kind", "mcp"), ("outcome", "ok")];
        assert_eq!(scalar(&after, "voxgate_tool_calls_total", &ok), 1.0);

        // A call the MCP server leaves unanswered, its response superseded: cancelled.
        response_required(&mut ws, 2, CALL).await;
        loop {
            let f = recv_json(&mut ws).await;
            if f["response_type"] == "tool_call_invocation" {
                break;
            }
        }
        response_required(&mut ws, 3, "never mind").await;
        until_complete(&mut ws, 3).await;
        let cancelled = [
            ("door", "retell"),
            ("kind", "mcp"),
            ("outcome", "cancelled"),
        ];
        let after = scrape_until(&server, "the cancelled call", |s| {
            scalar(s, "voxgate_tool_calls_total", &cancelled) >= 1.0
        })
        .await;
        assert_eq!(scalar(&after, "voxgate_tool_calls_total", &cancelled), 1.0);
        assert_eq!(tool_calls(&after, Door::Retell, "mcp").count, 2.0);
        assert_eq!(
            counter(&after, "voxgate_interruptions_total", Door::Retell),
            1.0
        );
        drop(mcp);
        server.stop().await;
    })
    .await;
}

// ---- Gemini -----------------------------------------------------------------------------------

/// The Gemini door's messages up to `TURN_COMPLETE`: how many carried reply audio, and
/// whether one carried the user's transcription.
async fn gemini_turn<S>(ws: &mut S) -> (usize, bool)
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let mut audio = 0;
    let mut heard = false;
    loop {
        let Some(Message::Text(t)) = next_message(ws, WAIT).await else {
            panic!("the Gemini socket closed");
        };
        let m: Value = serde_json::from_str(&t).unwrap();
        assert_ne!(m["type"], "GEMINI_ERROR", "{m}");
        let content = &m["payload"]["serverContent"];
        heard |= content["inputTranscription"]["text"] == TRANSCRIPT;
        audio += content["modelTurn"]["parts"].as_array().map_or(0, |p| {
            p.iter().filter(|p| p.get("inlineData").is_some()).count()
        });
        if m["type"] == "TURN_COMPLETE" {
            return (audio, heard);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_typed_and_spoken_turns_move_the_histograms_under_its_door() {
    bounded(async {
        let fakes = fakes().await;
        let server = Running::start(with_fakes(&fakes)).await;
        let mut ws = connect(server.addr, "/gemini").await;
        send_json(
            &mut ws,
            &json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": {
                "model": "models/gemini-2.0-flash-live-001",
                "generationConfig": {"responseModalities": ["AUDIO"]}}}}),
        )
        .await;
        assert_eq!(recv_json(&mut ws).await["type"], "GEMINI_CONNECTED");
        assert_eq!(recv_json(&mut ws).await["type"], "SETUP_COMPLETE");

        // A typed turn: model and synthesizer latency, no spoken-turn stages.
        send_json(
            &mut ws,
            &json!({"type": "SEND_MESSAGE", "payload": {
                "parts": [{"text": "hello there"}], "turnComplete": true}}),
        )
        .await;
        let (audio, _) = gemini_turn(&mut ws).await;
        assert!(audio > 0, "a spoken reply");
        let after = scrape_until(&server, "the typed turn", |s| {
            provider(s, Door::Gemini, "tts").count >= 1.0
        })
        .await;
        assert_waited(provider(&after, Door::Gemini, "llm"), 1.0, LLM, "llm");
        assert_waited(provider(&after, Door::Gemini, "tts"), 1.0, TTS, "tts");
        assert_eq!(provider(&after, Door::Xiaozhi, "llm").count, 0.0);
        assert_eq!(counter(&after, "voxgate_turns_total", Door::Gemini), 1.0);
        for metric in [ENDPOINTING, FIRST_AUDIO, SERVER_ADDED] {
            assert_eq!(
                door_hist(&after, metric, Door::Gemini).count,
                0.0,
                "{metric}"
            );
        }

        // A spoken turn: 16 kHz PCM at real time, as the app streams its microphone.
        let (mut sink, mut stream) = ws.split();
        let talker = tokio::spawn(async move {
            for packet in pcm_packets(800) {
                let mut data = String::new();
                voxgate_gemini::audio::encode_pcm_base64(&packet, &mut data);
                let m = json!({"type": "SEND_REALTIME_INPUT", "payload": {"audio": {
                    "mimeType": "audio/pcm;rate=16000", "data": data}}});
                sink.send(Message::Text(m.to_string().into()))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            sink
        });
        let (audio, heard) = gemini_turn(&mut stream).await;
        assert!(heard && audio > 0, "transcribed and answered");
        let sink = talker.await.unwrap();
        let after = scrape_until(&server, "the spoken turn", |s| {
            door_hist(s, FIRST_AUDIO, Door::Gemini).count >= 1.0
                && door_hist(s, SERVER_ADDED, Door::Gemini).count >= 1.0
        })
        .await;
        let endpointing = door_hist(&after, ENDPOINTING, Door::Gemini);
        assert_eq!(endpointing.count, 1.0, "{endpointing:?}");
        assert!(
            (secs(VAD_STOP)..1.5).contains(&endpointing.sum),
            "{endpointing:?}"
        );
        assert_waited(provider(&after, Door::Gemini, "asr"), 1.0, ASR, "asr");
        assert_waited(provider(&after, Door::Gemini, "llm"), 2.0, LLM, "llm");
        assert_waited(provider(&after, Door::Gemini, "tts"), 2.0, TTS, "tts");
        assert_waited(
            door_hist(&after, FIRST_AUDIO, Door::Gemini),
            1.0,
            VAD_STOP + ASR + LLM + TTS,
            "first audio",
        );
        let added = door_hist(&after, SERVER_ADDED, Door::Gemini);
        assert_eq!(added.count, 1.0, "{added:?}");
        assert!(added.sum < 1.0, "{added:?}");
        drop(sink.reunite(stream).unwrap());
        server.stop().await;
    })
    .await;
}
