//! The gRPC service at the wire: every client message kind through tonic's generated client
//! gets the same server messages as over WebSocket, and the ways a session ends become the
//! documented statuses (init timeout, unusable initialization, messages over the limits,
//! shutdown).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use voxgate_realtime::proto::{InferenceTriggerMode, SampleFormat, ToolDefinition};
use voxgate_realtime::{
    AudioFormat, ClientBoundKind, ClientBoundMessage, ServiceBoundKind, ServiceBoundMessage,
    SessionConfig, SessionUpdate,
};
use voxgate_realtime_client::grpc::RealtimeServiceClient;
use voxgate_server::Config;

use common::{WAIT, start};

/// One raw session, over either transport.
#[allow(clippy::large_enum_variant, reason = "one per test")]
enum Raw {
    Grpc {
        tx: mpsc::Sender<ServiceBoundMessage>,
        rx: tonic::Streaming<ClientBoundMessage>,
    },
    Ws(
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
    ),
}

impl Raw {
    async fn grpc(addr: SocketAddr) -> Self {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = RealtimeServiceClient::new(channel);
        let (tx, rx) = mpsc::channel(64);
        let requests =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let rx = client.session(requests).await.unwrap().into_inner();
        Self::Grpc { tx, rx }
    }

    async fn ws(addr: SocketAddr) -> Self {
        let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/realtime"))
            .await
            .unwrap();
        Self::Ws(ws)
    }

    async fn send(&mut self, m: ServiceBoundMessage) {
        match self {
            Self::Grpc { tx, .. } => tx.send(m).await.unwrap(),
            Self::Ws(ws) => ws.send(Message::Binary(m.to_frame())).await.unwrap(),
        }
    }

    /// The next message; `Err` with the status (gRPC) or close code (WebSocket) at the end.
    async fn recv(&mut self) -> Result<ClientBoundMessage, String> {
        let next = async {
            match self {
                Self::Grpc { rx, .. } => match rx.message().await {
                    Ok(Some(m)) => Ok(m),
                    Ok(None) => Err("Ok".to_owned()),
                    Err(s) => Err(format!("{:?}", s.code())),
                },
                Self::Ws(ws) => loop {
                    match ws.next().await {
                        Some(Ok(Message::Binary(b))) => {
                            return Ok(ClientBoundMessage::decode_frame(b).unwrap());
                        }
                        Some(Ok(Message::Close(f))) => {
                            return Err(f.map_or(1005, |f| u16::from(f.code)).to_string());
                        }
                        None | Some(Err(_)) => return Err("gone".to_owned()),
                        Some(Ok(_)) => {}
                    }
                },
            }
        };
        tokio::time::timeout(WAIT, next)
            .await
            .expect("a message in time")
    }

    /// Receives until a message of `kind` (inclusive), returning every kind seen.
    async fn until(&mut self, kind: ClientBoundKind) -> Vec<ClientBoundKind> {
        let mut seen = Vec::new();
        loop {
            let m = self.recv().await.unwrap();
            let k = m.kind().unwrap();
            seen.push(k);
            if k == kind {
                return seen;
            }
        }
    }
}

fn tool() -> ToolDefinition {
    ToolDefinition::from_json(
        "get_weather",
        None,
        &serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    )
    .unwrap()
}

/// Every client message kind once, each followed by what it must bring back (a `Ping` when
/// it brings nothing, so the next step starts after the server has handled it); the kinds
/// received, step by step.
async fn script(raw: &mut Raw) -> (Vec<ServiceBoundKind>, Vec<ClientBoundKind>) {
    use ClientBoundKind as K;
    let config = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    let steps: Vec<(ServiceBoundMessage, Option<K>)> = vec![
        (
            ServiceBoundMessage::initialize(&config).unwrap(),
            Some(K::SessionReady),
        ),
        (ServiceBoundMessage::update_tools(vec![tool()]), None),
        (
            ServiceBoundMessage::reconfigure(&SessionUpdate {
                input: Some(AudioFormat::new(16_000, 1, SampleFormat::Signed16Bit).unwrap()),
                inference: None,
            }),
            None,
        ),
        (
            ServiceBoundMessage::user_text(1, InferenceTriggerMode::Immediate, "hello there"),
            Some(K::ResponseEnd),
        ),
        (
            ServiceBoundMessage::user_audio(
                2,
                InferenceTriggerMode::NoTrigger,
                Bytes::from(vec![0u8; 3200]),
            ),
            None,
        ),
        (ServiceBoundMessage::playback_report(0, None), None),
        (
            ServiceBoundMessage::trigger_inference(Some("Greet the user.".into()), false),
            Some(K::ResponseEnd),
        ),
        (
            ServiceBoundMessage::direct_speech("Hello from the client.", true, false),
            Some(K::ResponseEnd),
        ),
        (
            ServiceBoundMessage::conversation_query(Some("Summarize.".into()), None).unwrap(),
            Some(K::ConversationQueryResult),
        ),
        (
            ServiceBoundMessage::user_text(
                3,
                InferenceTriggerMode::Immediate,
                r#"call get_weather {"city": "Paris"}"#,
            ),
            Some(K::ToolCallRequest),
        ),
        (
            ServiceBoundMessage::tool_call_response("unknown-id", "x"),
            Some(K::Error),
        ),
        (
            // Not awaiting pending work: the tool call above stays unanswered.
            ServiceBoundMessage::export_chat_history(false, true),
            Some(K::ChatHistory),
        ),
        (ServiceBoundMessage::ping(), Some(K::Pong)),
    ];
    let mut sent = Vec::new();
    let mut seen = Vec::new();
    for (message, answer) in steps {
        sent.push(message.kind().unwrap());
        raw.send(message).await;
        let until = match answer {
            Some(k) => k,
            None => {
                raw.send(ServiceBoundMessage::ping()).await;
                K::Pong
            }
        };
        seen.extend(raw.until(until).await);
    }
    (sent, seen)
}

#[tokio::test]
async fn every_client_message_gets_the_same_answers_over_grpc_and_websocket() {
    let (addr, _stop) = start(Config::default()).await;
    let (sent, over_ws) = script(&mut Raw::ws(addr).await).await;
    let (_, over_grpc) = script(&mut Raw::grpc(addr).await).await;
    // Every kind the protocol has was sent.
    let mut kinds: Vec<&str> = sent.iter().map(|k| k.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    assert_eq!(kinds.len(), 11, "{kinds:?}");
    // A reply's final snapshot follows its end by a timer, so where it falls among the next
    // step's messages varies; everything else is in the same order.
    let snapshots = |v: &[ClientBoundKind]| {
        v.iter()
            .filter(|k| **k == ClientBoundKind::TurnSnapshot)
            .count()
    };
    let rest = |v: &[ClientBoundKind]| {
        v.iter()
            .copied()
            .filter(|k| *k != ClientBoundKind::TurnSnapshot)
            .collect::<Vec<_>>()
    };
    assert_eq!(rest(&over_grpc), rest(&over_ws));
    assert_eq!(snapshots(&over_grpc), snapshots(&over_ws));
    for k in [
        ClientBoundKind::SessionReady,
        ClientBoundKind::ResponseBegin,
        ClientBoundKind::ModelTextFragment,
        ClientBoundKind::ResponseEnd,
        ClientBoundKind::ConversationQueryResult,
        ClientBoundKind::ToolCallRequest,
        ClientBoundKind::Error,
        ClientBoundKind::ChatHistory,
        ClientBoundKind::Pong,
    ] {
        assert!(over_grpc.contains(&k), "{k:?} in {over_grpc:?}");
    }
}

#[tokio::test]
async fn a_session_not_initialized_in_time_fails_its_precondition() {
    let mut config = Config::default();
    config.limits.init_timeout_secs = 1;
    let (addr, _stop) = start(config).await;
    let mut raw = Raw::grpc(addr).await;
    let error = raw.recv().await.unwrap();
    assert_eq!(error.kind(), Some(ClientBoundKind::Error));
    assert_eq!(raw.recv().await.unwrap_err(), "FailedPrecondition");
}

#[tokio::test]
async fn an_unusable_initialization_fails_its_precondition() {
    let (addr, _stop) = start(Config::default()).await;
    let mut raw = Raw::grpc(addr).await;
    let mut init = ServiceBoundMessage::initialize(&SessionConfig::new(
        AudioFormat::SPEECH_16K,
        AudioFormat::SPEECH_16K,
    ))
    .unwrap();
    if let Some(
        voxgate_realtime::proto::service_bound_message::Payload::InitializeSessionRequest(r),
    ) = &mut init.payload
    {
        r.input_audio_line.as_mut().unwrap().sample_rate = 0;
    }
    raw.send(init).await;
    assert_eq!(
        raw.recv().await.unwrap().kind(),
        Some(ClientBoundKind::Error)
    );
    assert_eq!(raw.recv().await.unwrap_err(), "FailedPrecondition");
}

#[tokio::test]
async fn messages_over_the_limits_are_answered_then_refused() {
    let config = Config {
        max_frame_bytes: 4096,
        ..Config::default()
    };
    let (addr, _stop) = start(config).await;
    let mut raw = Raw::grpc(addr).await;
    let init = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K);
    raw.send(ServiceBoundMessage::initialize(&init).unwrap())
        .await;
    raw.until(ClientBoundKind::SessionReady).await;
    // Over the configured limit: the protocol's error, the session goes on.
    let big = ServiceBoundMessage::user_audio(
        1,
        InferenceTriggerMode::NoTrigger,
        Bytes::from(vec![0u8; 6000]),
    );
    raw.send(big).await;
    assert_eq!(
        raw.recv().await.unwrap().kind(),
        Some(ClientBoundKind::Error)
    );
    raw.send(ServiceBoundMessage::ping()).await;
    raw.until(ClientBoundKind::Pong).await;
    // Over four times the limit: the transport refuses it and the call ends.
    let huge = ServiceBoundMessage::user_audio(
        2,
        InferenceTriggerMode::NoTrigger,
        Bytes::from(vec![0u8; 20_000]),
    );
    raw.send(huge).await;
    assert_eq!(raw.recv().await.unwrap_err(), "ResourceExhausted");
}

#[tokio::test]
async fn a_shutdown_ends_open_calls_as_unavailable() {
    let (addr, stop) = start(Config::default()).await;
    let mut raw = Raw::grpc(addr).await;
    let init = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    raw.send(ServiceBoundMessage::initialize(&init).unwrap())
        .await;
    raw.until(ClientBoundKind::SessionReady).await;
    stop.send(()).unwrap();
    let end = loop {
        match raw.recv().await {
            Ok(_) => {}
            Err(status) => break status,
        }
    };
    assert_eq!(end, "Unavailable");
}

#[tokio::test]
async fn closing_the_request_stream_ends_the_call_with_ok() {
    let (addr, _stop) = start(Config::default()).await;
    let mut raw = Raw::grpc(addr).await;
    let init = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    raw.send(ServiceBoundMessage::initialize(&init).unwrap())
        .await;
    raw.until(ClientBoundKind::SessionReady).await;
    let Raw::Grpc { tx, mut rx } = raw else {
        unreachable!()
    };
    drop(tx);
    let end = tokio::time::timeout(WAIT, rx.message()).await.unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");
}
