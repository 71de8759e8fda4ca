//! `ElevenLabsTts` against a fake ElevenLabs streaming endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use common::*;
use serde_json::{Value, json};
use voxgate_providers::{
    ElevenLabsConfig, ElevenLabsTts, ProviderError, TimeoutPhase, Tts, TtsRequest, VoiceSettings,
};

#[derive(Debug, Clone)]
struct Seen {
    voice: String,
    query: HashMap<String, String>,
    key: Option<String>,
    body: Value,
}

async fn server(status: StatusCode, body: Vec<Vec<u8>>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    let router = axum::Router::new().route(
        "/v1/text-to-speech/{voice}/stream",
        post(
            move |Path(voice): Path<String>,
                  Query(query): Query<HashMap<String, String>>,
                  headers: HeaderMap,
                  Json(json): Json<Value>| {
                let seen = Arc::clone(&s2);
                let body = body.clone();
                async move {
                    seen.lock().unwrap().push(Seen {
                        voice,
                        query,
                        key: headers
                            .get("xi-api-key")
                            .map(|v| v.to_str().unwrap().to_owned()),
                        body: json,
                    });
                    (status, chunked_body(body))
                }
            },
        ),
    );
    (serve(router).await, seen)
}

fn tts(base: &str) -> ElevenLabsTts {
    let mut cfg = ElevenLabsConfig::new("xi-secret", "voice123");
    cfg.base_url = Some(base.into());
    cfg.model_id = Some("eleven_flash_v2_5".into());
    cfg.voice_settings = Some(VoiceSettings {
        stability: 0.5,
        similarity_boost: 0.75,
        style: 0.0,
        use_speaker_boost: true,
        speed: 1.0,
    });
    cfg.http = fast_http();
    ElevenLabsTts::new(cfg).unwrap()
}

fn say(text: &str) -> TtsRequest {
    TtsRequest {
        text: text.into(),
        ..TtsRequest::default()
    }
}

#[tokio::test]
async fn streams_pcm_16000_with_key_model_and_settings() {
    let samples: Vec<i16> = (0..3_000i32)
        .map(|i| i16::try_from(i * 11 - 15_000).unwrap())
        .collect();
    let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    let (base, seen) = server(
        StatusCode::OK,
        bytes.chunks(777).map(<[u8]>::to_vec).collect(),
    )
    .await;
    let items = collect(tts(&base).synthesize(say("Hello from ElevenLabs."))).await;
    let mut got = Vec::new();
    for c in items {
        let c = c.unwrap();
        assert_eq!(c.sample_rate, 16_000);
        got.extend(c.samples);
    }
    assert_eq!(got, samples);
    let s = seen.lock().unwrap()[0].clone();
    assert_eq!(s.voice, "voice123");
    assert_eq!(s.query["output_format"], "pcm_16000");
    assert_eq!(s.key.as_deref(), Some("xi-secret"));
    assert_eq!(
        s.body,
        json!({
            "text": "Hello from ElevenLabs.",
            "model_id": "eleven_flash_v2_5",
            "voice_settings": {"stability": 0.5, "similarity_boost": 0.75, "style": 0.0,
                               "use_speaker_boost": true, "speed": 1.0}
        })
    );
}

#[tokio::test]
async fn a_request_voice_overrides_the_configured_one() {
    let (base, seen) = server(StatusCode::OK, vec![vec![0, 0]]).await;
    let req = TtsRequest {
        voice: Some("other_voice".into()),
        ..say("x")
    };
    collect(tts(&base).synthesize(req)).await;
    assert_eq!(seen.lock().unwrap()[0].voice, "other_voice");
    let bad = TtsRequest {
        voice: Some("../admin".into()),
        ..say("x")
    };
    let items = collect(tts(&base).synthesize(bad)).await;
    assert!(matches!(items[..], [Err(ProviderError::Config(_))]));
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "no request for a bad voice id"
    );
}

#[tokio::test]
async fn an_invalid_key_is_an_auth_error_with_the_detail_message() {
    let detail = json!({"detail": {"status": "invalid_api_key", "message": "Invalid API key"}});
    let (base, _) = server(
        StatusCode::UNAUTHORIZED,
        vec![detail.to_string().into_bytes()],
    )
    .await;
    let items = collect(tts(&base).synthesize(say("x"))).await;
    assert_eq!(
        items,
        vec![Err(ProviderError::Auth {
            status: 401,
            message: "Invalid API key".into()
        })]
    );
}

#[tokio::test]
async fn a_stalled_or_cut_stream_is_an_error_not_a_hang() {
    let router = axum::Router::new().route(
        "/v1/text-to-speech/{voice}/stream",
        post(|| async { stalled_body(vec![vec![1, 0, 2, 0]]) }),
    );
    let base = serve(router).await;
    let items = collect(tts(&base).synthesize(say("x"))).await;
    assert_eq!(items[0].as_ref().unwrap().samples, vec![1, 2]);
    assert!(matches!(
        items.last(),
        Some(Err(ProviderError::Timeout {
            phase: TimeoutPhase::Idle,
            ..
        }))
    ));
    let base = serve_raw(
        "HTTP/1.1 200 OK\r\ncontent-type: audio/pcm\r\ntransfer-encoding: chunked\r\n\r\n",
        chunk(&[9, 0]),
    )
    .await;
    let items = collect(tts(&base).synthesize(say("x"))).await;
    assert_eq!(items[0].as_ref().unwrap().samples, vec![9]);
    assert!(matches!(
        items.last(),
        Some(Err(ProviderError::StreamCut(_)))
    ));
}
