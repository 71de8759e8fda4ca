//! The client against a real voxgate server on 127.0.0.1, over both transports: a text turn,
//! a tool round trip, a spoken turn, queries, history, errors, keys, admission and
//! reconnection through a proxy that cuts the connection.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use voxgate_realtime::proto::{InferenceTriggerMode, SessionErrorCategory, ToolDefinition};
use voxgate_realtime::{
    AudioFormat, HostedTtsSettings, HostedVoice, Open, ServiceBoundMessage, TtsSettings,
};
use voxgate_realtime_client::{
    ClientError, ClientOptions, Endpoint, Event, RealtimeClient, Reconnect, SessionConfig,
};
use voxgate_server::{Config, Server};

use common::{WAIT, start};

fn endpoints(addr: SocketAddr) -> [Endpoint; 2] {
    [
        Endpoint::websocket(format!("ws://{addr}/realtime")),
        Endpoint::grpc(format!("http://{addr}")),
    ]
}

fn text_only() -> SessionConfig {
    SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K)
}

fn weather_tool() -> ToolDefinition {
    ToolDefinition::from_json(
        "get_weather",
        Some("The weather in a city".into()),
        &serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    )
    .unwrap()
}

async fn next(client: &mut RealtimeClient) -> Event {
    tokio::time::timeout(WAIT, client.next_event())
        .await
        .expect("an event in time")
        .expect("the session is open")
}

/// Asks the demo agent to call `get_weather` for `city`; the call as the client sees it.
async fn weather_call(
    client: &mut RealtimeClient,
    city: &str,
) -> voxgate_realtime_client::ToolCall {
    client
        .send_text(
            format!(r#"call get_weather {{"city": "{city}"}}"#),
            InferenceTriggerMode::Immediate,
        )
        .await
        .unwrap();
    loop {
        if let Event::ToolCall(call) = next(client).await {
            return call;
        }
    }
}

/// The events of one reply, up to its `ResponseEnd`, and its text.
async fn reply(client: &mut RealtimeClient) -> (Vec<Event>, String) {
    let mut events = Vec::new();
    let mut text = String::new();
    loop {
        let event = next(client).await;
        if let Event::TextFragment { text: t, .. } = &event {
            text.push_str(t);
        }
        let end = matches!(event, Event::ResponseEnd { .. });
        events.push(event);
        if end {
            return (events, text);
        }
    }
}

#[tokio::test]
async fn a_full_session_over_each_transport() {
    let (addr, _stop) = start(Config::default()).await;
    for endpoint in endpoints(addr) {
        let what = format!("{:?}", endpoint.transport());
        let mut client = RealtimeClient::connect_with_tools(
            ClientOptions::new(endpoint),
            text_only(),
            vec![weather_tool()],
        )
        .await
        .unwrap();

        // A text turn.
        client
            .send_text("hello there", InferenceTriggerMode::Immediate)
            .await
            .unwrap();
        let (events, text) = reply(&mut client).await;
        assert_eq!(text, "You said: hello there", "{what}");
        assert!(
            matches!(events[0], Event::ResponseBegin { .. }),
            "{what}: {events:?}"
        );

        // A ping, a query and the history.
        assert!(client.ping().await.unwrap() < WAIT);
        let answer = client
            .query(Some("What did the user say?".into()), None)
            .await
            .unwrap();
        assert!(!answer.is_empty(), "{what}");
        let history = client.export_history(true, true).await.unwrap();
        assert!(history.len() >= 2, "{what}: {history:?}");

        // A tool round trip: the call arrives as an event, the result continues the reply.
        let call = weather_call(&mut client, "Paris").await;
        assert_eq!(call.name, "get_weather", "{what}");
        assert_eq!(call.arguments["city"], "Paris", "{what}");
        client.tool_result(&call.id, "sunny, 21 C").await.unwrap();
        let mut continued = String::new();
        while !continued.contains("sunny, 21 C") {
            if let Event::TextFragment { text, .. } = next(&mut client).await {
                continued.push_str(&text);
            }
        }

        // A query with neither prompt nor instructions never leaves the client.
        assert!(matches!(
            client.query(None, None).await,
            Err(ClientError::Usage(_))
        ));

        // A bad message is the server's error event; the session goes on.
        client
            .send(ServiceBoundMessage::initialize(&text_only()).unwrap())
            .await
            .unwrap();
        let error = loop {
            if let Event::Error(e) = next(&mut client).await {
                break e;
            }
        };
        assert_eq!(
            error.category,
            Open::Known(SessionErrorCategory::ErrorSession),
            "{what}: {error}"
        );
        assert!(client.ping().await.is_ok(), "{what}");
        client.close().await;
    }
}

#[tokio::test]
async fn a_spoken_turn_over_each_transport() {
    let (addr, _stop) = start(Config::default()).await;
    for endpoint in endpoints(addr) {
        let what = format!("{:?}", endpoint.transport());
        let mut config = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K);
        config.tts = Some(TtsSettings::Hosted(HostedTtsSettings {
            voice: HostedVoice::Ref {
                voice_id: "default".into(),
            },
            mode: voxgate_realtime::proto::HostedTtsMode::LowLatency,
        }));
        let mut client = RealtimeClient::connect(ClientOptions::new(endpoint), config)
            .await
            .unwrap();
        // One second of a 440 Hz tone (speech to the VAD), then silence, in 20 ms packets.
        let mut pcm = Vec::new();
        for i in 0..16_000u32 {
            let t = f64::from(i) / 16_000.0;
            let s = (t * 440.0 * std::f64::consts::TAU).sin() * 12_000.0;
            #[allow(clippy::cast_possible_truncation, reason = "within i16")]
            pcm.extend_from_slice(&(s as i16).to_le_bytes());
        }
        pcm.extend(std::iter::repeat_n(0u8, 2 * 16_000));
        for chunk in pcm.chunks(640) {
            client
                .send_audio(
                    Bytes::copy_from_slice(chunk),
                    InferenceTriggerMode::Immediate,
                )
                .await
                .unwrap();
        }
        client.trigger_inference(None, true).await.unwrap();
        let mut transcript = None;
        let mut audio = 0;
        loop {
            match next(&mut client).await {
                Event::UserTranscription { text, .. } => transcript = Some(text),
                Event::AudioChunk { audio: a, .. } => audio += a.len(),
                Event::ResponseEnd { .. } if audio > 0 => break,
                _ => {}
            }
        }
        assert!(transcript.is_some(), "{what}: no transcript");
        assert!(
            audio > 0 && audio % 2 == 0,
            "{what}: {audio} bytes of s16 audio"
        );
        client.close().await;
    }
}

#[tokio::test]
async fn keys_and_admission_are_the_doors() {
    let mut config = Config::default();
    config.realtime.api_keys = vec!["s3cret".into()];
    config.limits.max_sessions = 1;
    let (addr, _stop) = start(config).await;
    for endpoint in endpoints(addr) {
        let what = format!("{:?}", endpoint.transport());
        let no_key =
            RealtimeClient::connect(ClientOptions::new(endpoint.clone()), text_only()).await;
        assert!(
            matches!(no_key, Err(ClientError::Unauthorized(_))),
            "{what}: {no_key:?}"
        );
        let wrong = RealtimeClient::connect(
            ClientOptions::new(endpoint.clone()).with_api_key("nope"),
            text_only(),
        )
        .await;
        assert!(
            matches!(wrong, Err(ClientError::Unauthorized(_))),
            "{what}: {wrong:?}"
        );
        let client = RealtimeClient::connect(
            ClientOptions::new(endpoint.clone()).with_api_key("s3cret"),
            text_only(),
        )
        .await
        .unwrap();
        let second = RealtimeClient::connect(
            ClientOptions::new(endpoint.clone()).with_api_key("s3cret"),
            text_only(),
        )
        .await;
        assert!(
            matches!(second, Err(ClientError::Refused(_))),
            "{what}: {second:?}"
        );
        client.close().await;
        // The closed session's place is free again (its permit goes when the session ends).
        let mut again = None;
        for _ in 0..50 {
            match RealtimeClient::connect(
                ClientOptions::new(endpoint.clone()).with_api_key("s3cret"),
                text_only(),
            )
            .await
            {
                Ok(c) => {
                    again = Some(c);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        again.expect("a place after the close").close().await;
    }
}

#[tokio::test]
async fn grpc_can_have_its_own_listener() {
    let mut config = Config::default();
    config.realtime.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Server::bind(common::quiet(config)).await.unwrap();
    let main = server.local_addr();
    let own = server
        .listener_addr("realtime-grpc")
        .expect("its own listener");
    assert_ne!(main, own);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let mut client = RealtimeClient::connect(
        ClientOptions::new(Endpoint::grpc(format!("http://{own}"))),
        text_only(),
    )
    .await
    .unwrap();
    client
        .send_text("hi", InferenceTriggerMode::Immediate)
        .await
        .unwrap();
    assert_eq!(reply(&mut client).await.1, "You said: hi");
    client.close().await;
    // The main listener no longer serves it.
    let moved = RealtimeClient::connect(
        ClientOptions::new(Endpoint::grpc(format!("http://{main}"))),
        text_only(),
    )
    .await;
    assert!(moved.is_err(), "{moved:?}");
    let _ = stop.send(());
}

/// A TCP proxy to `server`; `cut` drops every connection open at that moment (no close
/// handshake), later connections pass.
async fn cutting_proxy(server: SocketAddr) -> (SocketAddr, Arc<Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cut = Arc::new(Notify::new());
    let trigger = Arc::clone(&cut);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let mut upstream = tokio::net::TcpStream::connect(server).await.unwrap();
            let cut = Arc::clone(&cut);
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                    () = cut.notified() => {}
                }
            });
        }
    });
    (addr, trigger)
}

#[tokio::test]
async fn a_lost_connection_is_reconnected_with_the_same_tools() {
    let (addr, _stop) = start(Config::default()).await;
    let (proxy, cut) = cutting_proxy(addr).await;
    for endpoint in endpoints(proxy) {
        let what = format!("{:?}", endpoint.transport());
        let options = ClientOptions::new(endpoint).with_reconnect(Reconnect {
            max_attempts: 3,
            initial_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(200),
        });
        let mut client =
            RealtimeClient::connect_with_tools(options, text_only(), vec![weather_tool()])
                .await
                .unwrap();
        client
            .send_text("one", InferenceTriggerMode::Immediate)
            .await
            .unwrap();
        assert_eq!(reply(&mut client).await.1, "You said: one", "{what}");
        cut.notify_waiters();
        let mut reconnecting = false;
        loop {
            match next(&mut client).await {
                Event::Reconnecting { attempt: 1, .. } => reconnecting = true,
                Event::Reconnected { .. } => break,
                Event::Reconnecting { .. } => panic!("{what}: the first attempt should do"),
                // The end of the last reply (its snapshot) may still come first.
                _ => assert!(!reconnecting, "{what}: an event from a lost connection"),
            }
        }
        assert!(reconnecting, "{what}");
        // The new session has the tools again.
        let call = weather_call(&mut client, "Oslo").await;
        assert_eq!(call.arguments["city"], "Oslo", "{what}");
        client.close().await;
    }
}

#[tokio::test]
async fn without_reconnection_a_lost_connection_ends_the_client() {
    let (addr, _stop) = start(Config::default()).await;
    let (proxy, cut) = cutting_proxy(addr).await;
    for endpoint in endpoints(proxy) {
        let what = format!("{:?}", endpoint.transport());
        let options = ClientOptions::new(endpoint).with_reconnect(Reconnect::NEVER);
        let mut client = RealtimeClient::connect(options, text_only()).await.unwrap();
        cut.notify_waiters();
        let end = tokio::time::timeout(WAIT, client.next_event())
            .await
            .unwrap();
        assert!(end.is_none(), "{what}: {end:?}");
        assert!(client.end_reason().is_some(), "{what}");
        assert!(matches!(
            client
                .send_text("late", InferenceTriggerMode::Immediate)
                .await,
            Err(ClientError::Closed(Some(_)))
        ));
    }
}

#[tokio::test]
async fn a_grpc_url_that_is_not_plain_http_is_refused_clearly() {
    let err = RealtimeClient::connect(
        ClientOptions::new(Endpoint::grpc("https://example.invalid")),
        text_only(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("http:// URL"), "{err}");
}
