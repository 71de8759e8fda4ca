//! Base64 PCM decode of one 100 ms Gemini audio frame (goal: under 2 µs).
//!
//! Run: `cargo bench -p voxgate-gemini --bench audio`.

use std::hint::black_box;

use divan::{AllocProfiler, Bencher};
use voxgate_gemini::audio::{
    decode_audio_into, decode_pcm_scalar, encode_pcm_base64, max_pcm_samples,
};

#[global_allocator]
static ALLOC: AllocProfiler = AllocProfiler::system();

fn main() {
    divan::main();
}

/// 100 ms of a 440 Hz tone at `rate`, as base64 s16le: what a `CONTENT_MESSAGE` or
/// `SEND_REALTIME_INPUT` frame carries.
fn frame(rate: u32) -> String {
    let n = rate / 10;
    // The amplitude keeps every value well inside i16.
    #[allow(clippy::cast_possible_truncation)]
    let samples: Vec<i16> = (0..n)
        .map(|i| {
            let t = f64::from(i) / f64::from(rate);
            (f64::sin(t * 440.0 * std::f64::consts::TAU) * 12_000.0) as i16
        })
        .collect();
    let mut b64 = String::new();
    encode_pcm_base64(&samples, &mut b64);
    b64
}

/// Decode only: base64 text to PCM in a reused buffer.
#[divan::bench(args = [16_000, 24_000])]
fn decode_100ms(bencher: Bencher<'_, '_>, rate: u32) {
    let b64 = frame(rate);
    let mime = format!("audio/pcm;rate={rate}");
    let mut pcm = vec![0i16; max_pcm_samples(b64.len())];
    bencher
        .counter(divan::counter::BytesCount::new(b64.len()))
        .bench_local(|| decode_audio_into(black_box(&b64), black_box(&mime), &mut pcm));
}

/// The portable scalar decoder on the same frame (what runs without the `simd` feature, and for
/// non-canonical base64 such as line-wrapped text).
#[divan::bench(args = [16_000, 24_000])]
fn decode_100ms_scalar(bencher: Bencher<'_, '_>, rate: u32) {
    let b64 = frame(rate);
    let mut pcm = vec![0i16; max_pcm_samples(b64.len())];
    bencher
        .counter(divan::counter::BytesCount::new(b64.len()))
        .bench_local(|| decode_pcm_scalar(black_box(&b64), &mut pcm));
}

/// The whole path for a client frame: bridge JSON parse, then decode into PCM.
#[divan::bench(args = [16_000, 24_000])]
fn bridge_frame_to_pcm(bencher: Bencher<'_, '_>, rate: u32) {
    use voxgate_gemini::bridge::ClientMessage;
    let json = format!(
        r#"{{"type":"SEND_REALTIME_INPUT","payload":{{"audio":{{"mimeType":"audio/pcm;rate={rate}","data":"{}"}}}}}}"#,
        frame(rate)
    );
    let mut pcm = vec![0i16; json.len()];
    bencher
        .counter(divan::counter::BytesCount::new(json.len()))
        .bench_local(|| {
            let Ok(ClientMessage::SendRealtimeInput(input)) =
                ClientMessage::decode(black_box(&json))
            else {
                unreachable!("bench input is a realtime input frame")
            };
            input.audio.map(|blob| blob.decode_pcm_into(&mut pcm))
        });
}
