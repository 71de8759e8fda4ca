//! `OpenAiTranscription` and `OpenAiSpeech` against fake servers (multipart upload, streamed
//! PCM and WAV), failures included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::Multipart;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use common::*;
use serde_json::{Value, json};
use voxgate_providers::{
    Asr, OpenAiSpeech, OpenAiSpeechConfig, OpenAiTranscription, OpenAiTranscriptionConfig,
    ProviderError, SpeechFormat, TimeoutPhase, Tts, TtsRequest, Utterance,
};

#[derive(Debug, Default, Clone)]
struct Upload {
    auth: Option<String>,
    fields: HashMap<String, String>,
    file_name: Option<String>,
    file_type: Option<String>,
    file: Vec<u8>,
}

async fn transcription_server(
    status: StatusCode,
    reply: &'static str,
) -> (String, Arc<Mutex<Vec<Upload>>>) {
    let seen: Arc<Mutex<Vec<Upload>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    let router = axum::Router::new().route(
        "/v1/audio/transcriptions",
        post(move |headers: HeaderMap, mut form: Multipart| {
            let seen = Arc::clone(&s2);
            async move {
                let mut up = Upload {
                    auth: headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned()),
                    ..Upload::default()
                };
                while let Some(field) = form.next_field().await.unwrap() {
                    let name = field.name().unwrap().to_owned();
                    if name == "file" {
                        up.file_name = field.file_name().map(str::to_owned);
                        up.file_type = field.content_type().map(str::to_owned);
                        up.file = field.bytes().await.unwrap().to_vec();
                    } else {
                        up.fields.insert(name, field.text().await.unwrap());
                    }
                }
                seen.lock().unwrap().push(up);
                (status, [("content-type", "application/json")], reply)
            }
        }),
    );
    (serve(router).await, seen)
}

fn asr(base: &str) -> OpenAiTranscription {
    let mut cfg = OpenAiTranscriptionConfig::new(format!("{base}/v1"), "whisper-1");
    cfg.api_key = Some("sk-asr".into());
    cfg.http = fast_http();
    OpenAiTranscription::new(cfg).unwrap()
}

fn utterance() -> Utterance {
    Utterance {
        pcm: (0..8_000)
            .map(|i| i16::try_from((i % 200) * 100 - 10_000).unwrap())
            .collect(),
        language: Some("de".into()),
    }
}

#[tokio::test]
async fn transcription_uploads_a_wav_and_the_form_fields() {
    let (base, seen) = transcription_server(StatusCode::OK, r#"{"text":" Guten Tag. "}"#).await;
    let u = utterance();
    let t = asr(&base).transcribe(u.clone()).await.unwrap();
    assert_eq!(t.text, "Guten Tag.");
    assert_eq!(
        t.language.as_deref(),
        Some("de"),
        "the hint when the server names none"
    );
    let up = seen.lock().unwrap()[0].clone();
    assert_eq!(up.auth.as_deref(), Some("Bearer sk-asr"));
    assert_eq!(up.fields["model"], "whisper-1");
    assert_eq!(up.fields["language"], "de");
    assert_eq!(up.fields["response_format"], "json");
    assert_eq!(up.file_name.as_deref(), Some("utterance.wav"));
    assert_eq!(up.file_type.as_deref(), Some("audio/wav"));
    let wav = voxgate_audio::wav::read_wav(&up.file).unwrap();
    assert_eq!((wav.sample_rate, wav.channels), (16_000, 1));
    assert_eq!(wav.to_mono_i16(), u.pcm);
}

#[tokio::test]
async fn transcription_reports_the_detected_language() {
    let (base, seen) =
        transcription_server(StatusCode::OK, r#"{"text":"hello","language":"en"}"#).await;
    let u = Utterance {
        language: None,
        ..utterance()
    };
    let t = asr(&base).transcribe(u).await.unwrap();
    assert_eq!(t.language.as_deref(), Some("en"));
    assert!(!seen.lock().unwrap()[0].fields.contains_key("language"));
}

#[tokio::test]
async fn transcription_failures_are_typed() {
    let (base, _) = transcription_server(
        StatusCode::INTERNAL_SERVER_ERROR,
        r#"{"error":{"message":"decoder crashed"}}"#,
    )
    .await;
    assert_eq!(
        asr(&base).transcribe(utterance()).await.unwrap_err(),
        ProviderError::Http {
            status: 500,
            message: "decoder crashed".into()
        }
    );
    let (base, _) = transcription_server(StatusCode::UNAUTHORIZED, r#"{"error":"no key"}"#).await;
    assert!(matches!(
        asr(&base).transcribe(utterance()).await.unwrap_err(),
        ProviderError::Auth { status: 401, .. }
    ));
    let (base, _) = transcription_server(StatusCode::OK, r#"{"txt": 1"#).await;
    assert!(matches!(
        asr(&base).transcribe(utterance()).await.unwrap_err(),
        ProviderError::Protocol(_)
    ));
}

#[tokio::test]
async fn transcription_times_out_when_the_server_never_answers() {
    let router = axum::Router::new().route(
        "/v1/audio/transcriptions",
        post(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            "late"
        }),
    );
    let base = serve(router).await;
    let err = tokio::time::timeout(Duration::from_secs(5), asr(&base).transcribe(utterance()))
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(
        err,
        ProviderError::Timeout {
            phase: TimeoutPhase::FirstByte,
            ..
        }
    ));
}

fn pcm_bytes(samples: &[i16]) -> Vec<u8> {
    samples.iter().flat_map(|s| s.to_le_bytes()).collect()
}

fn speech_samples() -> Vec<i16> {
    (0..4_801)
        .map(|i| i16::try_from((i * 37) % 20_000 - 10_000).unwrap())
        .collect()
}

async fn speech_server(pieces: Vec<Vec<u8>>) -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    let router = axum::Router::new().route(
        "/v1/audio/speech",
        post(move |Json(body): Json<Value>| {
            let seen = Arc::clone(&s2);
            let pieces = pieces.clone();
            async move {
                seen.lock().unwrap().push(body);
                chunked_body(pieces)
            }
        }),
    );
    (serve(router).await, seen)
}

fn speech(base: &str, format: SpeechFormat) -> OpenAiSpeech {
    let mut cfg = OpenAiSpeechConfig::new(format!("{base}/v1"), "tts-1", "alloy");
    cfg.format = format;
    cfg.speed = Some(1.25);
    cfg.http = fast_http();
    OpenAiSpeech::new(cfg).unwrap()
}

fn say(text: &str) -> TtsRequest {
    TtsRequest {
        text: text.into(),
        ..TtsRequest::default()
    }
}

#[tokio::test]
async fn speech_streams_pcm_split_at_odd_byte_boundaries() {
    let samples = speech_samples();
    let bytes = pcm_bytes(&samples);
    let pieces = bytes.chunks(1_001).map(<[u8]>::to_vec).collect();
    let (base, seen) = speech_server(pieces).await;
    let tts = speech(
        &base,
        SpeechFormat::Pcm {
            sample_rate: 24_000,
        },
    );
    let chunks = collect(tts.synthesize(TtsRequest {
        voice: Some("nova".into()),
        ..say("Hello there.")
    }))
    .await;
    assert!(chunks.len() > 1, "streamed, not buffered");
    let mut got = Vec::new();
    for c in chunks {
        let c = c.unwrap();
        assert_eq!(c.sample_rate, 24_000);
        got.extend(c.samples);
    }
    assert_eq!(got, samples);
    let body = seen.lock().unwrap()[0].clone();
    assert_eq!(
        body,
        json!({"model": "tts-1", "input": "Hello there.", "voice": "nova", "response_format": "pcm", "speed": 1.25})
    );
}

#[tokio::test]
async fn speech_streams_wav_with_a_placeholder_length() {
    let samples = speech_samples();
    let mut wav = voxgate_audio::wav::wav_bytes_i16(22_050, 1, &samples).unwrap();
    wav[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    let pieces = wav.chunks(333).map(<[u8]>::to_vec).collect();
    let (base, seen) = speech_server(pieces).await;
    let chunks = collect(speech(&base, SpeechFormat::Wav).synthesize(say("Hi."))).await;
    let mut got = Vec::new();
    for c in chunks {
        let c = c.unwrap();
        assert_eq!(c.sample_rate, 22_050);
        got.extend(c.samples);
    }
    assert_eq!(got, samples);
    assert_eq!(seen.lock().unwrap()[0]["response_format"], "wav");
    assert_eq!(seen.lock().unwrap()[0]["voice"], "alloy");
}

#[tokio::test]
async fn speech_cut_mid_stream_ends_with_a_stream_cut() {
    let body = chunk(&pcm_bytes(&[1, 2, 3, 4]));
    let base = serve_raw(
        "HTTP/1.1 200 OK\r\ncontent-type: audio/pcm\r\ntransfer-encoding: chunked\r\n\r\n",
        body,
    )
    .await;
    let items = collect(
        speech(
            &base,
            SpeechFormat::Pcm {
                sample_rate: 24_000,
            },
        )
        .synthesize(say("x")),
    )
    .await;
    assert_eq!(items[0].as_ref().unwrap().samples, vec![1, 2, 3, 4]);
    assert!(matches!(
        items.last(),
        Some(Err(ProviderError::StreamCut(_)))
    ));
}

#[tokio::test]
async fn speech_that_stalls_times_out_idle() {
    let router = axum::Router::new().route(
        "/v1/audio/speech",
        post(|| async { stalled_body(vec![pcm_bytes(&[5, 6])]) }),
    );
    let base = serve(router).await;
    let items = collect(
        speech(
            &base,
            SpeechFormat::Pcm {
                sample_rate: 24_000,
            },
        )
        .synthesize(say("x")),
    )
    .await;
    assert_eq!(items[0].as_ref().unwrap().samples, vec![5, 6]);
    assert!(matches!(
        items.last(),
        Some(Err(ProviderError::Timeout {
            phase: TimeoutPhase::Idle,
            ..
        }))
    ));
}

#[tokio::test]
async fn speech_errors_and_empty_text() {
    let router = axum::Router::new().route(
        "/v1/audio/speech",
        post(|| async {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": {"message": "tts backend down"}})),
            )
        }),
    );
    let base = serve(router).await;
    let items = collect(speech(&base, SpeechFormat::Wav).synthesize(say("x"))).await;
    assert_eq!(
        items,
        vec![Err(ProviderError::Http {
            status: 500,
            message: "tts backend down".into()
        })]
    );
    // Nothing to say: no request at all (the dead URL would fail).
    let tts = speech(&dead_url().await, SpeechFormat::Wav);
    assert!(collect(tts.synthesize(say("  "))).await.is_empty());
    // Not a WAV: a protocol error.
    let (base, _) = speech_server(vec![b"<html>oops</html>".to_vec()]).await;
    let items = collect(speech(&base, SpeechFormat::Wav).synthesize(say("x"))).await;
    assert!(matches!(
        items.last(),
        Some(Err(ProviderError::Protocol(_)))
    ));
}
